"""The ``spec`` section read on its own: how every command that builds an engine gets its options.

``train`` reads the whole run config; ``eval``, ``serve``, ``bench rollout`` and ``sglang-serve``
take an options file with ``--config``, and SGLang's SRT worker the file ``SRT_SPEC_CONFIG``
names: a run config (its ``spec`` section is used), a ``spec`` section on its own, or a
``spec.cache`` section on its own, as YAML or JSON. One file thus configures speculation (the
tree cache, the draft budget and the cost model; run-ahead where the command has a run-ahead
queue) wherever the run's engines are built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from srt_agent.config.loader import (
    ConfigError,
    apply_overrides,
    describe_source,
    read_yaml,
    validate_run_config,
)
from srt_agent.config.run import RunConfig
from srt_agent.config.sections import SpecSection
from srt_agent.errors import shown
from srt_agent.tree_cache import TreeCacheConfig


def as_run_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """An options file's mapping as a run config's.

    A run config stays as it is; a bare ``spec`` or ``spec.cache`` section goes under its key
    (the three are told apart by their keys, which no two share).
    """
    keys = set(data)
    if not keys or keys & set(RunConfig.model_fields):
        return dict(data)
    if keys & set(TreeCacheConfig.model_fields) and not keys & set(SpecSection.model_fields):
        return {"spec": {"cache": dict(data)}}
    return {"spec": dict(data)}


def load_spec(path: str | Path | None, overrides: Sequence[str] = (), *, server: bool = False) -> SpecSection:
    """The ``spec`` section of an options file (the defaults without one).

    Args:
        path: A run config (only its ``spec`` section is used, the rest is validated), a bare
            ``spec`` section, or a bare ``spec.cache`` section; YAML or JSON.
        overrides: ``spec.*=value`` overrides, as ``train`` takes them.
        server: The options are a server's (``serve``, SGLang's SRT worker). A server has no
            run-ahead queue (its clients run ahead and send it run-ahead requests), so a bare
            ``spec`` section that turns run-ahead on is refused; a run config's ``spec.run_ahead``
            belongs to the run's trainer or eval, which read the same file.

    Raises:
        ConfigError: The file is missing or invalid, or asks a server to run ahead (every
            problem listed).
    """
    if path is None and not overrides:
        return SpecSection()
    raw = read_yaml(path) if path is not None else {}
    source = describe_source([] if path is None else [path], overrides)
    spec = validate_run_config(apply_overrides(as_run_config(raw), overrides), source).spec
    if server and "run_ahead" in raw and spec.run_ahead.enabled is True:  # a bare spec section's own key
        raise ConfigError(
            [
                f"spec.run_ahead = {shown(raw['run_ahead'])}: a server has no run-ahead queue (the trainer "
                "or eval that sends it requests runs ahead, configured by its run config's spec.run_ahead); "
                "remove spec.run_ahead from this file, or give the server the run config"
            ],
            source,
        )
    return spec
