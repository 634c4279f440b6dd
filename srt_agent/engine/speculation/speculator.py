"""Speculative decode steps: ask the draft source, verify every row's draft tree in one forward.

The :class:`Speculator` is the scheduler's link to a draft source (the tree cache). Each decode step
it asks the cost model (:mod:`srt_agent.engine.speculation.budget`) how many draft tokens each row should get,
fetches the drafts, and, if any survive the cost model, runs ONE forward over all rows: per row the
last committed token (the tree's root, not yet in the KV cache) followed by its draft nodes, with
the tree attention mask and depth-based positions of :func:`~srt_agent.engine.kv_cache.tree_bias`.
Each row's tree is then walked with the exact acceptance rule
(:class:`~srt_agent.engine.speculation.verify.TreeWalk`), drawing target tokens depth by depth only
where the walks go.
The scheduler commits the emitted tokens and compacts the KV cache to the accepted path.

It also reports each step's committed tokens to the draft source (``extend_many``, one call for
every row) and every ended sequence (``finish``), with speculation enabled or not, so the cache
fills from in-flight sequences. A draft source that raises never fails a request: the error is
logged and counted, the step goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from srt_agent import native
from srt_agent.contracts.draft import EMPTY_DRAFT, DraftQuery, DraftSourceProtocol, DraftTree, StreamUpdate
from srt_agent.engine.kv_cache import KVCache, causal_bias, tree_bias
from srt_agent.engine.llama import CausalLM
from srt_agent.engine.sampling import RowParams, sample
from srt_agent.engine.sequence import SequenceState
from srt_agent.engine.speculation.budget import CostModel
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.engine.speculation.stats import SpecCounters
from srt_agent.engine.speculation.verify import TreeWalk, Verdict
from srt_agent.engine.step_graphs import StepGraphs

log = logging.getLogger(__name__)

_CALIBRATION_TOKENS = (1, 16, 64)  # forward sizes timed at startup (the cost model's prior)


@dataclass(frozen=True)
class Emitted:
    """What one row commits after a decode step.

    Attributes:
        tokens: Emitted tokens (the accepted draft tokens, then one drawn from the target).
        logprobs: Their logprobs under the processed target distribution.
        kept: Cache offsets (relative to the row's length before the step) to keep if the sequence
            goes on: the root and the accepted nodes. ``None``: the cache is already contiguous.
    """

    tokens: list[int]
    logprobs: list[float]
    kept: list[int] | None = None


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so wall-clock timings measure it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forwards(
    model: CausalLM,
    sizes: Sequence[int],
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[int, float]]:
    """Time forwards of ``n`` new tokens (one row, causal, full logits) on a scratch cache.

    Args:
        model: The model.
        sizes: Token counts to time.
        repeats: Timings per size; the fastest is kept (robust to a busy machine).
        clock: The time source.

    Returns:
        ``(tokens, seconds)`` per size.
    """
    c = model.config
    longest = max(sizes)
    scratch = KVCache(
        c.num_layers,
        c.num_kv_heads,
        c.head_dim,
        1,
        longest,
        dtype=model.dtype,
        device=model.device,
        initial_positions=longest,
    )
    points = []
    for n in sizes:
        ids = torch.zeros((1, n), dtype=torch.long, device=model.device)
        positions = torch.arange(n, device=model.device)[None]  # (1, n)
        bias = causal_bias([0], n, n, model.dtype, model.device)
        best = float("inf")
        for _ in range(repeats):
            sync(model.device)
            start = clock()
            model.forward(ids, positions, scratch, 0, positions, bias)
            sync(model.device)
            best = min(best, clock() - start)
        points.append((n, best))
    return points


class Speculator:
    """Drafts, verification and draft-source reporting for the scheduler.

    Args:
        model: The target model.
        cache: The scheduler's KV cache (rows ``0 .. B-1`` are the running sequences).
        source: The draft source.
        config: Speculation options.
        counters: Where metrics go.
        graphs: Static-shape steps (CUDA graphs) for verify forwards that fit them; ``None``:
            every verify forward runs eagerly.
        clock: The time source of the cost model's measurements (``time.perf_counter``; see
            :class:`~srt_agent.engine.torch_engine.TorchEngine`'s ``cost_clock``).
    """

    def __init__(
        self,
        model: CausalLM,
        cache: KVCache,
        source: DraftSourceProtocol,
        config: SpecConfig,
        counters: SpecCounters,
        graphs: StepGraphs | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.model = model
        self.clock = clock or time.perf_counter
        self.graphs = graphs
        self.cache = cache
        self.source = source
        self.config = config
        self.counters = counters
        self.cost = CostModel(config)
        if graphs is not None and graphs.fits(1, config.tree_slots):
            self.cost.fixed_width = graphs.max_width  # static verify steps are padded to it
        self.last_width = 1  # tree positions per row of the last verify forward, padding included
        self.last_runahead_accepted = 0  # accepted draft tokens from run-ahead in the last verify step
        if config.enabled and config.adaptive:
            # Once, at construction (not inside a generation): the cost model's prior.
            self.cost.set_prior(self._calibrate())

    # --- draft-source reporting ---------------------------------------------------------------

    def report_many(self, committed: Sequence[tuple[SequenceState, Sequence[int]]]) -> None:
        """Tell the draft source about every row's committed tokens of a step, in one call."""
        updates = []
        for seq, tokens in committed:
            r = seq.request
            updates.append(StreamUpdate(r.request_id, r.state_key, r.task_id, tokens, r.priority))
            seq.reported = True
        try:
            self.source.extend_many(updates)
        except Exception:
            log.exception("draft source extend_many() failed for %d rows", len(updates))
            self.counters.add(draft_errors=1)

    def finish(self, seq: SequenceState) -> None:
        """Tell the draft source that ``seq`` ended (if it ever reported tokens)."""
        if not seq.reported:
            return
        seq.reported = False
        try:
            self.source.finish(seq.request.request_id)
        except Exception:
            log.exception("draft source finish() failed for request %r", seq.request.request_id)
            self.counters.add(draft_errors=1)

    # --- drafting -----------------------------------------------------------------------------

    def drafts(self, rows: Sequence[SequenceState]) -> list[DraftTree] | None:
        """The drafts to verify this step, or ``None`` to decode plainly.

        Args:
            rows: The running sequences, in row order.

        Returns:
            One draft per row (some possibly empty), trimmed by the cost model.
        """
        if not self.config.enabled:
            return None
        caps = [max(0, min(s.tokens_left() - 1, self.config.max_draft_tokens)) for s in rows]
        groups = [s.request.draft_group for s in rows]
        budgets = self.cost.ask(caps, groups)
        if not any(budgets):
            return None
        start, clocked = time.perf_counter(), self.clock()
        drafts = self._draft_rows(rows, budgets)
        elapsed = time.perf_counter() - start
        self.cost.observe_lookup((self.clock() - clocked) / sum(1 for k in budgets if k > 0))
        chosen = self.cost.choose(drafts, groups)
        self.counters.add_time(draft=elapsed)
        self.counters.add(empty_drafts=sum(1 for k, d in zip(budgets, chosen, strict=True) if k and not d))
        if not any(chosen):
            return None
        if self.cost.probing:
            self.counters.add(probes=1)
        return chosen

    def _draft_rows(self, rows: Sequence[SequenceState], budgets: Sequence[int]) -> list[DraftTree]:
        """Every asked row's draft in one call to the source (rows asked for 0 get none).

        If the batched call fails, the rows are asked one by one, so a source that fails on one
        row costs only that row's draft.
        """
        asked = [i for i, k in enumerate(budgets) if k > 0]
        queries = [
            DraftQuery(r.request_id, r.state_key, r.task_id, r.prompt_ids, s.tokens, budgets[i])
            for i in asked
            for s in (rows[i],)
            for r in (s.request,)
        ]
        try:
            found = self.source.draft_many(queries)
            if len(found) != len(queries):
                raise ValueError(f"draft_many returned {len(found)} drafts for {len(queries)} queries")
        except Exception:
            log.exception("draft source draft_many() failed; asking row by row")
            self.counters.add(draft_errors=1)
            found = [self._draft_one(q) for q in queries]
        drafts = [EMPTY_DRAFT] * len(rows)
        for i, q, draft in zip(asked, queries, found, strict=True):
            drafts[i] = self._checked(draft, q)
        return drafts

    def _draft_one(self, q: DraftQuery) -> DraftTree:
        try:
            return self.source.draft(q.state_key, q.task_id, q.prompt_ids, q.generated, q.budget)
        except Exception:
            log.exception("draft source draft() failed for request %r", q.stream_id)
            self.counters.add(draft_errors=1)
            return EMPTY_DRAFT

    def _checked(self, draft: DraftTree, q: DraftQuery) -> DraftTree:
        """The draft, or a safe replacement if it breaks the engine's limits (logged and counted)."""
        if not draft:
            return draft
        budget = q.budget
        vocab = self.model.config.vocab_size
        if min(draft.token_ids) < 0 or max(draft.token_ids) >= vocab:  # would fail the whole batch's forward
            log.error("draft source returned token ids outside [0, %d) for %r", vocab, q.stream_id)
            self.counters.add(draft_errors=1)
            return EMPTY_DRAFT
        if len(draft) > budget:  # a prefix of a topological order is a valid subtree
            log.warning("draft source returned %d nodes for a budget of %d; truncating", len(draft), budget)
            draft = draft.head(budget)
        return draft

    @torch.inference_mode()
    def _calibrate(self) -> list[tuple[int, float]]:
        sizes = sorted({min(n, self.config.max_batch_tokens) for n in _CALIBRATION_TOKENS})
        points = time_forwards(self.model, sizes, clock=self.clock)
        log.info("speculation cost model prior (tokens, seconds): %s", points)
        return points

    # --- verification -------------------------------------------------------------------------

    def verify(
        self,
        rows: Sequence[SequenceState],
        drafts: Sequence[DraftTree],
        params: RowParams,
        masks: torch.Tensor | None = None,
    ) -> list[Emitted]:
        """Verify every row's draft in one forward and draw the tokens each row emits.

        Consumes each sampled row's uniforms for the tokens it emits (one per token, as plain
        decoding would). The KV cache holds the whole trees afterwards; the caller keeps
        :attr:`Emitted.kept` of the rows that go on.

        Args:
            rows: The running sequences (cache rows ``0 .. B-1``).
            drafts: One draft per row (may be empty).
            params: The rows' sampling parameters.
            masks: ``(B, width, V)`` bool, the tokens allowed at each tree position (constrained
                tool calls: a position's draw is from the masked, renormalised distribution);
                ``None``: all allowed.

        Returns:
            Per row, what it emits.
        """
        start = time.perf_counter()
        width = 1 + max(len(d) for d in drafts)
        # Tree position 0 is the root (the last committed token); draft node j is position j + 1.
        parents = [[-1] + [p + 1 if p >= 0 else 0 for p in d.parents] for d in drafts]
        sampled = not params.all_greedy
        # Per row the uniforms of its next `width` tokens: the token at depth d of the accepted
        # path is drawn with the d-th, the uniform plain decoding would have used for it.
        table = [
            s.peek_uniforms(width) if sampled and s.request.params.temperature > 0 else [0.0] * width
            for s in rows
        ]
        verdicts: list[Verdict]
        if self.graphs is not None and self.graphs.fits(len(rows), width):
            draws = self.graphs.run(
                [[s.tokens[-1], *d.token_ids] for s, d in zip(rows, drafts, strict=True)],
                [s.cached for s in rows],
                parents,
                table if sampled else None,
                [s.request.params for s in rows],
                masks,
            )
            forwarded = time.perf_counter()  # one static step: forward and draws together
            verdicts, logprob_rows = _walk_drawn(drafts, draws.tokens, draws.logprobs)
            self.last_width = self.graphs.max_width
        else:
            walks = [TreeWalk(d.token_ids, d.parents) for d in drafts]
            hidden = self._tree_forward(rows, drafts, parents, width)
            forwarded = time.perf_counter()
            draw = self._draw_all if self._draws_all(self.model.device) else self._draw_walk
            logprob_rows = draw(
                _DrawInputs(hidden, width, walks, params, table if sampled else None, parents, masks)
            )
            verdicts = [walk.verdict() for walk in walks]
            self.last_width = width
        emitted: list[Emitted] = []
        accepted: list[tuple[int, ...]] = []
        verified: list[tuple[str, int, int, int]] = []
        for seq, draft, verdict, lps in zip(rows, drafts, verdicts, logprob_rows, strict=True):
            if seq.request.params.temperature > 0:
                seq.skip_uniforms(len(verdict.tokens))
            kept = [0, *(j + 1 for j in verdict.accepted)]
            emitted.append(Emitted(list(verdict.tokens), lps, kept if len(kept) > 1 else None))
            accepted.append(verdict.accepted)
            if draft:
                runahead = sum(1 for j in verdict.accepted if draft.runahead[j]) if draft.runahead else 0
                verified.append((draft.source, len(draft), len(verdict.accepted), runahead))
        self.counters.add_verified_many(verified)
        self.last_runahead_accepted = sum(v[3] for v in verified)
        self.cost.observe_verify(drafts, accepted, [s.request.draft_group for s in rows])
        self.counters.add(verify_forwards=1)
        self.counters.add_time(forward=forwarded - start, verify=time.perf_counter() - forwarded)
        return emitted

    def _tree_forward(
        self,
        rows: Sequence[SequenceState],
        drafts: Sequence[DraftTree],
        parents: list[list[int]],
        width: int,
    ) -> torch.Tensor:
        """The eager verify forward: hidden states ``(B * width, E)`` of every row's tree."""
        device = self.model.device
        prefix = [s.cached for s in rows]
        length = max(prefix) + width
        self.cache.reserve(len(rows), length)
        ids = torch.tensor(
            [
                [s.tokens[-1], *d.token_ids] + [0] * (width - 1 - len(d))
                for s, d in zip(rows, drafts, strict=True)
            ],
            dtype=torch.long,
        )
        bias, positions = tree_bias(prefix, parents, length, self.model.dtype)  # (B, 1, T, L), (B, T)
        write = torch.tensor(prefix, dtype=torch.long)[:, None] + torch.arange(width)[None, :]  # (B, T)
        hidden = self.model.forward(
            ids.to(device),
            positions.to(device),
            self.cache,
            0,
            write.to(device),
            bias.to(device),
            hidden_only=True,
        ).view(len(rows) * width, -1)  # (B * T, E)
        sync(device)
        return hidden

    def _draws_all(self, device: torch.device) -> bool:
        if self.config.draws == "auto":
            return device.type != "cpu"
        return self.config.draws == "all"

    def _draw_walk(self, step: _DrawInputs) -> list[list[float]]:
        """Draw depth by depth, only at the positions the walks reach.

        The LM head and sampling run once per emitted token, however wide the trees (a leaf's
        walk always ends): the cheaper way where arithmetic dominates (a CPU).
        """
        hidden, width, walks, table = step.hidden, step.width, step.walks, step.table
        device = hidden.device
        logprob_rows: list[list[float]] = [[] for _ in walks]
        active = list(range(len(walks)))
        while active:
            at = torch.tensor([b * width + walks[b].position for b in active], device=device)
            index = torch.tensor(active, device=device)
            uniforms = (
                None
                if table is None
                else torch.tensor([table[b][len(walks[b].tokens)] for b in active], device=device)
            )
            logits = self.model.head(hidden[at])
            if step.masks is not None:
                where = torch.tensor([walks[b].position for b in active], device=device)
                logits = logits.masked_fill(~step.masks[index, where], float("-inf"))
            tokens, logprobs = sample(logits, step.params.select(index), uniforms)
            going = []
            for b, token, logprob in zip(active, tokens.tolist(), logprobs.tolist(), strict=True):
                logprob_rows[b].append(logprob)
                if walks[b].advance(token):
                    going.append(b)
            active = going
        return logprob_rows

    def _draw_all(self, step: _DrawInputs) -> list[list[float]]:
        """Draw at every tree position in one pass, then walk the trees on the host.

        A position at depth ``d`` draws with the row's ``d``-th uniform, the one the walk would
        use there, so the tokens equal :meth:`_draw_walk`'s; draws off the accepted path are
        discarded. One LM head over all positions and one sync: the cheaper way where launches
        and syncs dominate (a GPU).
        """
        uniforms = None
        if step.table is not None:
            depths = [_depths(p, step.width) for p in step.parents]
            uniforms = torch.tensor(
                [[u[d] for d in ds] for u, ds in zip(step.table, depths, strict=True)],
                device=step.hidden.device,
            )
        logits = self.model.head(step.hidden).view(len(step.walks), step.width, -1)
        if step.masks is not None:
            logits = logits.masked_fill(~step.masks, float("-inf"))
        tokens, logprobs = sample(logits, step.params, uniforms)
        return _advance_walks(step.walks, tokens.tolist(), logprobs.tolist())


def _walk_drawn(
    drafts: Sequence[DraftTree], tokens: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]]
) -> tuple[list[Verdict], list[list[float]]]:
    """Each row's acceptance walk over the tokens drawn at every tree position; emitted logprobs.

    One native call for all rows when the core is built. Draws off the accepted path are
    discarded (they were made with the uniforms the walk would use there, so the walk emits what
    drawing depth by depth would).
    """
    if native.core is not None:
        walked = native.core.walk_drawn(
            [d.token_ids for d in drafts], [d.parents for d in drafts], tokens, logprobs
        )
        return [Verdict(a, t, p) for a, t, p, _ in walked], [lps for *_, lps in walked]
    walks = [TreeWalk(d.token_ids, d.parents) for d in drafts]
    logprob_rows = _advance_walks(walks, tokens, logprobs)
    return [walk.verdict() for walk in walks], logprob_rows


