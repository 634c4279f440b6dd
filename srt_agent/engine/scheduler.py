"""Continuous batching: admit waiting requests, prefill them, decode every running row one step.

The scheduler is single-threaded (the engine's worker thread owns it and the model). Running
sequences occupy cache rows ``0 .. n-1``; a finished sequence's row is refilled by moving the last
row into it, so every decode step is one forward over a contiguous row range. New requests are
admitted whenever rows are free, prefilled together (padded, under a token budget) and join the
next decode step: sequences join and leave the batch independently.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from srt_agent.engine.kv_cache import KVCache, causal_bias, decode_bias
from srt_agent.engine.llama import CausalLM
from srt_agent.engine.sampling import RowParams, sample
from srt_agent.engine.types import FinishReason, GenerationOutput, GenerationRequest

log = logging.getLogger(__name__)

_UNIFORM_BLOCK = 64  # uniforms drawn per refill of a request's stream (amortises torch.rand calls)


class Detokenizer(Protocol):
    """The one tokenizer method stop strings need (HF tokenizers have it)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str | list[str]:
        """Text of ``token_ids`` (HF annotates a list return for batched input, unused here)."""
        ...


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
    uniforms: list[float] = field(default_factory=list)
    stop_window: int = 0  # tokens to decode when looking for stop strings

    @property
    def cached(self) -> int:
        """Positions of this sequence held in the KV cache (the newest token is not yet)."""
        return len(self.request.prompt_ids) + max(len(self.tokens) - 1, 0)

    def next_uniform(self) -> float:
        """Next uniform of this request's private stream (see :mod:`srt_agent.engine.sampling`)."""
        if not self.uniforms:
            if self.generator is None:
                self.generator = torch.Generator(device="cpu")
                self.generator.manual_seed(self.seed)
            # Reversed so that pop() returns them in drawing order.
            self.uniforms = torch.rand(_UNIFORM_BLOCK, generator=self.generator).tolist()[::-1]
        return self.uniforms.pop()

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


