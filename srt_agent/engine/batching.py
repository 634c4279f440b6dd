"""Continuous batching: admit waiting requests, prefill them, decode every running row one step.

The scheduler is single-threaded (the engine's worker thread owns it and the model). Running
sequences occupy cache rows ``0 .. n-1``; a finished sequence's row is refilled by moving the last
row into it, so every decode step is one forward over a contiguous row range. New requests are
admitted whenever rows are free, prefilled together (padded, under a token budget) and join the
next decode step: sequences join and leave the batch independently. Live requests are admitted
before run-ahead ones and take the rows of running run-ahead sequences when the batch is full.

With a :class:`~srt_agent.engine.speculation.speculator.Speculator`, a decode step may verify draft trees and
emit several tokens per row; each row then commits its tokens one by one (stop conditions can cut
an accepted path) and its KV cache row is compacted to the accepted path.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch
import torch.autograd.profiler as torch_profiler

from srt_agent.contracts.draft import EMPTY_DRAFT, DraftTree
from srt_agent.contracts.generation import FinishReason
from srt_agent.engine.constraint import CallMasks, CallTracker, Vocabulary
from srt_agent.engine.kv_cache import KVCache, causal_bias, decode_bias
from srt_agent.engine.llama import CausalLM
from srt_agent.engine.prefix_cache import PrefixStore
from srt_agent.engine.sampling import RowParams, sample
from srt_agent.engine.sequence import Detokenizer, SequenceState
from srt_agent.engine.speculation.runahead_gate import RunAheadGate
from srt_agent.engine.speculation.speculator import Emitted, Speculator, sync
from srt_agent.engine.speculation.stats import SpecCounters
from srt_agent.engine.step_graphs import CaptureFreeTimer, StepGraphs

__all__ = ["Detokenizer", "Scheduler", "SequenceState"]

log = logging.getLogger(__name__)

_Result = tuple[SequenceState, FinishReason, int | str | None, str | None]  # (seq, reason, stop, error)


class Scheduler:
    """Steps a continuously batched set of sequences through one model and KV cache.

    Args:
        model: The model.
        cache: The KV cache (rows are owned by this scheduler).
        max_batch: Most sequences decoding at once.
        tokenizer: Needed only for stop strings.
        prefill_tokens: Budget of padded tokens per prefill forward (several prompts share one).
        speculator: Draft source link (drafts, verification, reporting); ``None``: plain decoding.
        counters: Speculation metrics (tokens and forwards are counted with or without drafts).
        prefix_store: Parked keys/values of ended sequences, reused by prompts sharing their prefix
            (``None``: every prompt is prefilled whole).
        graphs: Static-shape steps (CUDA graphs) for decode forwards; ``None``: eager forwards.
    """

    def __init__(
        self,
        model: CausalLM,
        cache: KVCache,
        *,
        max_batch: int,
        tokenizer: Detokenizer | None = None,
        prefill_tokens: int = 4096,
        speculator: Speculator | None = None,
        counters: SpecCounters | None = None,
        prefix_store: PrefixStore | None = None,
        graphs: StepGraphs | None = None,
    ) -> None:
        self.model = model
        self.graphs = graphs
        self.cache = cache
        self.max_batch = max_batch
        self.tokenizer = tokenizer
        self.prefill_tokens = prefill_tokens
        self.speculator = speculator
        self.counters = counters if counters is not None else SpecCounters()
        self.prefix = prefix_store if prefix_store is not None else PrefixStore(0)
        self.rows: list[SequenceState] = []
        self.waiting: deque[SequenceState] = deque()
        self._row_params: RowParams | None = None  # rebuilt when the row set changes
        self._admissions = 0
        # Counters for tests and monitoring: forwards run and the largest decode batch seen.
        self.decode_steps = 0
        self.prefill_forwards = 0
        self.peak_batch = 0
        self.joined_running = 0  # sequences admitted while others were decoding
        self.runahead_gate = RunAheadGate()  # whether run-ahead rows pay for themselves here
        self._masks: CallMasks | None = None  # built on the first request with a tool grammar
        self._masks_lock = threading.Lock()

    def call_masks(self) -> CallMasks:
        """The tool-call masks over this engine's vocabulary (built once, on first use).

        Raises:
            ConstraintError: The tokenizer has no single ``<tool_call>``/``</tool_call>`` tokens.
            ValueError: There is no tokenizer.
        """
        with self._masks_lock:  # the engine's thread and an in-process learner may both ask first
            if self._masks is None:
                if self.tokenizer is None:
                    raise ValueError(
                        "constrained tool calls need a tokenizer: "
                        "pass tokenizer= to TorchEngine or save one with the model"
                    )
                self._masks = CallMasks(
                    Vocabulary(self.tokenizer, self.model.config.vocab_size), self.model.device
                )
            return self._masks

    def add(self, seq: SequenceState) -> None:
        """Queue a sequence for admission at the next step.

        Args:
            seq: A validated sequence (token ids in range; a tokenizer exists if it has stop strings).
        """
        longest = max((len(s) for s in seq.request.params.stop_strings), default=0)
        # A stop string of n characters spans at most ~4n byte-level tokens; a margin covers
        # tokens that decode to nothing on their own.
        seq.stop_window = 4 * longest + 8 if longest else 0
        grammar = seq.request.tool_grammar
        if grammar is not None:
            seq.tracker = CallTracker(grammar, self.call_masks().vocabulary)
            seq.tracker.resume(seq.request.prompt_ids)
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Whether any sequence is running or waiting."""
        return bool(self.rows or self.waiting)

    def can_step(self) -> bool:
        """Whether a step would do anything: rows run, or a waiting sequence may be admitted.

        Run-ahead sequences that wait for a spare row do not count: until a live request arrives
        or one ends, nothing would change, so the worker may block instead of spinning.
        """
        if self.rows or any(s.request.priority == "live" for s in self.waiting):
            return True
        return bool(self.waiting) and self._spare_rows(0) > 0

    def abort_all(self, error: str) -> None:
        """Finish every running and waiting sequence with ``abort``."""
        seqs = [*self.rows, *self.waiting]
        self.rows.clear()
        self.waiting.clear()
        self._row_params = None
        for seq in seqs:
            self._deliver(seq, "abort", error=error)

    @torch.inference_mode()
    def step(self) -> None:
        """Admit and prefill waiting sequences while rows are free, then decode all rows once."""
        self._drop_cancelled()
        self._preempt_runahead()
        admitted: list[SequenceState] = []
        while self.waiting and len(self.rows) + len(admitted) < self.max_batch:
            seq = self._next_waiting(admitted)
            if seq is None:
                break
            admitted.append(seq)
        if self.rows:
            self.joined_running += len(admitted)
        # Sequences admitted together with the same prompt (a GRPO group's samples): prefill one,
        # park its prompt, and let the others copy it (they prefill only the last prompt token).
        leaders: dict[tuple[int, ...], SequenceState] = {}
        first: list[SequenceState] = []
        followers: list[SequenceState] = []
        for seq in admitted:
            leader = leaders.setdefault(seq.request.prompt_ids, seq)
            if leader is seq or not self.prefix.budget_bytes:
                first.append(seq)
            else:
                leader.share_prompt = True
                followers.append(seq)
        for wave in (first, followers):
            for seq in wave:
                seq.reuse = self.prefix.lookup(seq.request.prompt_ids)
            for group in _prefill_groups(wave, self.prefill_tokens, self.cache.max_positions):
                with _labelled(PREFILL_RANGE):
                    self._prefill(group)
        if self.rows:
            self._decode()

    def _next_waiting(self, admitted: Sequence[SequenceState]) -> SequenceState | None:
        """Pop the first live waiting sequence, else the first run-ahead one if a row is spare.

        ``admitted``: the sequences this step already admitted (they count as rows).
        """
        for i, seq in enumerate(self.waiting):
            if seq.request.priority == "live":
                del self.waiting[i]
                break
        else:
            rows = [*self.rows, *admitted]
            live = sum(1 for s in rows if s.request.priority == "live")
            if len(rows) - live >= self._spare_rows(live):
                return None  # run-ahead would slow the live rows' steps: it waits
            seq = self.waiting.popleft()
        seq.admitted = self._admissions
        self._admissions += 1
        return seq

    def _spare_rows(self, live: int) -> int:
        """Run-ahead rows a step of ``live`` live rows may carry.

        The rows the live rows' steps have idle (the cost model's plain-step fit), while run-ahead
        pays for itself here (:class:`RunAheadGate`); none otherwise.
        """
        if self.speculator is None:
            return self.max_batch
        cost = self.speculator.cost
        if cost.runahead_unlimited:
            return self.max_batch
        # A tiny per-row cost (a GPU, a toy model) sizes many spare rows; the ledger still decides.
        return cost.spare_rows(live) if self.runahead_gate.open() else 0

    def _preempt_runahead(self) -> None:
        """Free the rows of the newest run-ahead sequences that live ones need or that are not spare.

        Live sequences that would wait otherwise take rows first; run-ahead rows past what the live
        rows' steps can carry (:meth:`_spare_rows`) are given up too.
        """
        runahead = [i for i, s in enumerate(self.rows) if s.request.priority == "runahead"]
        if not runahead:
            return
        live_waiting = sum(1 for s in self.waiting if s.request.priority == "live")
        short = live_waiting - (self.max_batch - len(self.rows))
        live = min(len(self.rows) - len(runahead) + live_waiting, self.max_batch)
        excess = len(runahead) - self._spare_rows(live)
        if max(short, excess) <= 0:
            return
        victims = sorted(runahead, key=lambda i: self.rows[i].admitted, reverse=True)[: max(short, excess)]
        seqs = [self.rows[i] for i in victims]
        for i in victims:
            self._park(self.rows[i], i, self.rows[i].cached)
        self._remove_rows(victims)
        self.counters.add(preempted=len(seqs))
        for seq in seqs:
            self._deliver(seq, "preempted")

    def _park(self, seq: SequenceState, row: int, length: int) -> None:
        """Offer the first ``length`` cached positions of ``seq``'s row to the prefix store."""
        if self.prefix.budget_bytes:
            prompt = seq.request.prompt_ids
            tokens = (
                prompt[:length] if length <= len(prompt) else (*prompt, *seq.tokens[: length - len(prompt)])
            )
            self.prefix.park(tokens, self.cache, row)

    def _drop_cancelled(self) -> None:
        """Abort sequences whose caller gave up (their output reaches nobody, but frees the id)."""
        dropped = [s for s in self.waiting if s.cancelled()]
        self.waiting = deque(s for s in self.waiting if not s.cancelled())
        gone = [i for i, s in enumerate(self.rows) if s.cancelled()]
        dropped += [self.rows[i] for i in gone]
        self._remove_rows(gone)
        for seq in dropped:
            self._deliver(seq, "abort", error="cancelled")

    def _deliver(
        self,
        seq: SequenceState,
        reason: FinishReason,
        stop: int | str | None = None,
        error: str | None = None,
    ) -> None:
        """End a sequence: tell the draft source, then hand the output to the caller."""
        if self.speculator is not None:
            self.speculator.finish(seq)
        seq.output(reason, stop=stop, error=error)

    def _params(self) -> RowParams:
        if self._row_params is None:
            self._row_params = RowParams.build(
                [s.request.params for s in self.rows], self.model.config.vocab_size, self.model.device
            )
        return self._row_params

    def _uniforms(self, seqs: Sequence[SequenceState], rows: RowParams) -> torch.Tensor | None:
        values = _next_uniforms(seqs)
        return None if values is None else torch.tensor(values, dtype=torch.float32, device=self.model.device)

    def _prefill(self, group: list[SequenceState]) -> None:
        """Prefill a group's prompts in one forward; a reused prefix is copied in, not recomputed.

        On static steps (CUDA graphs) when the group fits them, else eagerly.
        """
        start_time = time.perf_counter()
        device = _device_s(self.graphs)
        row_start, k = len(self.rows), len(group)
        reused = [s.reuse.length if s.reuse is not None else 0 for s in group]
        new = [len(s.request.prompt_ids) - r for s, r in zip(group, reused, strict=True)]
        t = max(new)
        length = max(reused) + t
        try:
            self.cache.reserve(row_start + k, length)
            for i, s in enumerate(group):
                if s.reuse is not None:
                    self.cache.data[:, :, row_start + i, :, : reused[i]] = s.reuse.kv[:, :, :, : reused[i]]
                    s.reuse = None  # drop the reference: the store may evict the entry
            graphs = self.graphs
            in_call = any(s.tracker is not None and s.tracker.active for s in group)  # a prompt ends in one
            if graphs is not None and not in_call and graphs.fits_prefill(k, t, max(reused)):
                params = [s.request.params for s in group]
                prompts = [s.request.prompt_ids[r:] for s, r in zip(group, reused, strict=True)]
                draws = graphs.prefill(prompts, reused, row_start, _next_uniforms(group), params)
                first, first_logprobs = [d[0] for d in draws.tokens], [d[0] for d in draws.logprobs]
            else:
                first, first_logprobs = self._eager_prefill(group, row_start, reused, new)
        except Exception as exc:  # isolate: only this prefill group fails
            log.exception("prefill failed")
            for s in group:
                self._deliver(s, "abort", error=f"prefill failed: {type(exc).__name__}: {exc}")
            return
        self.rows.extend(group)
        for i, s in enumerate(group):
            if s.share_prompt:  # its whole prompt is in its row now
                self._park(s, row_start + i, len(s.request.prompt_ids))
        self._row_params = None
        self.prefill_forwards += 1
        self.counters.add(prefill_forwards=1, prefill_rows=k, prefill_tokens=sum(new))
        seconds = time.perf_counter() - start_time
        self.counters.add_time(prefill=seconds, prefill_device=_device_s(self.graphs) - device)  # synced
        ahead = sum(n for s, n in zip(group, new, strict=True) if s.request.priority == "runahead")
        self.runahead_gate.prefill(seconds, ahead, sum(new))
        self._finish_step(
            row_start,
            [Emitted([t], [lp]) for t, lp in zip(first, first_logprobs, strict=True)],
            prefill=True,
        )

    def _eager_prefill(
        self, group: list[SequenceState], row_start: int, reused: list[int], new: list[int]
    ) -> tuple[list[int], list[float]]:
        """The group's prefill forward, eagerly; each row's first token and its logprob."""
        device = self.model.device
        k, t = len(group), max(new)
        length = max(reused) + t
        ids = torch.zeros((k, t), dtype=torch.long)
        for i, s in enumerate(group):
            ids[i, : new[i]] = torch.tensor(s.request.prompt_ids[reused[i] :], dtype=torch.long)
        start = torch.tensor(reused, device=device)[:, None]
        positions = start + torch.arange(t, device=device)[None, :]  # (k, T)
        bias = causal_bias(reused, t, length, self.model.dtype, device)  # (k, 1, T, L)
        last = torch.tensor(new, device=device) - 1
        logits = self.model.forward(
            ids.to(device), positions, self.cache, row_start, positions, bias, logit_index=last
        )  # (k, V)
        masks = self._call_masks(group)
        if masks is not None:
            logits = logits.masked_fill(~masks, float("-inf"))
        rows = RowParams.build([s.request.params for s in group], self.model.config.vocab_size, device)
        tokens, logprobs = sample(logits, rows, self._uniforms(group, rows))
        return tokens.tolist(), logprobs.tolist()

    def _decode(self) -> None:
        b = len(self.rows)
        spec = self.speculator
        try:
            with _labelled(DRAFT_RANGE):
                drafts = spec.drafts(self.rows) if spec is not None else None
            device = _device_s(self.graphs)
            # The cost model must not see graph captures, and reads its own clock.
            timer = CaptureFreeTimer(self.graphs, spec.clock if spec is not None else time.perf_counter)
            if spec is not None and drafts is not None:
                with _labelled(VERIFY_RANGE):
                    masks = self._tree_masks(self.rows, drafts)
                    emitted = spec.verify(self.rows, drafts, self._params(), masks)
                width = spec.last_width  # tokens per row in the forward, padding included
            else:
                with _labelled(DECODE_RANGE):
                    emitted, width = self._plain_decode(), 1
            seconds = timer.seconds()
            device = _device_s(self.graphs) - device
        except Exception as exc:  # a failed batched forward cannot be pinned on one row
            log.exception("decode step failed")
            self.abort_all(f"decode step failed: {type(exc).__name__}: {exc}")
            return
        if spec is not None:
            spec.cost.observe_step(b, width, seconds)
            self._charge_runahead(spec, b, width, seconds)
        for s in self.rows:
            s.decode_passes += 1
        self.decode_steps += 1
        self.peak_batch = max(self.peak_batch, b)
        self.counters.add(target_forwards=1)
        if drafts is not None:
            self.counters.add_time(verify_step=seconds, verify_device=device)
        else:
            self.counters.add_time(decode_step=seconds, decode_device=device)
        self._finish_step(0, emitted)

    def _tree_masks(self, seqs: Sequence[SequenceState], drafts: Sequence[DraftTree]) -> torch.Tensor | None:
        """``(B, width, V)`` allowed tokens at each tree position of a step; ``None`` if all are.

        A position's mask is that of the grammar state its path leads to: the row's own state at
        the root, and for a draft node the state after the tokens from the root to it (a drafted
        ``<tool_call>`` opens a block, so the positions under it are constrained). A node the
        grammar refuses is unreachable (probability 0 at its parent), so what lies under it is
        left unmasked. A plain decode or prefill step is the case of empty drafts (width 1).
        """
        need = [
            i
            for i, (s, d) in enumerate(zip(seqs, drafts, strict=True))
            if s.tracker is not None and (s.tracker.active or s.tracker.vocabulary.open_id in d.token_ids)
        ]
        if not need:
            return None
        masks = self.call_masks()
        width = 1 + max(len(d) for d in drafts)
        out = torch.ones(
            (len(seqs), width, masks.vocabulary.size), dtype=torch.bool, device=self.model.device
        )
        rows: list[int] = []
        positions: list[int] = []
        found: list[torch.Tensor] = []
        for i in need:
            tracker, draft = seqs[i].tracker, drafts[i]
            assert tracker is not None
            states, reachable = [tracker.state], [True]  # tree position 0 is the root
            for token, parent in zip(draft.token_ids, draft.parents, strict=True):
                above = parent + 1
                state, allowed = tracker.step(states[above], token) if reachable[above] else (None, False)
                states.append(state)
                reachable.append(reachable[above] and allowed)
            for position, (state, ok) in enumerate(zip(states, reachable, strict=True)):
                if ok and state is not None:
                    rows.append(i)
                    positions.append(position)
                    found.append(masks.mask(tracker.grammar, state))
        if found:  # one gather and one scatter, not a device copy per position (host-bound on a GPU)
            pinned = out.device.type == "cuda"
            where = torch.tensor([rows, positions], dtype=torch.long, pin_memory=pinned)
            where = where.to(out.device, non_blocking=True)
            out[where[0], where[1]] = torch.stack(found)
        return out

    def _call_masks(self, seqs: Sequence[SequenceState]) -> torch.Tensor | None:
        """``(B, V)`` allowed next tokens of a plain step's rows; ``None`` if no row is inside a call."""
        masks = self._tree_masks(seqs, [EMPTY_DRAFT] * len(seqs))
        return None if masks is None else masks[:, 0]

    def _charge_runahead(self, spec: Speculator, batch: int, width: int, seconds: float) -> None:
        """Enter a decode step in the run-ahead ledger: what its run-ahead rows cost and saved."""
        ahead = sum(1 for s in self.rows if s.request.priority == "runahead")
        alone = spec.cost.step_s(batch - ahead, width) if ahead < batch else 0.0
        self.runahead_gate.decode(seconds, min(alone, seconds), ahead)
        if width > 1:
            self.runahead_gate.credit(spec.last_runahead_accepted, spec.cost.step_s(batch, 1), batch)

    def _plain_decode(self) -> list[Emitted]:
        """One token per row: the classic decode forward."""
        masks = self._call_masks(self.rows)
        if self.graphs is not None and self.graphs.fits(len(self.rows), 1):
            return self._static_decode(self.graphs, masks)
        device = self.model.device
        b = len(self.rows)
        start = time.perf_counter()
        lengths = [s.cached + 1 for s in self.rows]  # the new token included
        length = max(lengths)
        self.cache.reserve(b, length)
        ids = torch.tensor([[s.tokens[-1]] for s in self.rows], dtype=torch.long, device=device)
        lengths_t = torch.tensor(lengths, dtype=torch.long, device=device)
        positions = (lengths_t - 1)[:, None]  # (B, 1)
        bias = decode_bias(lengths_t, length, self.model.dtype)  # (B, 1, 1, L)
        logits = self.model.forward(ids, positions, self.cache, 0, positions, bias)[:, 0]  # (B, V)
        if masks is not None:
            logits = logits.masked_fill(~masks, float("-inf"))
        rows = self._params()
        tokens, logprobs = sample(logits, rows, self._uniforms(self.rows, rows))
        sync(device)
        out = [Emitted([t], [lp]) for t, lp in zip(tokens.tolist(), logprobs.tolist(), strict=True)]
        self.counters.add_time(forward=time.perf_counter() - start)
        return out

    def _static_decode(self, graphs: StepGraphs, masks: torch.Tensor | None) -> list[Emitted]:
        """One token per row through a static-shape step (a CUDA graph replay on a GPU).

        ``masks`` (``(B, V)`` bool, or ``None``) are the rows' allowed tokens (constrained calls).
        """
        start = time.perf_counter()
        rows = self.rows
        params = [s.request.params for s in rows]
        values = _next_uniforms(rows)
        uniforms = None if values is None else [[u] for u in values]
        allowed = None if masks is None else masks[:, None]
        draws = graphs.run(
            [[s.tokens[-1]] for s in rows], [s.cached for s in rows], None, uniforms, params, allowed
        )
        out = [Emitted([t[0]], [lp[0]]) for t, lp in zip(draws.tokens, draws.logprobs, strict=True)]
        self.counters.add_time(forward=time.perf_counter() - start)
        return out

    def _finish_step(self, row_start: int, emitted: Sequence[Emitted], *, prefill: bool = False) -> None:
        """Commit each row's tokens (up to a stop), free finished rows, then deliver them."""
        done: list[int] = []
        results: list[_Result] = []
        reports: list[tuple[SequenceState, list[int]]] = []
        committed = runahead = 0
        keeps: list[tuple[int, int, Sequence[int]]] = []
        ended: list[tuple[SequenceState, int, int, Emitted]] = []
        for i, em in enumerate(emitted):
            row = row_start + i
            seq = self.rows[row]
            start, prefix = len(seq.tokens), seq.cached
            finished = self._commit(seq, em, results)
            new = seq.tokens[start:]
            if seq.tracker is not None:
                seq.tracker.feed(new)
            committed += len(new)
            if seq.request.priority == "runahead":
                runahead += len(new)
            if self.speculator is not None:
                reports.append((seq, new))
            if em.kept is not None:
                # Keep the root and the accepted nodes, contiguous (the last emitted token is not
                # in the cache yet, as after a plain decode step): for a row that goes on, and
                # for one that ended, whose row is parked below.
                keeps.append((row, prefix, em.kept))
            if finished:
                done.append(row)
                ended.append((seq, row, prefix, em))
        self.cache.keep_many(keeps)  # every row's compaction in one gather and one scatter
        for seq, row, prefix, em in ended:
            # Park what the row holds for a later prompt that shares the prefix (the episode's
            # next turn): the positions before this step, plus what this step wrote for tokens
            # the sequence kept, so the next turn does not prefill them again.
            self._park(seq, row, self._valid_after(seq, prefix, em, prefill))
        if self.speculator is not None:  # one call for every row's tokens
            self.speculator.report_many(reports)
        self.counters.add(tokens=committed, runahead_tokens=runahead, row_steps=len(emitted))
        # Free rows first, so a caller woken by its output already sees the row released.
        self._remove_rows(done)
        for seq, reason, stop, error in results:
            self._deliver(seq, reason, stop=stop, error=error)

    def _valid_after(self, seq: SequenceState, prefix: int, em: Emitted, prefill: bool) -> int:
        """Cache positions of a finished row that hold its tokens after this step (made contiguous).

        A prefill step wrote the prompt only (``prefix``); a decode step also wrote the last token
        before the step; a verify step wrote the root and the accepted nodes (compacted by then).
        The sequence may have stopped inside the accepted path, so the count is capped by its length.
        """
        if prefill:
            return prefix
        if em.kept is None:
            return prefix + 1
        return min(prefix + len(em.kept), len(seq.request.prompt_ids) + len(seq.tokens))

    def _commit(self, seq: SequenceState, em: Emitted, results: list[_Result]) -> bool:
        """Append ``em``'s tokens to ``seq`` one by one until one ends it; whether it ended."""
        if not seq.stop_window:
            return _commit_tokens(seq, em, results)
        for token, logprob in zip(em.tokens, em.logprobs, strict=True):
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            try:
                finished = self._check_stop(seq)
            except Exception as exc:
                log.exception("stop check of request %r failed", seq.request.request_id)
                results.append((seq, "abort", None, f"stop check failed: {type(exc).__name__}: {exc}"))
                return True
            if finished is not None:
                results.append((seq, finished[0], finished[1], None))
                return True
        return False

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
        if seq.tokens_left() <= 0:
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


