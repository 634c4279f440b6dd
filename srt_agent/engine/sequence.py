"""A request in flight on the engine's worker: its tokens, uniforms and stop conditions."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from srt_agent.contracts.generation import FinishReason, GenerationOutput, GenerationRequest
from srt_agent.engine.detokenizer import Detokenizer, load_tokenizer
from srt_agent.engine.prefix_cache import PrefixHit

if TYPE_CHECKING:
    from srt_agent.engine.constraint import CallTracker

__all__ = ["Detokenizer", "SequenceState", "load_tokenizer"]

log = logging.getLogger(__name__)

_UNIFORM_BLOCK = 64  # uniforms drawn per refill of a request's stream (amortises torch.rand calls)


@dataclass
class SequenceState:
    """A request in flight: its prompt, generated tokens and stop conditions."""

    request: GenerationRequest
    on_done: Callable[[GenerationOutput], None]
    cancelled: Callable[[], bool]
    seed: int
    max_total: int  # prompt + generated tokens may not exceed this (context limit)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    decode_passes: int = 0
    generator: torch.Generator | None = None
    uniforms: deque[float] = field(default_factory=deque)  # drawn, not yet used, in drawing order
    stop_window: int = 0  # tokens to decode when looking for stop strings
    admitted: int = -1  # admission order (the newest run-ahead rows are preempted first)
    reported: bool = False  # the draft source has heard of this stream
    reuse: PrefixHit | None = None  # a parked prefix to copy in at prefill (set at admission)
    tracker: CallTracker | None = None  # where a constrained request is in its tool-call grammar
    share_prompt: bool = False  # park the prompt right after prefill: others admitted with it reuse it

    @property
    def cached(self) -> int:
        """Positions of this sequence held in the KV cache (the newest token is not yet)."""
        return len(self.request.prompt_ids) + max(len(self.tokens) - 1, 0)

    def tokens_left(self) -> int:
        """Tokens this sequence may still emit (``max_new_tokens`` and the context limit)."""
        n = len(self.tokens)
        return min(self.request.params.max_new_tokens - n, self.max_total - len(self.request.prompt_ids) - n)

    def _fill(self, n: int) -> None:
        while len(self.uniforms) < n:
            if self.generator is None:
                self.generator = torch.Generator(device="cpu")
                self.generator.manual_seed(self.seed)
            self.uniforms.extend(torch.rand(_UNIFORM_BLOCK, generator=self.generator).tolist())

    def next_uniform(self) -> float:
        """Next uniform of this request's private stream (see :mod:`srt_agent.engine.sampling`)."""
        self._fill(1)
        return self.uniforms.popleft()

    def peek_uniforms(self, n: int) -> list[float]:
        """The next ``n`` uniforms of the stream, without using them up."""
        self._fill(n)
        return list(itertools.islice(self.uniforms, n))

    def skip_uniforms(self, n: int) -> None:
        """Use up the next ``n`` uniforms (a verify step emitted ``n`` tokens with them)."""
        self._fill(n)
        for _ in range(n):
            self.uniforms.popleft()

    def output(self, reason: FinishReason, stop: int | str | None = None, error: str | None = None) -> None:
        """Deliver the result (never raises: a failing callback is logged)."""
        out = GenerationOutput(
            request_id=self.request.request_id,
            token_ids=tuple(self.tokens),
            logprobs=tuple(self.logprobs),
            finish_reason=reason,
            stop=stop,
            # The prefill forward samples the first token, so it counts: plain decoding reads as
            # exactly one token per forward, and speculation's gain shows as more than one.
            forward_passes=self.decode_passes + (1 if self.tokens else 0),
            error=error,
        )
        try:
            self.on_done(out)
        except Exception:
            log.exception("delivering the output of request %r failed", self.request.request_id)
