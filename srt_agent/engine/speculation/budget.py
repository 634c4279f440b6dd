"""The cost model of speculation: how many draft tokens are worth verifying in a decode step.

Verifying drafts costs forward time (every row of a verify forward is padded to the widest tree:
``batch * width`` tokens) and pays in emitted tokens (one per row plus the accepted draft tokens).
Each step the model maximises expected emitted tokens per second over the verify width ``w``:

``score(w) = (batch + expected accepted nodes among each row's best w - 1) / time(batch * w)``

* **Forward time** ``time(n) = a + b * n`` for a forward over ``n`` tokens (:class:`ForwardTime`):
  a prior from timing the model once at startup, refined by a least-squares fit over the recent
  real forwards, so it follows the machine (CPU forwards grow with tokens; GPU ones barely do).
  Plain decode steps are fitted by rows; a verify step's time over the plain step of the same rows
  gets its own fit, by draft tokens: a verify step pays a fixed extra (the tree mask, the draws and
  the walk) that one line through both kinds would spread over the tokens, under-predicting narrow
  verify steps (on a GPU, where a verify step cost ~1.6x a decode step at nearly the same forward
  time, that made drafts of ~1.2 tokens per forward look worth it). Fitting the extra rather than
  the whole verify step keeps it valid while verify steps are rare and contexts change.
* **Expected acceptance** of a node (:class:`Acceptance`): the draft's own estimate ``q`` (its
  path probability) times a calibration factor per draft source and depth (and per request
  ``draft_group``, the rollout scheduler's env id, so that one env's poor drafts do not make
  another env's look poor), measured as
  accepted / expected over recent verify steps, capped at 1 and at the parent's value (a node is
  accepted only after its parent). Drafts that never match (random tokens, a stale cache) drive
  the factor to ~0, and then no draft pays: the step decodes plainly and the draft source is not
  even asked (:meth:`CostModel.ask`).
* **Lookups that do not pay**: the step's width is chosen optimistically (as if the source were sure
  of its drafts), but a source that knows little about the current states returns drafts too
  uncertain to verify, and looking them up still costs time per row. So the draft source is asked
  only while recent lookups saved more decode time per row (the expected emitted tokens' plain
  decoding time, minus the verify step's time) than a lookup costs per row; probes keep
  re-measuring it.
* **Probes**: after an interval of steps without drafts, one step looks up whole drafts and
  verifies at least a small part of them anyway; otherwise a draft source that starts to pay (the
  cache fills up) would never be noticed. The interval is at least ``probe_interval`` and long
  enough that the fixed extra of a verify step stays within ``probe_overhead`` of decode time.
  Each probe that does not pay for itself doubles the interval of the request groups it probed (up
  to 16x); a group whose rows accepted enough to pay their share of the step resets it; a step
  probes when the interval of any group among its rows is due.

* **Control steps**: while every step verifies, plain steps are never timed, so the plain fit goes
  stale (contexts grow, other envs' batches come and go) and the verify extra, fitted against it,
  absorbs the drift: measured on Retail on 2 CPU cores, a run predicted plain steps at twice their
  real cost after an all-verify stretch and verified at 1.6 tokens per forward where a verify step
  cost 2x a plain one (0.85x overall). So after ``probe_interval`` drafted steps in a row, one step
  decodes plainly: a control, whose time keeps both fits honest (it forgoes at most 1 step's drafts
  in ``probe_interval + 1``).
* **Realized cost** (:class:`~srt_agent.engine.speculation.realized.RealizedCost`): what verify
  steps really gain over plain steps of the same batch size, per request group; a group whose
  verify steps gain less than 5% is asked for drafts in probes only, whatever the fits predict.
* **A fixed verify width** (static steps, CUDA graphs): every verify step is padded to one width
  (:attr:`CostModel.fixed_width`), so it costs the same however few nodes it verifies. Steps are
  then timed and predicted at that width: the choice is between plain decoding and verifying the
  best nodes up to it, and a batch too large for ``max_batch_tokens`` at that width decodes
  plainly (the batch-size threshold of speculation, as SGLang's
  ``--speculative-batch-size-threshold``).

Useless drafts thus cost the probes, a few verify steps of learning after startup, and a little
bookkeeping per step; this keeps speculation within a few percent of plain decoding. What the
model does not capture: forward time is taken as linear in the padded token count (attention's
growth with context length is only followed through the running fit), and acceptance is assumed
independent of the batch's other rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from srt_agent import native
from srt_agent.contracts.draft import EMPTY_DRAFT, DraftTree
from srt_agent.engine.speculation.acceptance import Acceptance
from srt_agent.engine.speculation.forward_time import ForwardTime
from srt_agent.engine.speculation.realized import RealizedCost
from srt_agent.engine.speculation.spec_config import SpecConfig

_YIELD_DECAY = 0.9  # per lookup step: the realised yield of lookups follows the last ~10 of them


_NO_RUNAHEAD_LIMIT = 10.0  # spec.runahead_slowdown at which run-ahead rows are not limited
_UNLIMITED_ROWS = 1 << 30


@dataclass(frozen=True)
class Ranked:
    """A draft's nodes in the order they are worth verifying, each with its expected acceptance.

    Attributes:
        order: Node indices, ancestors before descendants (any prefix is a valid subtree).
        values: Expected acceptance of each node in ``order``.
    """

    order: tuple[int, ...]
    values: tuple[float, ...]


def subtree(draft: DraftTree, nodes: Sequence[int]) -> DraftTree:
    """The draft restricted to ``nodes`` (closed under ancestors), re-indexed in tree order.

    Args:
        draft: A draft tree.
        nodes: Node indices to keep; every kept node's parent must be kept too.

    Returns:
        The smaller tree (``draft`` itself when all nodes are kept).

    Raises:
        ValueError: A kept node's parent is not kept.
    """
    if len(nodes) == len(draft):
        return draft
    if not nodes:
        return EMPTY_DRAFT
    kept = sorted(nodes)
    if kept[-1] == len(kept) - 1:  # the first nodes (a ranked draft's best): parents stay as they are
        return draft.head(len(kept))
    index = {j: i for i, j in enumerate(kept)}
    parents = []
    for j in kept:
        parent = draft.parents[j]
        if parent >= 0 and parent not in index:
            raise ValueError(f"node {j} is kept but its parent {parent} is not")
        parents.append(index[parent] if parent >= 0 else -1)
    # A subtree closed under ancestors of a valid tree is valid: no need to check it again.
    return DraftTree.trusted(
        tuple(draft.token_ids[j] for j in kept),
        tuple(parents),
        tuple(draft.probs[j] for j in kept),
        draft.source,
        tuple(draft.runahead[j] for j in kept) if draft.runahead else (),
        draft.backoff,
    )


class CostModel:
    """Chooses draft budgets per decode step (see the module docstring).

    Args:
        config: Limits and knobs.
    """

    def __init__(self, config: SpecConfig) -> None:
        self.config = config
        # Tree positions every verify step is padded to (static steps); None: each step's own width.
        self.fixed_width: int | None = None
        self.time = ForwardTime()  # plain decode steps: seconds vs rows
        # Verify steps: seconds over a plain step of the same rows, vs draft tokens. Fitting the
        # extra, not the whole step, keeps it valid when the plain step's cost moves (longer
        # contexts, another env's batch): the plain fit stays fresh, the extra rarely changes.
        self.verify_extra = ForwardTime()
        self.acceptance = Acceptance()
        self.lookup_s = 0.0  # running mean of one draft lookup (per row)
        self.probing = False  # the current step is a probe
        self._probe = 0  # draft tokens the current probe verifies
        self._idle_steps = 0  # decode steps since the last verified draft
        self._drafted_run = 0  # verify steps in a row (a control step ends a long run)
        self.controls = 0  # control steps taken (plain steps that keep the plain fit fresh)
        self.realized = RealizedCost()
        self._step_groups: set[str] = {""}  # the groups of the step being decided
        self._emitted: dict[str, tuple[int, int]] = {}  # the last verify step's rows and tokens per group
        # Per request group, steps between probes as a multiple of the base interval (1 .. 16):
        # doubles while a group's probes do not pay.
        # Per group, so that a stretch of one env's useless drafts does not delay the probes
        # that would find another env's drafts paying (measured: Retail batches backed the
        # interval off to 256 steps, most of the next Calculator batch).
        self._intervals: dict[str, int] = {}
        self._widths: dict[int, int] = {}  # batch -> cached optimistic width of ask()
        self._widths_age = 0
        # What lookups really yielded: decayed mean, over the steps that looked up, of the decode
        # seconds per row that choose()'s own pick is expected to save (a probe's forcing aside).
        self._yield: float | None = None

    def set_prior(self, points: Sequence[tuple[int, float]]) -> None:
        """Set the time fits' prior from ``(tokens, seconds)`` timings of forwards (at startup).

        The verify extra's prior is the forwards' cost per token, with no fixed part.
        """
        self.time.set_prior(points)
        _, per_token = self.time.coefficients()
        self.verify_extra.set_prior([(0, 0.0), (64, 64 * per_token)])

    def observe_step(self, batch: int, width: int, seconds: float) -> None:
        """Add a measured decode step of ``batch`` rows, ``width`` tokens each (1: plain decoding).

        ``width`` is what the forward ran, padding included.
        """
        if width <= 1:
            self.realized.observe_plain(self._step_groups, batch, seconds)
            self.time.observe(batch, seconds)
        else:
            if self._emitted:  # what each group's rows emitted, against a plain step of this size
                self.realized.observe_verify(self._emitted, batch, seconds + self.lookup_s * batch)
            self.verify_extra.observe(batch * (width - 1), seconds - self.time.predict(batch))
        self._emitted = {}

    def step_s(self, batch: int, width: int) -> float:
        """Predicted seconds of a decode step of ``batch`` rows: plain (``width`` 1) or verifying."""
        plain = self.time.predict(batch)
        if width <= 1:
            return plain
        if self.fixed_width is not None:  # padded: every verify step costs the full width
            width = self.fixed_width
        drafted = batch * (width - 1)
        if self.verify_extra.observed:
            return plain + self.verify_extra.predict(drafted)
        return plain + self.time.coefficients()[1] * drafted

    @property
    def runahead_unlimited(self) -> bool:
        """Whether ``spec.runahead_slowdown`` is at its "no limit" value.

        Then run-ahead rows are neither sized by the step fit nor closed by the engine's ledger.
        """
        return self.config.runahead_slowdown >= _NO_RUNAHEAD_LIMIT

    def spare_rows(self, live: int) -> int:
        """Run-ahead rows a decode step of ``live`` live rows can take within ``runahead_slowdown``.

        By the plain-step fit ``a + b * rows``: the most ``k`` with ``time(live + k) <= (1 + s) *
        time(live)``. With no live rows it is sized as for one: a live request that arrives while
        run-ahead rows step or prefill waits for them (on 2 CPU cores a run-ahead prefill of a
        Retail prompt takes tens of milliseconds), so run-ahead there too needs rows that are cheap.
        """
        slowdown = self.config.runahead_slowdown
        a, b = self.time.coefficients()
        if self.runahead_unlimited or b <= 0.0:
            return _UNLIMITED_ROWS
        base = max(live, 1)
        return int(slowdown * (a + b * base) / b)

    def max_width(self, batch: int) -> int:
        """Widest verify forward (1 + draft tokens per row) the limits allow for ``batch`` rows.

        With a fixed width: that width, or 1 (no drafts) when ``batch`` rows of it exceed
        ``max_batch_tokens``.
        """
        limit = self.config.max_batch_tokens // max(batch, 1)
        if self.fixed_width is not None:
            return self.fixed_width if self.fixed_width <= limit else 1
        return max(1, min(self.config.tree_slots, limit))

    def ask(self, caps: Sequence[int], groups: Sequence[str] | None = None) -> list[int]:
        """How many draft tokens to ask the draft source for, per row (0: do not ask).

        Asks only if drafts could pay at all (:meth:`_optimistic_width`) or to probe.

        Args:
            caps: Per row, the most draft tokens that can be used (tokens left minus one).
            groups: Per row, the request's ``draft_group`` (``None``: all in the shared group).

        Returns:
            Per-row budgets.
        """
        batch = len(caps)
        width = self.max_width(batch)
        self.probing = False
        row_groups = list(groups) if groups is not None else [""] * batch
        self._step_groups = set(row_groups)
        if width < 2 or not any(caps):
            return [0] * batch
        if not self.config.adaptive:
            return [min(c, width - 1) for c in caps]
        if self._drafted_run >= self.config.probe_interval:  # a control step: decode plainly, timed
            self._drafted_run = 0
            self.controls += 1
            self._idle_steps += 1
            return [0] * batch
        budget = self._optimistic_width(batch, width) - 1
        if budget and not self._lookups_pay(batch):
            budget = 0
        base = self._probe_interval(batch, width)
        if self._idle_steps >= base * min(self._intervals.get(g, 1) for g in set(groups or [""])):
            self.probing = True
            self._probe = self._probe_size(batch, width)
            # Look up whole drafts (a lookup costs little next to a verify step); choose() verifies
            # at least the probe, and more if the whole drafts pay. Asking for the probe's few nodes
            # only would trap the model where wide drafts pay but narrow ones do not (a verify step
            # has a fixed extra cost): choose() would then see only narrow drafts, judge that nothing
            # pays, the measured yield of lookups would stay ~0, and drafting would never resume.
            budget = width - 1
        budgets = [min(c, budget) for c in caps]
        if not self.probing:  # groups whose verify steps really cost more per token: plain rows
            losing = {g for g in self._step_groups if self.realized.losing(g)}
            if losing:
                budgets = [0 if g in losing else b for b, g in zip(budgets, row_groups, strict=True)]
        if not any(budgets):
            self._idle_steps += 1
        return budgets

    def _lookups_pay(self, batch: int) -> bool:
        """Whether looking up drafts pays for the lookups, judged by what recent ones yielded.

        The optimistic width assumes drafts the source is sure of; a source whose drafts are mostly
        too uncertain to verify (a cache that knows little about the current states) would still be
        asked every step, at a lookup cost per row. Each lookup step's yield is the decode time its
        pick saves per row (:meth:`choose`): the plain-decoding time of the tokens the verify step
        is expected to emit, minus the verify step's own time, over the batch. Ask iff recent
        yields exceed what a lookup costs per row. So everything a drafted step costs counts: the
        lookup, the verify step's extra time, and drafts that are not accepted. (Measured on the
        quickstart before this rule, which compared the accepted tokens' worth with the lookups
        alone: verify steps emitted 25% more tokens per second than plain ones, and the lookups,
        ~1.1 ms a step at 28 rows, took that back.) Probes keep measuring while asking is off.
        """
        if self._yield is None:
            return True  # nothing measured yet: be optimistic
        return self._yield > self.lookup_s

    def _optimistic_width(self, batch: int, width: int) -> int:
        """Best width if every row had a chain of nodes its source is sure of (``q = 1``).

        A node at depth ``d`` is then accepted with the best calibrated rate seen at that depth,
        capped by the value at ``d - 1`` (a node is only accepted after its parent). Lookup cost
        counts. Cached per batch size until the next verify step (or 16 steps: the time fit drifts).
        """
        self._widths_age += 1
        if self._widths_age > 16:
            self._widths.clear()
            self._widths_age = 0
        cached = self._widths.get(batch)
        if cached is not None:
            return min(cached, width)
        best_width, best = 1, batch / self.step_s(batch, 1)
        value, expected = 1.0, float(batch)
        for w in range(2, width + 1):
            value = min(value, self.acceptance.best_rate(w - 1))
            expected += batch * value
            score = expected / (self.step_s(batch, w) + self.lookup_s * batch)
            if score > best * (1 + 1e-9):
                best_width, best = w, score
        self._widths[batch] = best_width
        return best_width

    def _probe_interval(self, batch: int, width: int) -> int:
        """Steps between probes of a group whose probes pay (the base interval).

        At least ``probe_interval``, and enough that the fixed extra of the smallest probe stays
        within ``probe_overhead`` of decode time. On a CPU a verify step of one draft node costs
        ~2x a plain one: a probe every 16 steps would then cost ~6% of decode time however small it
        is (measured on Retail, whose drafts rarely pay there); the overhead budget spaces them out.
        """
        base = self.config.probe_interval
        if width < 2:
            return base
        plain = self.step_s(batch, 1)
        extra = max(0.0, self.step_s(batch, 2) - plain)
        if extra <= 0.0:
            return base
        room = self.config.probe_overhead * plain
        if room <= 0.0:
            return 16 * base
        return max(base, min(16 * base, math.ceil(extra / room)))

    def _probe_size(self, batch: int, width: int) -> int:
        """Largest probe whose extra forward time stays within the probe overhead budget (>= 1)."""
        plain = self.step_s(batch, 1)
        allowed = self.config.probe_overhead * self._probe_interval(batch, width) * plain
        allowed -= max(0.0, self.step_s(batch, 1 + 1) - plain)  # the first node, fixed extra included
        per_token = max(0.0, self.step_s(batch, 3) - self.step_s(batch, 2)) / batch
        return max(1, min(width - 1, 1 + math.floor(allowed / (per_token * batch + 1e-12))))

    def rank(self, draft: DraftTree, group: str = "") -> Ranked:
        """Order a draft's nodes by worth (draft probability), each with its expected acceptance.

        A node's probability is capped by its ancestors' (a path probability cannot grow), so
        sorting by it, then depth, keeps every ancestor before its descendants. Its expected
        acceptance is the calibrated probability, capped by its parent's (accepted only after it).
        ``group`` is the request's ``draft_group``: calibration is kept per group.
        """
        return self._rank_all([draft], [group])[0]

    def _rank_all(self, drafts: Sequence[DraftTree], groups: Sequence[str]) -> list[Ranked]:
        """:meth:`rank` of every row's draft (one native call for all of them when built)."""
        if native.core is None:
            return [self._rank_one(d, g) for d, g in zip(drafts, groups, strict=True)]
        rates = self.acceptance.rates
        per_row = [rates(_calibration_key(d, g), len(d)) for d, g in zip(drafts, groups, strict=True)]
        return [Ranked(order, values) for order, values in native.core.rank_many(drafts, per_row)]

    def _rank_one(self, draft: DraftTree, group: str) -> Ranked:
        """:meth:`rank` in Python (the native core's reference)."""
        rate, key = self.acceptance.rate, _calibration_key(draft, group)
        q, depth = _node_stats(draft)
        values: list[float] = []
        # Whether the nodes already come in rank order (the tree cache's best-first drafts do):
        # then no sort is needed (this runs for every row of every drafted step).
        ranked, last_q, last_d = True, 2.0, 0
        for j, parent in enumerate(draft.parents):
            v = min(1.0, rate(key, depth[j]) * q[j])
            values.append(min(v, values[parent]) if parent >= 0 else v)
            if q[j] > last_q or (q[j] == last_q and depth[j] < last_d):
                ranked = False
            last_q, last_d = q[j], depth[j]
        n = len(values)
        if ranked:
            return Ranked(tuple(range(n)), tuple(values))
        order = sorted(range(n), key=lambda j: (-q[j], depth[j], j))
        return Ranked(tuple(order), tuple(values[j] for j in order))

    def choose(self, drafts: Sequence[DraftTree], groups: Sequence[str] | None = None) -> list[DraftTree]:
        """Trim the drafts to the nodes worth verifying this step (one common width).

        Args:
            drafts: Per row, the draft the source returned (within the asked budget).
            groups: Per row, the request's ``draft_group`` (``None``: all in the shared group).

        Returns:
            Per row, the draft to verify (possibly empty); all empty means decode plainly.
        """
        batch = len(drafts)
        width = min(self.max_width(batch), 1 + max((len(d) for d in drafts), default=0))
        if width < 2:
            chosen = [EMPTY_DRAFT] * batch
        elif not self.config.adaptive:  # the drafts are within the asked budgets: verify them whole
            chosen = list(drafts)
        else:
            ranked = self._rank_all(drafts, groups or [""] * batch)
            best_width, best = 1, batch / self.step_s(batch, 1)
            expected = float(batch)
            for w in range(2, width + 1):
                expected += sum(r.values[w - 2] for r in ranked if len(r.values) >= w - 1)
                score = expected / self.step_s(batch, w)
                if score > best * (1 + 1e-9):
                    best_width, best = w, score
            gain = 0.0  # seconds saved per row against plain decoding (0: nothing worth verifying)
            if best_width > 1:
                plain = self.step_s(batch, 1)
                tokens = batch + sum(sum(r.values[: best_width - 1]) for r in ranked)
                gain = (tokens * plain / batch - self.step_s(batch, best_width)) / batch
            self._yield = (
                gain if self._yield is None else _YIELD_DECAY * self._yield + (1 - _YIELD_DECAY) * gain
            )
            if self.probing:  # verify at least the probe: it exists to measure what does not pay yet
                best_width = max(best_width, min(width, 1 + self._probe))
            chosen = [subtree(d, r.order[: best_width - 1]) for d, r in zip(drafts, ranked, strict=True)]
        drafted = any(chosen)
        self._idle_steps = 0 if drafted else self._idle_steps + 1
        self._drafted_run = self._drafted_run + 1 if drafted else 0
        return chosen

    def observe_lookup(self, seconds_per_row: float) -> None:
        """Add a measured draft lookup time (seconds per asked row)."""
        self.lookup_s = 0.9 * self.lookup_s + 0.1 * seconds_per_row

    def observe_verify(
        self,
        drafts: Sequence[DraftTree],
        accepted: Sequence[Sequence[int]],
        groups: Sequence[str] | None = None,
    ) -> None:
        """Update the acceptance calibration with one verify step.

        A probe that did not pay for itself doubles its groups' interval to the next one (up to 16
        times the base one, :meth:`_probe_interval`), so drafts that never pay cost less and less. A
        group's share of a verify step paid when its rows accepted, per row, at least the step's
        predicted extra time in plain steps (each accepted token saves ``1 / batch`` of a plain
        step); then its interval goes back to the base. An occasional accepted token no longer keeps
        probes frequent where verifying costs more than it saves (measured: Retail on 2 CPU cores).

        Args:
            drafts: The verified drafts (as returned by :meth:`choose`).
            accepted: Per row, the accepted node indices.
            groups: Per row, the request's ``draft_group`` (``None``: all in the shared group).
        """
        emitted: dict[str, tuple[int, int]] = {}  # per group: rows, tokens (accepted nodes, then one)
        for path, group in zip(accepted, groups or [""] * len(accepted), strict=True):
            rows_g, tokens = emitted.get(group, (0, 0))
            emitted[group] = (rows_g + 1, tokens + len(path) + 1)
        self._emitted = emitted
        observations: list[tuple[str, int, int, float, int]] = []
        rows: dict[str, int] = {}  # per group: rows in the step
        taken_by: dict[str, int] = {}  # per group that verified a draft: accepted nodes
        for draft, path, group in zip(drafts, accepted, groups or [""] * len(drafts), strict=True):
            rows[group] = rows.get(group, 0) + 1
            if not draft:
                continue
            key = _calibration_key(draft, group)
            observations += [(key, *sums) for sums in _depth_sums(draft, path)]
            taken_by[group] = taken_by.get(group, 0) + len(path)
        self.acceptance.observe(observations)
        self._widths.clear()
        batch = len(drafts)
        width = 1 + max((len(d) for d in drafts), default=0)
        plain = self.step_s(batch, 1)
        extra = max(0.0, self.step_s(batch, width) - plain)
        for group, taken_nodes in taken_by.items():
            if taken_nodes and taken_nodes * plain >= extra * rows[group]:
                self._intervals[group] = 1
            elif self.probing:
                self._intervals[group] = min(2 * self._intervals.get(group, 1), 16)