def _commit_tokens(seq: SequenceState, em: Emitted, results: list[_Result]) -> bool:
    """:meth:`Scheduler._commit` of a request without stop strings, in one pass.

    The same rule as :meth:`Scheduler._check_stop` after each token (a stop token first, then the
    length limit), found by index: the tokens up to the first that ends the sequence are appended
    at once. This runs for every emitted token of every row (up to the draft budget per step).
    """
    tokens, logprobs = em.tokens, em.logprobs
    if len(tokens) != len(logprobs):
        raise ValueError(f"{len(tokens)} tokens but {len(logprobs)} logprobs")
    stops = seq.request.params.stop_token_ids
    left = seq.tokens_left()
    end = len(tokens)
    reason: FinishReason | None = None
    stop: int | None = None
    for i, token in enumerate(tokens):
        if token in stops:
            end, reason, stop = i + 1, "stop", token
            break
        if left <= i + 1:
            end, reason = i + 1, "length"
            break
    seq.tokens.extend(tokens[:end])
    seq.logprobs.extend(logprobs[:end])
    if reason is None:
        return False
    results.append((seq, reason, stop, None))
    return True


def _next_uniforms(seqs: Sequence[SequenceState]) -> list[float] | None:
    """Each sequence's next uniform (0.0 for a greedy one, which draws none); ``None`` if all greedy."""
    if all(s.request.params.temperature == 0 for s in seqs):
        return None
    return [s.next_uniform() if s.request.params.temperature > 0 else 0.0 for s in seqs]


