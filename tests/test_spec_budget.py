"""The speculation cost model: forward-time fit, acceptance calibration, draft budgets and probes."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from srt_agent.contracts.draft import DraftTree
from srt_agent.engine.speculation.acceptance import Acceptance
from srt_agent.engine.speculation.budget import CostModel, subtree
from srt_agent.engine.speculation.forward_time import ForwardTime
from srt_agent.engine.speculation.spec_config import SpecConfig


def _chain(n: int, prob: float = 1.0, source: str = "exact") -> DraftTree:
    return DraftTree(tuple(range(n)), tuple(range(-1, n - 1)), (prob,) * n, source)  # type: ignore[arg-type]


def _model(per_forward: float, per_token: float, **config: object) -> CostModel:
    model = CostModel(SpecConfig(**config))  # type: ignore[arg-type]
    model.set_prior([(1, per_forward + per_token), (64, per_forward + 64 * per_token)])
    return model


def test_forward_time_fit_follows_observations() -> None:
    time = ForwardTime()
    time.set_prior([(1, 1.0), (64, 1.0)])  # a flat prior...
    for _ in range(200):
        for n in (4, 16, 40):
            time.observe(n, 0.002 + 0.0001 * n)  # ...overridden by what the forwards really cost
    a, b = time.coefficients()
    assert a == pytest.approx(0.002, rel=0.1) and b == pytest.approx(0.0001, rel=0.1)


def test_forward_time_slope_comes_from_the_prior_when_all_forwards_have_one_size() -> None:
    time = ForwardTime()
    time.set_prior([(1, 0.001), (65, 0.002)])
    for _ in range(100):
        time.observe(8, 0.003)  # a slower machine than at startup, one batch size
    assert time.predict(8) == pytest.approx(0.003, rel=0.05)
    assert time.coefficients()[1] > 0  # the prior keeps the slope defined


def test_a_verify_steps_fixed_extra_cost_keeps_narrow_unsure_drafts_out() -> None:
    """Verify steps get their own time fit: a fixed extra per verify step (tree mask, draws, walk)
    is not spread over the tokens of a line through decode and verify steps alike."""
    model = _model(per_forward=0.01, per_token=0.0001)
    for _ in range(50):
        model.observe_step(16, 1, 0.01)
    drafts = [_chain(1, prob=0.3)] * 16  # 0.3 expected tokens per row
    assert all(model.choose(drafts))  # verify steps predicted by the decode fit: 20.8 tokens in 0.0116 s pay
    for _ in range(50):
        model.observe_step(16, 5, 0.02)  # measured: a verify step costs 2x a decode step
    assert model.step_s(16, 2) == pytest.approx(0.02 - 0.0001 * 16 * 3, rel=0.05)
    assert not any(model.choose(drafts))  # 20.8 tokens in ~0.015 s do not beat 16 in 0.01 s
    assert all(model.choose([_chain(4, prob=1.0)] * 16))  # sure drafts still pay


def test_acceptance_calibrates_the_drafts_probabilities() -> None:
    acc = Acceptance()
    assert acc.rate("exact", 1) == 1.0  # no data: trust the draft's probabilities
    for _ in range(3):
        acc.observe([("global", 1, 1, 1.0, 0), ("global", 2, 1, 1.0, 0)])  # confident, always wrong
        acc.observe([("exact", 1, 1, 0.01, 1)])  # humble, always right
    assert acc.rate("global", 1) < 0.05 and acc.rate("global", 2) < 0.05
    assert min(1.0, acc.rate("exact", 1) * 0.01) > 0.9
    assert acc.best_rate(1) > 0.9  # the best source at depth 1
    assert acc.best_rate(2) == 1.0  # "exact" was never verified at depth 2: still optimistic


def test_back_off_drafts_are_calibrated_apart_from_their_source() -> None:
    model = _model(0.01, 0.0001)
    sure = _chain(3, source="task")
    loose = DraftTree(sure.token_ids, sure.parents, sure.probs, "task", backoff=True)
    for _ in range(5):  # the back-off drafts are always rejected
        model.observe_verify([loose], [()])
    assert loose.calibration == "task-backoff" and sure.calibration == "task"
    assert max(model.rank(loose).values) < 0.05  # learnt: they do not pay
    assert model.rank(sure).values[0] == 1.0  # full-suffix task drafts keep their own calibration
    assert subtree(loose, [0]).backoff


def test_acceptance_is_calibrated_per_request_group() -> None:
    model = _model(0.01, 0.0001)
    drafts = [_chain(3), _chain(3)]
    for _ in range(5):  # the same source's drafts: always rejected in one env, always taken in the other
        model.observe_verify(drafts, [(), (0, 1, 2)], ["srt/Retail-v0", "srt/Calculator-v0"])
    assert max(model.rank(drafts[0], "srt/Retail-v0").values) < 0.05
    assert model.rank(drafts[1], "srt/Calculator-v0").values == (1.0, 1.0, 1.0)
    assert model.rank(drafts[1], "").values == (1.0, 1.0, 1.0)  # the shared group saw nothing yet
    chosen = model.choose(drafts, ["srt/Retail-v0", "srt/Calculator-v0"])
    assert len(chosen[1]) == 3  # the Calculator row keeps its draft


def test_probe_back_off_is_per_request_group() -> None:
    model = _model(per_forward=0.001, per_token=0.0001, probe_interval=4, probe_overhead=0.1)
    retail = ["srt/Retail-v0"]
    for _ in range(3):
        model.observe_verify([_chain(8)], [()], retail)
    gaps, idle = [], 0
    for _ in range(100):  # Retail's probes find nothing: they back off
        if model.ask([20], retail)[0] and model.probing:
            gaps.append(idle)
            idle = 0
            model.observe_verify(model.choose([_chain(8)], retail), [()], retail)
        else:
            idle += 1
    assert gaps[-1] >= 16
    calculator = ["srt/Calculator-v0"]
    steps = 0
    while not (model.ask([20], calculator)[0] and model.probing):
        steps += 1
    assert steps <= 4  # a Calculator batch is probed at the base interval, not Retail's


def test_cheap_tokens_draft_the_maximum_and_expensive_ones_nothing() -> None:
    flat = _model(per_forward=0.01, per_token=0.0)
    assert flat.ask([20, 3, 0]) == [8, 3, 0]  # capped by max_draft_tokens and tokens left
    steep = _model(per_forward=0.0, per_token=0.001)  # time proportional to tokens: drafts cannot pay
    assert steep.ask([20, 20]) == [0, 0]


def test_batch_token_budget_limits_the_width() -> None:
    model = _model(per_forward=0.01, per_token=0.0, max_batch_tokens=64)
    assert model.max_width(16) == 4
    assert model.ask([20] * 16) == [3] * 16
    assert model.ask([20] * 40) == [0] * 40  # 64 tokens cannot hold 40 rows of 2


def test_useless_drafts_are_dropped_then_probed_within_the_overhead_budget() -> None:
    model = _model(per_forward=0.001, per_token=0.0001, probe_interval=4, probe_overhead=0.05)
    budgets = model.ask([20])
    assert budgets == [8]
    for _ in range(3):  # drafts the source is sure of, never accepted
        drafts = model.choose([_chain(model.ask([20])[0] or 1)])
        model.observe_verify(drafts, [()])
    assert model.ask([20]) == [0]  # no longer pays
    idle = [model.ask([20]) for _ in range(3)]
    assert idle == [[0]] * 3 and not model.probing
    probe = model.ask([20])  # the probe_interval-th idle step
    assert model.probing
    assert probe == [8]  # a probe looks up whole drafts...
    # ...and verifies k tokens: k * 0.0001 s extra, within 5% of 4 plain steps (4 * 0.0011 s).
    assert [len(d) for d in model.choose([_chain(8)])] == [2]
    model.observe_verify([_chain(2)], [(0, 1)])  # ...and this time they were accepted
    assert model.ask([20])[0] > 0 and not model.probing  # drafting resumes


def test_a_probe_with_whole_drafts_resumes_drafting_where_only_wide_drafts_pay() -> None:
    """A verify step's fixed extra makes narrow drafts lose and wide sure ones win: once lookups
    stopped, a probe must offer choose() whole drafts, or it would never see them pay."""
    model = _model(per_forward=0.01, per_token=0.00001, probe_interval=4)  # a GPU: tokens are cheap
    for _ in range(50):
        model.observe_step(16, 1, 0.01)
        model.observe_step(16, 2, 0.019)  # but a verify step has a fixed extra
        model.observe_step(16, 9, 0.0201)
    for _ in range(30):  # only narrow, unsure drafts came back: nothing paid, lookups stopped
        assert not any(model.choose([_chain(1, prob=0.5)] * 16))
    for _ in range(64):  # idle long enough (the fixed extra spaces probes out): a probe
        budgets = model.ask([20] * 16)
        if model.probing:
            break
    assert model.probing and budgets == [8] * 16  # it looks up whole drafts
    chosen = model.choose([_chain(8)] * 16)  # the cache now knows the states: 8 sure nodes per row
    assert [len(d) for d in chosen] == [8] * 16  # verified whole, not just the probe's few nodes
    model.observe_verify(chosen, [tuple(range(8))] * 16)
    assert model.ask([20] * 16) == [8] * 16 and not model.probing  # drafting resumed


def test_probes_that_find_nothing_back_off() -> None:
    model = _model(per_forward=0.001, per_token=0.0001, probe_interval=4, probe_overhead=0.1)
    for _ in range(3):
        model.observe_verify([_chain(8)], [()])
    gaps, idle = [], 0
    for _ in range(200):
        if model.ask([20])[0] and model.probing:
            gaps.append(idle)
            idle = 0
            model.observe_verify(model.choose([_chain(8)]), [()])
        else:
            idle += 1
    assert gaps[:5] == [4, 8, 16, 32, 64]  # doubling, up to 16 times the configured interval


def test_choose_keeps_the_most_likely_nodes_at_one_width() -> None:
    # Row 0: root children 10 (q .9) and 11 (q .05); 12 under 10 (q .8); 13 under 12 (q .1).
    tree = DraftTree((10, 11, 12, 13), (-1, -1, 0, 2), (0.9, 0.05, 0.8, 0.1), "exact")
    model = _model(per_forward=0.001, per_token=0.00003)
    chosen = model.choose([tree, _chain(0)])
    # Widths 2, 3 add 0.9 and 0.8 expected tokens for 2 extra tokens' time each (0.06 ms); the next
    # nodes add 0.1 and 0.05, less than what they cost relative to the step.
    assert chosen[0] == DraftTree((10, 12), (-1, 0), (0.9, 0.8), "exact")
    assert len(chosen[1]) == 0


def test_not_adaptive_verifies_the_drafts_whole() -> None:
    model = CostModel(SpecConfig(adaptive=False, max_draft_tokens=4))
    assert model.ask([10, 2, 0]) == [4, 2, 0]
    drafts = [_chain(4, prob=0.0), _chain(2, prob=0.0), _chain(0)]
    assert model.choose(drafts) == drafts


def test_subtree_reindexes_and_requires_ancestors() -> None:
    tree = DraftTree((1, 2, 3, 4), (-1, 0, -1, 1), (0.5, 0.4, 0.3, 0.2), "task", (True, False, True, False))
    sub = subtree(tree, [3, 0, 1])
    assert sub == DraftTree((1, 2, 4), (-1, 0, 1), (0.5, 0.4, 0.2), "task", (True, False, False))
    with pytest.raises(ValueError, match="parent"):
        subtree(tree, [0, 3])


def _probe_gaps(accepted: Sequence[Sequence[int]], **config: object) -> list[int]:
    """Idle steps before each probe of a 16-row batch on a CPU-like machine (a one-node verify step
    costs a plain step more) whose probes accept ``accepted`` (per row) every time."""
    model = _model(per_forward=0.001, per_token=0.0001, **config)
    for _ in range(50):
        model.observe_step(16, 1, 0.004)
        model.observe_step(16, 2, 0.008)  # the fixed extra of a verify step: one plain step
        model.observe_step(16, 9, 0.0085)
    for _ in range(3):  # drafts stop paying
        model.observe_verify([_chain(8)] * 16, [()] * 16)
    gaps, idle = [], 0
    for _ in range(400):
        if model.ask([20] * 16)[0] and model.probing:
            gaps.append(idle)
            idle = 0
            model.observe_verify(model.choose([_chain(8)] * 16), accepted)
        else:
            idle += 1
    return gaps


def test_probes_are_spaced_so_a_verify_steps_fixed_extra_stays_within_the_overhead() -> None:
    """On a CPU a verify step of one node costs ~2x a plain one: probing every 16 steps would cost
    ~6% of decode time however small the probe; the interval grows to keep it at probe_overhead."""
    # 0.004 s extra over 2% of 0.004 s per plain step: 50 steps, then doubling (up to 16x).
    assert _probe_gaps([()] * 16)[:3] == [50, 100, 200]


def test_a_probe_that_accepts_too_little_to_pay_still_backs_off() -> None:
    # One row in 16 accepts a token: 1/16 of a plain step saved for a plain step spent.
    gaps = _probe_gaps([(0,)] + [()] * 15, probe_interval=4, probe_overhead=0.1)
    assert len(gaps) >= 3 and gaps[2] > gaps[1] > gaps[0]


def test_lookups_stop_when_what_verifying_saves_does_not_cover_them() -> None:
    """Everything a drafted step costs counts: the lookup, the verify step's extra, rejections."""
    model = _model(per_forward=0.001, per_token=0.0001)
    for _ in range(50):
        model.observe_step(16, 1, 0.004)
        model.observe_step(16, 3, 0.008)  # a verify step costs twice a plain one
        model.observe_step(16, 9, 0.0082)
    for _ in range(50):
        model.observe_lookup(0.00005)  # 50 us per row: 0.8 ms for the batch
    # Drafts the calibration trusts to give ~1.1 tokens per row: verifying beats plain decoding
    # (34 tokens in ~8 ms against 16 in 4 ms), but saves only ~0.5 ms of the batch's decode time.
    drafts = [_chain(2, prob=0.56)] * 16
    assert model.ask([20] * 16)[0] > 0
    chosen = model.choose(drafts)
    assert all(len(d) == 2 for d in chosen)  # worth verifying once looked up...
    assert model.ask([20] * 16) == [0] * 16 and not model.probing  # ...but not worth looking up


