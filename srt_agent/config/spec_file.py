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
from srt_agent.engine.speculation.spec_config import SpecConfig
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
    if server and "run_ahead" in raw and spec.run_ahead.enabled:  # a bare spec section's own key
        raise ConfigError(
            [
                f"spec.run_ahead = {shown(raw['run_ahead'])}: a server has no run-ahead queue (the trainer "
                "or eval that sends it requests runs ahead, configured by its run config's spec.run_ahead); "
                "remove spec.run_ahead from this file, or give the server the run config"
            ],
            source,
        )
    return spec


SGLANG_FIXED = (
    "adaptive",
    "max_batch_tokens",
    "draws",
    "probe_interval",
    "probe_overhead",
    "runahead_slowdown",
)
"""Options SGLang's n-gram path has no counterpart for: it verifies a fixed-size draft every step."""


SGLANG_DRAFT_SLOTS = 12
"""SGLang's own default ``--speculative-num-draft-tokens`` for n-gram drafting, kept without a spec file."""


def sglang_draft_slots(spec: SpecConfig | None) -> int:
    """SGLang's draft slots per request: ``spec``'s tree slots, or SGLang's default without a spec file."""
    return SGLANG_DRAFT_SLOTS if spec is None else spec.tree_slots


def sglang_refusals(spec: SpecSection, draft_slots: int | None = None) -> list[str]:
    """Why SGLang cannot run with ``spec`` (empty when it can), one reason per option.

    SGLang's worker verifies ``max_draft_tokens`` drafted slots every step, with no cost model:
    options of the cost model and the verify draws can only keep their defaults there.

    Args:
        spec: The options (a file's ``spec`` section).
        draft_slots: SGLang's ``--speculative-num-draft-tokens`` when both it and a file are
            given: it must be ``spec.max_draft_tokens + 1`` (the root and the drafts).
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
    if draft_slots is not None and draft_slots != spec.tree_slots:
        reasons.append(
            f"--speculative-num-draft-tokens {draft_slots} contradicts spec.max_draft_tokens = "
            f"{spec.max_draft_tokens} (the slots are the root and the drafts: {spec.tree_slots}); "
            f"drop the flag, or set spec.max_draft_tokens = {draft_slots - 1}"
        )
    return reasons
