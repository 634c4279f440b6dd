"""The ``spec`` section read on its own: how every command that builds an engine gets its options.

``train`` reads the whole run config; ``eval``, ``serve``, ``bench rollout`` and ``sglang-serve``
take the same file with ``--config`` and use its ``spec`` section (the tree cache, the draft budget
and the cost model; run-ahead where the command has a run-ahead queue), so one file configures
speculation wherever the run's engines are built.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from srt_agent.config.loader import load_config
from srt_agent.config.sections import SpecSection
from srt_agent.engine.speculation.config import SpecConfig


def load_spec(path: str | Path | None, overrides: Sequence[str] = ()) -> SpecSection:
    """The ``spec`` section of a run config file (the defaults without one).

    Args:
        path: A run config (YAML; only its ``spec`` section is used, the rest is validated).
        overrides: ``spec.*=value`` overrides, as ``train`` takes them.

    Raises:
        ConfigError: The file is missing or invalid (every problem listed).
    """
    if path is None and not overrides:
        return SpecSection()
    return load_config(path, overrides).spec


SGLANG_FIXED = ("adaptive", "max_batch_tokens", "draws", "probe_interval", "probe_overhead")
"""Options SGLang's n-gram path has no counterpart for: it verifies a fixed-size draft every step."""


def sglang_refusals(spec: SpecSection) -> list[str]:
    """Why SGLang cannot run with ``spec`` (empty when it can), one reason per option.

    SGLang's worker verifies ``max_draft_tokens`` drafted slots every step, with no cost model:
    options of the cost model and the verify draws can only keep their defaults there.
    """
    defaults = SpecConfig()
    fixed = f"SGLang's SRT worker has no such option (it drafts {spec.max_draft_tokens} tokens every step)"
    reasons = [
        f"spec.{name} = {getattr(spec, name)!r}: {fixed}; leave it at {getattr(defaults, name)!r}"
        for name in SGLANG_FIXED
        if getattr(spec, name) != getattr(defaults, name)
    ]
    if not spec.enabled:
        reasons.append(
            "spec.enabled = False: run SGLang's own server without --speculative-algorithm instead"
        )
    return reasons