def test_rank_equals_sorting_by_probability_then_depth() -> None:
    """rank() skips the sort when a draft already comes in rank order (the tree cache's do)."""
    import random

    from spec_drafters import random_tree

    from srt_agent.engine.speculation.budget import _node_stats
    from srt_agent.tree_cache import TreeCache

    def reference(model: CostModel, draft: DraftTree, group: str) -> tuple[tuple[int, ...], list[float]]:
        q, depth = _node_stats(draft)
        key = f"{group}|{draft.calibration}" if group else draft.calibration
        values: list[float] = []
        for j, parent in enumerate(draft.parents):
            v = min(1.0, model.acceptance.rate(key, depth[j]) * q[j])
            values.append(min(v, values[parent]) if parent >= 0 else v)
        order = tuple(sorted(range(len(draft)), key=lambda j: (-q[j], depth[j], j)))
        return order, [values[j] for j in order]

    rng = random.Random(3)
    model = _model(per_forward=0.001, per_token=0.0001)
    model.observe_verify([_chain(4, prob=0.8)] * 4, [(0, 1), (0,), (), (0, 1, 2)])
    cache = TreeCache()
    for _ in range(40):
        cache.insert("s", "T", [rng.randrange(4) for _ in range(6)])
    drafts = [cache.draft("s", "T", [], [], 12)]
    for _ in range(200):
        tokens, parents = random_tree(rng, 6, rng.randrange(1, 10))
        probs = tuple(rng.choice((0.3, 0.5, 0.5, 0.9, 1.2, -0.1)) for _ in tokens)
        drafts.append(DraftTree(tuple(tokens), tuple(parents), probs, "task"))
    for draft in drafts:
        got = model.rank(draft, "g")
        order, values = reference(model, draft, "g")
        assert got.order == order and list(got.values) == values


