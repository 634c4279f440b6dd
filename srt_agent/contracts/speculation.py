"""Speculation counters as one immutable snapshot: what every engine reports and callers add up.

Engines keep their own mutable counters (TorchEngine's are
:class:`~srt_agent.engine.speculation.stats.SpecCounters`); what crosses to the rollout scheduler,
the trainer and the benchmarks is a :class:`SpecStats`, through :meth:`Engine.spec_stats
<srt_agent.contracts.generation.Engine.spec_stats>`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class SpecStats:
    """A snapshot of the engine's speculation counters (since start or the last reset).

    A *row step* is one sequence taking part in one forward (a prefill or decode/verify forward),
    which is what :attr:`GenerationOutput.forward_passes` sums; tokens per row step is therefore
    the speculation gain, 1.0 for plain decoding whatever the batch size.

    Attributes:
        target_forwards: Decode-phase forwards of the target model (plain decode and verify).
        verify_forwards: Of those, forwards that verified at least one draft token.
        prefill_forwards: Prefill forwards (each samples the first token of its sequences).
        prefill_rows: Rows those prefilled (sequences; a forward takes several).
        prefill_tokens: Prompt tokens those computed (a reused prefix's are copied, not counted).
        row_steps: Sequence-forwards, prefill rows included.
        tokens: Tokens emitted (committed to outputs).
        runahead_tokens: Of those, tokens emitted by run-ahead sequences (only the draft source sees them).
        drafted_row_steps: Row steps that verified a non-empty draft.
        nodes_drafted: Draft tokens verified.
        nodes_accepted: Draft tokens accepted by the verification rule.
        runahead_nodes_accepted: Accepted draft tokens whose counts came only from run-ahead work.
        acceptance_histogram: Entry ``k``: drafted row steps that accepted ``k`` draft tokens.
        drafts_by_source: Non-empty drafts verified, by :attr:`DraftTree.source`.
        empty_drafts: Draft lookups that returned nothing to verify.
        probes: Verify steps forced by the cost model to re-measure acceptance.
        preempted: Run-ahead sequences that gave their row to live ones.
        draft_errors: Draft-source calls that raised (logged; the step went on without).
        draft_s: Time in draft lookups.
        forward_s: Time in decode-phase forwards.
        verify_s: Time drawing target tokens and walking the trees.
        prefill_s: Time in prefill forwards (their first token's draw included).
        idle_s: Time the engine waited with nothing to run (every sequence was with its
            caller: env steps, tokenization, the driver's own work).
        step_s: Time in engine steps (prefill and decode phases; graph captures excluded).
        device_s: Of ``step_s``, time launching static steps and waiting for their
            results (on a CPU, their whole forward); ``step_s - device_s`` is the
            host's own work when every step is static (``cuda_graphs``).
        decode_step_s: Time in plain decode steps (one token per row; graph captures excluded).
        verify_step_s: Time in verify steps (a drafted tree per row: the forward, the draws and
            the walk; graph captures excluded). With ``decode_step_s``, what one verify step
            costs in decode steps.
        decode_device_s: Of ``decode_step_s``, the device's share (as ``device_s``).
        verify_device_s: Of ``verify_step_s``, the device's share.
        prefill_device_s: Of ``prefill_s``, the device's share (static prefills only).
    """

    target_forwards: int = 0
    verify_forwards: int = 0
    prefill_forwards: int = 0
    prefill_rows: int = 0
    prefill_tokens: int = 0
    row_steps: int = 0
    tokens: int = 0
    runahead_tokens: int = 0
    drafted_row_steps: int = 0
    nodes_drafted: int = 0
    nodes_accepted: int = 0
    runahead_nodes_accepted: int = 0
    acceptance_histogram: tuple[int, ...] = ()
    drafts_by_source: Mapping[str, int] = field(default_factory=dict)
    empty_drafts: int = 0
    probes: int = 0
    preempted: int = 0
    draft_errors: int = 0
    draft_s: float = 0.0
    forward_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    idle_s: float = 0.0
    step_s: float = 0.0
    device_s: float = 0.0
    decode_step_s: float = 0.0
    verify_step_s: float = 0.0
    decode_device_s: float = 0.0
    verify_device_s: float = 0.0
    prefill_device_s: float = 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens emitted per row step (1.0 without speculation)."""
        return self.tokens / self.row_steps if self.row_steps else 0.0

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per drafted row step (each such step emits this plus one)."""
        return self.nodes_accepted / self.drafted_row_steps if self.drafted_row_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Fraction of verified draft tokens that were accepted."""
        return self.nodes_accepted / self.nodes_drafted if self.nodes_drafted else 0.0


def _combine(a: SpecStats, b: SpecStats, sign: int) -> SpecStats:
    """``a + b`` (``sign`` 1) or ``a - b`` (``sign`` -1), counter by counter.

    Zero counts are left out of ``drafts_by_source`` and trailing zeros off the histogram, so a
    difference of two snapshots lists only what happened in between.
    """
    # Every integer counter and every time (annotations are strings: ``from __future__ import annotations``).
    ints = {
        f.name: getattr(a, f.name) + sign * getattr(b, f.name) for f in fields(SpecStats) if f.type == "int"
    }
    seconds = {
        f.name: getattr(a, f.name) + sign * getattr(b, f.name) for f in fields(SpecStats) if f.type == "float"
    }
    hist = [0] * max(len(a.acceptance_histogram), len(b.acceptance_histogram))
    for k, n in enumerate(a.acceptance_histogram):
        hist[k] += n
    for k, n in enumerate(b.acceptance_histogram):
        hist[k] += sign * n
    while hist and hist[-1] == 0:
        hist.pop()
    sources = Counter(a.drafts_by_source)
    for s, n in b.drafts_by_source.items():
        sources[s] += sign * n
    return SpecStats(
        **ints,
        acceptance_histogram=tuple(hist),
        drafts_by_source={s: n for s, n in sources.items() if n},
        **seconds,
    )


def spec_delta(after: SpecStats, before: SpecStats) -> SpecStats:
    """The speculation counters accumulated between two snapshots of the same engine."""
    return _combine(after, before, -1)


def spec_sum(stats: Sequence[SpecStats]) -> SpecStats:
    """The counters of several engines (replicas) added up."""
    out = SpecStats()
    for s in stats:
        out = _combine(out, s, 1)
    return out