PREFILL_RANGE = "srt.prefill"
DECODE_RANGE = "srt.decode_step"
VERIFY_RANGE = "srt.verify_step"
DRAFT_RANGE = "srt.draft"
"""Names of the profiler ranges around the engine's prefills, plain decode steps, verify steps and
draft lookups (:mod:`srt_agent.speed.profiling` reads them)."""


def _labelled(name: str) -> contextlib.AbstractContextManager[object]:
    """A profiler range called ``name`` while torch.profiler records; nothing otherwise.

    (A range costs ~9 µs of host time even with no profiler running.)
    """
    return (
        torch_profiler.record_function(name)
        if torch_profiler._is_profiler_enabled
        else contextlib.nullcontext()
    )


def _device_s(graphs: StepGraphs | None) -> float:
    """The static steps' device time so far (0 without them: the split is then unknown)."""
    return graphs.device_s if graphs is not None else 0.0


def _prefill_groups(seqs: list[SequenceState], budget: int, span: int) -> list[list[SequenceState]]:
    """Split admitted sequences into prefill forwards of at most ``budget`` padded tokens.

    Sorting by the tokens to prefill (the prompt less a reused prefix) keeps the padding small; a
    prompt longer than the budget goes alone. A forward writes every row at its reused length plus
    ``0 .. T-1`` (padding included) for the group's longest new part ``T``, so a group also stays
    within ``span`` cache positions: its longest reused prefix plus ``T`` (a sequence alone
    always fits, its prompt being within the context).
    """
    groups: list[list[SequenceState]] = []
    current: list[SequenceState] = []
    reused = 0  # the longest reused prefix in `current`
    for seq in sorted(seqs, key=_new_tokens):
        n = _new_tokens(seq)
        mine = seq.reuse.length if seq.reuse is not None else 0
        if current and ((len(current) + 1) * n > budget or max(reused, mine) + n > span):
            groups.append(current)
            current, reused = [], 0
        current.append(seq)
        reused = max(reused, mine)
    if current:
        groups.append(current)
    return groups


def _new_tokens(seq: SequenceState) -> int:
    """Prompt tokens a sequence's prefill computes (those of a reused prefix are copied)."""
    return len(seq.request.prompt_ids) - (seq.reuse.length if seq.reuse is not None else 0)
