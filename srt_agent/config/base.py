"""The base of every run-config section: strict, frozen, documented."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A run-config section: unknown keys are errors (with a suggestion), values are immutable.

    Every field carries a ``description`` (shown by ``--help``-style listings and in the docs), so
    the reason for a default lives next to it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