def test_a_fixed_verify_width_prices_every_verify_step_at_that_width() -> None:
    """Static steps pad every verify step to one width: a narrow draft costs what a full one does,
    so the model verifies whatever is worth anything up to it, and a batch whose full-width step
    exceeds max_batch_tokens decodes plainly (the batch-size threshold)."""
    model = _model(per_forward=0.001, per_token=0.00003, max_draft_tokens=8)
    model.fixed_width = 9
    assert model.step_s(16, 2) == model.step_s(16, 9) > model.step_s(16, 1)
    # The tree of test_choose_keeps_the_most_likely_nodes_at_one_width: at a fixed width its
    # unlikely nodes ride along for free (they were trimmed when narrower steps were cheaper).
    tree = DraftTree((10, 11, 12, 13), (-1, -1, 0, 2), (0.9, 0.05, 0.8, 0.1), "exact")
    assert len(model.choose([tree, _chain(0)])[0]) == 4
    assert model.max_width(113) == 9 and model.max_width(114) == 1  # 1024 // 9 = 113 rows
    assert model.ask([20] * 114) == [0] * 114
    model.observe_step(16, 9, 0.004)  # measured at the padded width
    assert model.verify_extra.observed


def test_a_long_run_of_verify_steps_is_broken_by_one_timed_plain_step() -> None:
    """Control steps: the plain fit is re-measured even while every step would verify."""
    model = _model(per_forward=0.01, per_token=0.0, probe_interval=4)
    asked = []
    for _ in range(10):
        budgets = model.ask([20] * 4)
        asked.append(any(budgets))
        if any(budgets):
            model.choose([_chain(b, prob=1.0) for b in budgets])
    # Four drafted steps, one plain (the control), four drafted, one plain.
    assert asked == [True] * 4 + [False] + [True] * 4 + [False] and model.controls == 2