def _calibration_key(draft: DraftTree, group: str) -> str:
    """The acceptance cell family of a draft: its calibration class, within its request's group."""
    return f"{group}|{draft.calibration}" if group else draft.calibration


def _depth_sums(draft: DraftTree, accepted: Sequence[int]) -> list[tuple[int, int, float, int]]:
    """Per depth of a verified draft (ascending): ``(depth, nodes, sum of their q, accepted)``."""
    if native.core is not None:
        sums: list[tuple[int, int, float, int]] = native.core.depth_sums(draft.probs, draft.parents, accepted)
        return sums
    q, depth = _node_stats(draft)
    taken = set(accepted)
    deepest = max(depth, default=0)
    nodes, hits = [0] * (deepest + 1), [0] * (deepest + 1)
    mass = [0.0] * (deepest + 1)
    for j, d in enumerate(depth):
        nodes[d] += 1
        mass[d] += q[j]
        hits[d] += j in taken
    return [(d, nodes[d], mass[d], hits[d]) for d in range(1, deepest + 1) if nodes[d]]


def _node_stats(draft: DraftTree) -> tuple[list[float], list[int]]:
    """Per node: its probability capped by its ancestors' (clipped to [0, 1]), and its depth."""
    q: list[float] = []
    depth: list[int] = []
    for p, parent in zip(draft.probs, draft.parents, strict=True):
        value = max(0.0, min(1.0, p))
        q.append(min(value, q[parent]) if parent >= 0 else value)
        depth.append(depth[parent] + 1 if parent >= 0 else 1)
    return q, depth