class Scheduler:
    """Steps a continuously batched set of sequences through one model and KV cache.

    Args:
        model: The model.
        cache: The KV cache (rows are owned by this scheduler).
        max_batch: Most sequences decoding at once.
        tokenizer: Needed only for stop strings.
        prefill_tokens: Budget of padded tokens per prefill forward (several prompts share one).
    """

    def __init__(
        self,
        model: CausalLM,
        cache: KVCache,
        *,
        max_batch: int,
        tokenizer: Detokenizer | None = None,
        prefill_tokens: int = 4096,
    ) -> None:
        self.model = model
        self.cache = cache
        self.max_batch = max_batch
        self.tokenizer = tokenizer
        self.prefill_tokens = prefill_tokens
        self.rows: list[SequenceState] = []
        self.waiting: deque[SequenceState] = deque()
        self._row_params: RowParams | None = None  # rebuilt when the row set changes
        # Counters for tests and monitoring: forwards run and the largest decode batch seen.
        self.decode_steps = 0
        self.prefill_forwards = 0
        self.peak_batch = 0
        self.joined_running = 0  # sequences admitted while others were decoding

    def add(self, seq: SequenceState) -> None:
        """Queue a sequence for admission at the next step.

        Args:
            seq: A validated sequence (token ids in range; a tokenizer exists if it has stop strings).
        """
        longest = max((len(s) for s in seq.request.params.stop_strings), default=0)
        # A stop string of n characters spans at most ~4n byte-level tokens; a margin covers
        # tokens that decode to nothing on their own.
        seq.stop_window = 4 * longest + 8 if longest else 0
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Whether any sequence is running or waiting."""
        return bool(self.rows or self.waiting)

    def abort_all(self, error: str) -> None:
        """Finish every running and waiting sequence with ``abort``."""
        for seq in [*self.rows, *self.waiting]:
            seq.output("abort", error=error)
        self.rows.clear()
        self.waiting.clear()
        self._row_params = None

    @torch.inference_mode()
    def step(self) -> None:
        """Admit and prefill waiting sequences while rows are free, then decode all rows once."""
        self._drop_cancelled()
        admitted: list[SequenceState] = []
        while self.waiting and len(self.rows) + len(admitted) < self.max_batch:
            admitted.append(self.waiting.popleft())
        if self.rows:
            self.joined_running += len(admitted)
        for group in _prefill_groups(admitted, self.prefill_tokens):
            self._prefill(group)
        if self.rows:
            self._decode()

    def _drop_cancelled(self) -> None:
        """Abort sequences whose caller gave up (their output reaches nobody, but frees the id)."""
        dropped = [s for s in self.waiting if s.cancelled()]
        self.waiting = deque(s for s in self.waiting if not s.cancelled())
        gone = [i for i, s in enumerate(self.rows) if s.cancelled()]
        dropped += [self.rows[i] for i in gone]
        self._remove_rows(gone)
        for seq in dropped:
            seq.output("abort", error="cancelled")

    def _params(self) -> RowParams:
        if self._row_params is None:
            self._row_params = RowParams.build(
                [s.request.params for s in self.rows], self.model.config.vocab_size, self.model.device
            )
        return self._row_params

    def _uniforms(self, seqs: Sequence[SequenceState], rows: RowParams) -> torch.Tensor | None:
        if rows.all_greedy:
            return None
        values = [s.next_uniform() if s.request.params.temperature > 0 else 0.0 for s in seqs]
        return torch.tensor(values, dtype=torch.float32, device=self.model.device)

    def _prefill(self, group: list[SequenceState]) -> None:
        device = self.model.device
        row_start, k = len(self.rows), len(group)
        lengths = [len(s.request.prompt_ids) for s in group]
        t = max(lengths)
        try:
            self.cache.reserve(row_start + k, t)
            ids = torch.zeros((k, t), dtype=torch.long)
            for i, s in enumerate(group):
                ids[i, : lengths[i]] = torch.tensor(s.request.prompt_ids, dtype=torch.long)
            positions = torch.arange(t, device=device).expand(k, t)  # (k, T)
            bias = causal_bias([0] * k, t, t, self.model.dtype).to(device)  # (k, 1, T, T)
            last = torch.tensor(lengths, device=device) - 1
            logits = self.model.forward(
                ids.to(device), positions, self.cache, row_start, positions, bias, logit_index=last
            )  # (k, V)
            rows = RowParams.build([s.request.params for s in group], self.model.config.vocab_size, device)
            tokens, logprobs, _ = sample(logits, rows, self._uniforms(group, rows))
        except Exception as exc:  # isolate: only this prefill group fails
            log.exception("prefill failed")
            for s in group:
                s.output("abort", error=f"prefill failed: {type(exc).__name__}: {exc}")
            return
        self.rows.extend(group)
        self._row_params = None
        self.prefill_forwards += 1
        self._finish_step(row_start, tokens.tolist(), logprobs.tolist())

    def _decode(self) -> None:
        device = self.model.device
        b = len(self.rows)
        try:
            lengths = [s.cached + 1 for s in self.rows]  # the new token included
            length = max(lengths)
            self.cache.reserve(b, length)
            ids = torch.tensor([[s.tokens[-1]] for s in self.rows], dtype=torch.long, device=device)
            lengths_t = torch.tensor(lengths, dtype=torch.long, device=device)
            positions = (lengths_t - 1)[:, None]  # (B, 1)
            bias = decode_bias(lengths_t, length, self.model.dtype)  # (B, 1, 1, L)
            logits = self.model.forward(ids, positions, self.cache, 0, positions, bias)[:, 0]  # (B, V)
            rows = self._params()
            tokens, logprobs, _ = sample(logits, rows, self._uniforms(self.rows, rows))
        except Exception as exc:  # a failed batched forward cannot be pinned on one row
            log.exception("decode step failed")
            self.abort_all(f"decode step failed: {type(exc).__name__}: {exc}")
            return
        for s in self.rows:
            s.decode_passes += 1
        self.decode_steps += 1
        self.peak_batch = max(self.peak_batch, b)
        self._finish_step(0, tokens.tolist(), logprobs.tolist())

    def _finish_step(self, row_start: int, tokens: list[int], logprobs: list[float]) -> None:
        """Append each row's new token, free the rows of finished sequences, then deliver them."""
        done: list[int] = []
        results: list[tuple[SequenceState, FinishReason, int | str | None, str | None]] = []
        for i, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
            seq = self.rows[row_start + i]
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            try:
                finished = self._check_stop(seq)
            except Exception as exc:
                log.exception("stop check of request %r failed", seq.request.request_id)
                finished = ("abort", None)
                results.append((seq, "abort", None, f"stop check failed: {type(exc).__name__}: {exc}"))
            else:
                if finished is not None:
                    results.append((seq, finished[0], finished[1], None))
            if finished is not None:
                done.append(row_start + i)
        # Free rows first, so a caller woken by its output already sees the row released.
        self._remove_rows(done)
        for seq, reason, stop, error in results:
            seq.output(reason, stop=stop, error=error)

    def _check_stop(self, seq: SequenceState) -> tuple[FinishReason, int | str | None] | None:
        params = seq.request.params
        token = seq.tokens[-1]
        if token in params.stop_token_ids:
            return "stop", token
        if seq.stop_window:
            assert self.tokenizer is not None  # checked when the request was submitted
            decoded = self.tokenizer.decode(seq.tokens[-seq.stop_window :], skip_special_tokens=False)
            text = decoded if isinstance(decoded, str) else "".join(decoded)
            for stop in params.stop_strings:
                if stop in text:
                    return "stop", stop
        if len(seq.tokens) >= params.max_new_tokens:
            return "length", None
        if len(seq.request.prompt_ids) + len(seq.tokens) >= seq.max_total:
            return "length", None
        return None

    def _remove_rows(self, indices: list[int]) -> None:
        """Free rows, keeping the running rows contiguous by moving the last row into each hole."""
        for i in sorted(indices, reverse=True):
            last = len(self.rows) - 1
            if i != last:
                self.cache.move_row(last, i, self.rows[last].cached)
                self.rows[i] = self.rows[last]
            self.rows.pop()
        if indices:
            self._row_params = None


def _prefill_groups(seqs: list[SequenceState], budget: int) -> list[list[SequenceState]]:
    """Split admitted sequences into prefill forwards of at most ``budget`` padded tokens.

    Sorting by prompt length keeps the padding small; a prompt longer than the budget goes alone.
    """
    groups: list[list[SequenceState]] = []
    current: list[SequenceState] = []
    for seq in sorted(seqs, key=lambda s: len(s.request.prompt_ids)):
        n = len(seq.request.prompt_ids)
        if current and (len(current) + 1) * n > budget:
            groups.append(current)
            current = []
        current.append(seq)
    if current:
        groups.append(current)
    return groups
