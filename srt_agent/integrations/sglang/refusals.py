"""What SGLang's SRT worker can honour of srt-agent's speculation options, and its draft slots.

SGLang's n-gram path verifies a fixed-size draft every step, with no cost model: the options of the
cost model and of the verify draws can only keep their defaults there. ``srt-agent sglang-serve``
checks a spec file before it starts SGLang (a mistake costs no server start), and the plugin checks
again inside SGLang (where SGLang was launched directly, with ``SRT_SPEC_CONFIG``).
"""

from __future__ import annotations

from srt_agent.config.sections import SpecSection
from srt_agent.engine.speculation.spec_config import SpecConfig

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
