"""Wire types of the generation engines and the protocol every engine implements.

Requests and outputs are frozen dataclasses: they cross threads (the engine's batching loop), and
later processes and the network (SGLang), so they are plain data, never live objects.
"""

from __future__ import annotations

import hashlib
import math
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from srt_agent.contracts.draft import StreamKind
from srt_agent.contracts.speculation import SpecStats
from srt_agent.errors import SrtAgentError

if TYPE_CHECKING:
    import torch

    from srt_agent.tooling.grammar import ToolCallGrammar

FinishReason = Literal["stop", "length", "abort", "preempted"]
"""Why generation ended: a stop token or stop string (``stop``), ``max_new_tokens`` or the context
limit (``length``), the request was cancelled or failed (``abort``, see ``GenerationOutput.error``), or
a run-ahead request gave its row to a live one (``preempted``; its tokens so far are in the output and
were reported to the draft source)."""

"""Live requests feed trajectories; run-ahead requests only fill the draft source (the tree cache), are
admitted after live ones and preempted when live ones need their rows. The values are those of
:data:`srt_agent.contracts.draft.StreamKind`, the kind the engine reports to the draft source."""


class PromptTooLongError(SrtAgentError, ValueError):
    """The prompt leaves no room to generate within the model's context."""


def check_room(request: GenerationRequest, max_context: int) -> None:
    """Raise :class:`PromptTooLongError` when ``request``'s prompt leaves no room to generate."""
    if len(request.prompt_ids) >= max_context:
        raise PromptTooLongError(
            f"request {request.request_id!r}: prompt of {len(request.prompt_ids)} tokens leaves no room "
            f"to generate within max_context={max_context}; shorten the prompt (or end the "
            "episode as truncated)"
        )


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    Attributes:
        temperature: Softmax temperature; ``0`` means greedy (argmax).
        top_p: Nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p``.
        top_k: Keep only the ``top_k`` most likely tokens; ``0`` disables.
        max_new_tokens: Most tokens to generate (also capped by the context limit).
        stop_token_ids: Generation stops after emitting any of these (the token is kept in the output).
        stop_strings: Generation stops once the decoded output contains one of these (the tokens up to
            and including the one that completed it are kept).
        seed: Per-request seed: the same request with the same seed gives the same tokens, whatever
            else is in the batch. ``None`` draws from the engine's generator.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        # NaN passes every comparison but the one that asks for it: test finiteness first (a NaN
        # temperature turns every logit into NaN and samples token 0 forever).
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63) (torch's generator seed), got {self.seed}")


def state_key(prefix_ids: Sequence[int]) -> str:
    """Hash of an exact token prefix: the conversation state a generation starts from.

    Two requests with the same key start from the same tokens, so earlier continuations from that
    state are valid drafts for the next one (the tree cache is keyed by this).
    """
    # One bulk conversion, not a bytes object per token (that loop cost ~0.4 µs per token, per
    # request, on the driver's hot path); the bytes are the same 4-byte little-endian words.
    words = array("I", prefix_ids)
    if sys.byteorder == "big":
        words.byteswap()
    return hashlib.blake2b(words.tobytes(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class GenerationRequest:
    """One generation from a token prefix.

    Attributes:
        request_id: Caller-chosen id, unique among in-flight requests.
        prompt_ids: The exact token prefix to continue.
        params: Sampling parameters.
        state_key: :func:`state_key` of ``prompt_ids`` (computed if not given).
        task_id: The env task this belongs to (lets the tree cache fall back to same-task drafts).
        priority: ``live`` (the default) or ``runahead`` (see :data:`~srt_agent.contracts.draft.StreamKind`).
        draft_group: Requests of one group share the speculation cost model's acceptance
            calibration (the rollout scheduler uses the env id): drafts of an env whose drafts are
            rarely right do not make another env's look bad. ``""``: the shared group.
        tool_grammar: Constrain every ``<tool_call>`` block the request writes to a valid call of
            these tools (see :mod:`srt_agent.engine.constraint`); the reported logprobs are those
            of the constrained distribution. ``None``: unconstrained. Engines that cannot
            constrain refuse such requests.
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    state_key: str = ""
    task_id: str = ""
    priority: StreamKind = "live"
    draft_group: str = ""
    tool_grammar: ToolCallGrammar | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id!r}: prompt_ids is empty")
        if self.priority not in ("live", "runahead"):
            raise ValueError(f"request {self.request_id!r}: priority must be 'live' or 'runahead'")
        if not self.state_key:
            object.__setattr__(self, "state_key", state_key(self.prompt_ids))


@dataclass(frozen=True)
class GenerationOutput:
    """The result of one request.

    Attributes:
        request_id: The request's id.
        token_ids: Generated tokens, verbatim (a stop token that ended generation is included).
        logprobs: ``log p(token)`` of each generated token under the distribution it was sampled
            from (after temperature, top-k and top-p); same length as ``token_ids``.
        finish_reason: See :data:`FinishReason`.
        stop: The stop token id or stop string that ended generation, if any.
        forward_passes: Model forward passes that produced this request's tokens (the prefill that
            samples the first token included); ``len(token_ids) / forward_passes`` is the
            tokens-per-forward figure of speculation (1.0 for plain decoding).
        error: For ``abort``: why.
    """

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    stop: int | str | None = None
    forward_passes: int = 0
    error: str | None = None


@runtime_checkable
class Engine(Protocol):
    """What the rollout scheduler and the learner need from an engine."""

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + generation) the engine can hold."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Run requests to completion (batched) and return outputs in request order."""
        ...

    async def agenerate(self, request: GenerationRequest) -> GenerationOutput:
        """Submit one request to the running batch (continuous batching) and await its output."""
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights (names as in the HF checkpoint) between rollout batches."""
        ...

    def spec_stats(self, reset: bool = False) -> SpecStats:
        """Speculation counters since start or the last reset; ``reset`` starts them over after the read.

        An engine that does not speculate returns its true counts: all zero.
        """
        ...

    def close(self) -> None:
        """Stop background work and free memory."""
        ...