def test_realized_cost_stops_drafting_for_the_group_whose_verify_steps_lose() -> None:
    """Whatever the fits predict: a group whose verify steps gain less over plain steps of the same
    batch size than they cost is not asked for drafts (probes aside); another group drafts on."""
    from srt_agent.engine.speculation.realized import RealizedCost

    realized = RealizedCost()
    for _ in range(5):
        realized.observe_plain(["retail", "calc"], 16, 0.004)
        realized.observe_plain(["retail", "calc"], 1, 0.001)  # another size: its own bucket
        # A verify step of 16 rows costs 2 plain ones: 1.6 tokens a row lose, 4 tokens a row win.
        realized.observe_verify({"retail": (16, 26)}, 16, 0.008)
        realized.observe_verify({"calc": (16, 64)}, 16, 0.008)
    assert realized.speedup("retail") == pytest.approx(0.8125) and realized.losing("retail")
    assert realized.speedup("calc") == pytest.approx(2.0) and not realized.losing("calc")
    assert not realized.losing("new") and realized.speedup("new") is None

    model = _model(per_forward=0.001, per_token=0.00001, probe_interval=1000)
    groups = ["retail"] * 8 + ["calc"] * 8
    for _ in range(5):  # the steps as the engine reports them: verify outcome, then its time
        model.ask([20] * 16, groups)
        model.observe_step(16, 1, 0.004)
        model.ask([20] * 16, groups)
        model.observe_verify([_chain(4)] * 16, [(0,)] * 8 + [(0, 1, 2)] * 8, groups)
        model.observe_step(16, 5, 0.008)  # 2 plain steps: retail's 2 tokens a row lose, calc's 4 win
    assert model.realized.losing("retail") and not model.realized.losing("calc")
    budgets = model.ask([20] * 16, groups)
    assert budgets[:8] == [0] * 8 and all(b > 0 for b in budgets[8:])
