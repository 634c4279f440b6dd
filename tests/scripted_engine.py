"""A scripted engine for testing rollouts, envs and evaluation without a model.

:class:`ScriptedEngine` implements the :class:`~srt_agent.contracts.generation.Engine` protocol. A
``respond`` function decides each turn's output from the request (prompt tokens, task id, request
id); text is encoded with the chat format's tokenizer and ends with its end-of-turn token, exactly
as a model's output would. Logprobs are a deterministic function of the token's position in the
sequence, so tests can check they land at the right places. Delays make overlap measurable.

Example:
    >>> engine = ScriptedEngine(fmt, lambda req: "<answer>42</answer>")  # doctest: +SKIP
    >>> trajectories = run_rollouts(engine, fmt, [EpisodeRequest("srt/Calculator-v0")])  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from srt_agent.chat.template import ChatFormat
from srt_agent.contracts.generation import (
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    PromptTooLongError,
)
from srt_agent.contracts.speculation import SpecStats

if TYPE_CHECKING:
    import torch

Response = str | Sequence[int] | GenerationOutput
"""What ``respond`` returns: text (encoded, end-of-turn token appended), exact token ids, or a
complete output (e.g. ``finish_reason="abort"`` to simulate an engine failure)."""


def position_logprob(position: int) -> float:
    """The fake logprob :class:`ScriptedEngine` gives a token at absolute ``position`` in its sequence."""
    return -1.0 / (position + 2)


@dataclass(frozen=True)
class Call:
    """One request the engine served, with when it ran (``time.perf_counter`` seconds)."""

    request: GenerationRequest
    start: float
    end: float


class ScriptedEngine:
    """An engine whose outputs are decided by a function of the request.

    Args:
        fmt: Encodes text responses and supplies the end-of-turn token.
        respond: Maps a request to its response (see :data:`Response`).
        max_context: Longest prompt + generation accepted; longer prompts raise
            :class:`~srt_agent.contracts.generation.PromptTooLongError`, and outputs are cut to fit.
        delay_s: Seconds each request takes (``await asyncio.sleep``), or a function of the request.
    """

    def __init__(
        self,
        fmt: ChatFormat,
        respond: Callable[[GenerationRequest], Response],
        *,
        max_context: int = 8192,
        delay_s: float | Callable[[GenerationRequest], float] = 0.0,
    ):
        self.fmt = fmt
        self.respond = respond
        self._max_context = max_context
        self.delay_s = delay_s
        self.calls: list[Call] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.closed = False
        self.weight_updates = 0

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + generation) accepted."""
        return self._max_context

    def _complete(self, req: GenerationRequest) -> GenerationOutput:
        if len(req.prompt_ids) >= self._max_context:
            raise PromptTooLongError(
                f"prompt of {len(req.prompt_ids)} tokens leaves no room in {self._max_context}"
            )
        answer = self.respond(req)
        if isinstance(answer, GenerationOutput):
            return answer
        if isinstance(answer, str):
            ids = [*self.fmt.encode(answer), self.fmt.stop_token_ids[0]]
        else:
            ids = [int(t) for t in answer]
        room = min(req.params.max_new_tokens, self._max_context - len(req.prompt_ids))
        finish: FinishReason = "length" if len(ids) > room else "stop"
        ids = ids[:room]
        n = len(req.prompt_ids)
        return GenerationOutput(
            request_id=req.request_id,
            token_ids=tuple(ids),
            logprobs=tuple(position_logprob(n + i) for i in range(len(ids))),
            finish_reason=finish,
            stop=ids[-1] if finish == "stop" and ids and ids[-1] in self.fmt.stop_token_ids else None,
            forward_passes=len(ids),
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Serve requests one by one, without delays."""
        now = time.perf_counter()
        self.calls.extend(Call(r, now, now) for r in requests)
        return [self._complete(r) for r in requests]

    async def agenerate(self, request: GenerationRequest) -> GenerationOutput:
        """Serve one request after its delay; concurrent calls overlap (``max_in_flight`` counts them)."""
        start = time.perf_counter()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            delay = self.delay_s(request) if callable(self.delay_s) else self.delay_s
            if delay > 0:
                await asyncio.sleep(delay)
            return self._complete(request)
        finally:
            self.in_flight -= 1
            self.calls.append(Call(request, start, time.perf_counter()))

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Count the update (a scripted engine has no weights)."""
        self.weight_updates += 1

    def spec_stats(self, reset: bool = False) -> SpecStats:
        """All zero: this engine does not speculate."""
        return SpecStats()

    def close(self) -> None:
        """Mark the engine closed."""
        self.closed = True