def _advance_walks(
    walks: Sequence[TreeWalk], tokens: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]]
) -> list[list[float]]:
    """Advance each row's walk with the tokens drawn at every tree position; the emitted logprobs."""
    logprob_rows: list[list[float]] = []
    for walk, drawn, lps in zip(walks, tokens, logprobs, strict=True):
        row: list[float] = []
        while True:
            position = walk.position
            row.append(lps[position])
            if not walk.advance(drawn[position]):
                break
        logprob_rows.append(row)
    return logprob_rows


@dataclass
class _DrawInputs:
    """What a verify step's draws read: the forward's hidden states and each row's tree and uniforms."""

    hidden: torch.Tensor  # (B * width, E)
    width: int  # tree positions per row (root included, padded)
    walks: list[TreeWalk]  # per row, the acceptance walk (advanced by the draws)
    params: RowParams  # the rows' sampling parameters
    table: list[list[float]] | None  # per row, the uniforms of depths 0 .. width - 1 (None: all greedy)
    parents: list[list[int]]  # per row, each tree position's parent position (-1 for the root)
    masks: torch.Tensor | None = None  # (B, width, V) allowed tokens per position (None: all)


def _depths(parents: list[int], width: int) -> list[int]:
    """Depth of each tree position (root 0; parents index positions), padded to ``width`` with 0."""
    depth = [0] * width
    for j in range(1, len(parents)):
        depth[j] = depth[parents[j]] + 1
    return depth
