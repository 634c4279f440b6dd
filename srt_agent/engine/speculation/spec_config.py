"""Options of speculative decoding in the engine (the ``spec`` section of a run config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SpecConfig(BaseModel):
    """How :class:`~srt_agent.engine.torch_engine.TorchEngine` speculates with a draft source.

    With ``adaptive`` (the default) the cost model in :mod:`srt_agent.engine.speculation.budget`
    decides, every decode step, how many draft tokens to verify (possibly none); the limits below
    only cap it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True,
        description="Verify drafts. When off, a given draft source still receives every committed token "
        "(the cache keeps filling) but is never asked for drafts.",
    )
    max_draft_tokens: int = Field(
        default=8, ge=1, le=64, description="Most draft tokens (tree nodes) verified per sequence per step."
    )
    max_batch_tokens: int = Field(
        default=1024,
        ge=1,
        description="Most tokens in one verify forward, padding included: batch * (1 + drafted per row). "
        "With static steps (CUDA graphs) every verify step is padded to 1 + max_draft_tokens per row, so "
        "this is also the batch-size threshold of speculation: above max_batch_tokens // (1 + "
        "max_draft_tokens) running rows the engine decodes plainly.",
    )
    adaptive: bool = Field(
        default=True,
        description="Let the cost model choose the draft size from the batch size, measured acceptance and "
        "measured forward cost. False always drafts max_draft_tokens (for tests and verifier benchmarks).",
    )
    draws: Literal["auto", "walk", "all"] = Field(
        default="auto",
        description="How a verify step draws its tokens. 'walk': depth by depth, only at the tree positions "
        "the acceptance walk reaches (LM head and sampling once per emitted token; cheapest where "
        "arithmetic costs, a CPU). 'all': at every tree position in one pass, then the walk on the host "
        "(one LM head, one sampling pass and one device sync per step; cheapest where launches and "
        "syncs cost, a GPU). Both draw the same tokens from the same uniforms. 'auto': 'walk' on CPU, "
        "'all' elsewhere.",
    )
    probe_interval: int = Field(
        default=16,
        ge=1,
        description="After this many decode steps without drafts, verify a small probe draft to re-measure "
        "acceptance (drafts that start to pay are noticed).",
    )
    probe_overhead: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="Fraction of decode time the probes may cost when drafts never pay; sizes each probe.",
    )
    runahead_slowdown: float = Field(
        default=0.05,
        ge=0.0,
        le=10.0,
        description="Most a decode step may slow down for the run-ahead rows in it, by the cost model's "
        "plain-step fit (run-ahead uses idle capacity only). On a GPU extra rows are nearly free up to "
        "tens of rows; on a CPU each row costs about as much as the last, so few or none run. Run-ahead "
        "also stops where its drafts do not pay for its forwards (see engine/speculation/runahead_gate.py). "
        "10: no limit (run-ahead takes every row live requests leave free).",
    )

    @property
    def tree_slots(self) -> int:
        """Positions of one row's verify tree: its root (the last committed token) and the drafts.

        The width of a padded verify step, and SGLang's ``--speculative-num-draft-tokens``.
        """
        return 1 + self.max_draft_tokens
