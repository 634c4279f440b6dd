"""Policy loss, value loss and loss aggregation on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from srt_agent.algo import Aggregation, policy_loss, value_loss

# Four generated tokens and one masked one (whose huge ratio must not show anywhere).
RATIOS = [1.5, 0.5, 0.5, 1.1, math.exp(5.0)]
ADV = torch.tensor([[1.0, -1.0, 2.0, -1.0, 10.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]])


def _logprobs(ratios: list[float]) -> torch.Tensor:
    return (OLD + torch.log(torch.tensor([ratios]))).requires_grad_(True)


def test_ppo_clips_on_each_side_by_hand() -> None:
    logprobs = _logprobs(RATIOS)
    loss, stats = policy_loss(logprobs, OLD, ADV, MASK, clip_low=0.2, clip_high=0.28)
    # per token: max(-A r, -A clip(r, 0.8, 1.28))
    #   A=+1, r=1.5: max(-1.5, -1.28) = -1.28   clipped (high side)
    #   A=-1, r=0.5: max(0.5, 0.8)    = 0.8     clipped (low side)
    #   A=+2, r=0.5: max(-1.0, -1.6)  = -1.0    not clipped (r < 1 - eps with A > 0 is left alone)
    #   A=-1, r=1.1: max(1.1, 1.1)    = 1.1     not clipped
    # token-mean: (-1.28 + 0.8 - 1.0 + 1.1) / 4 = -0.095
    assert loss.item() == pytest.approx(-0.095, abs=1e-6)
    assert (stats.clip_frac, stats.clip_frac_low, stats.clip_frac_high) == (0.5, 0.25, 0.25)
    assert stats.dual_clip_frac == 0.0
    assert stats.ratio_mean == pytest.approx(0.9, abs=1e-6)  # (1.5 + 0.5 + 0.5 + 1.1) / 4
    assert stats.ratio_max == pytest.approx(1.5, abs=1e-6)  # the masked e^5 is excluded
    # k3 of old -> new: (r - 1 - ln r) averaged: (0.094535 + 2 * 0.193147 + 0.004690) / 4
    assert stats.approx_kl == pytest.approx(0.121380, abs=1e-5)
    loss.backward()
    assert logprobs.grad is not None
    # clipped tokens get no gradient; unclipped ones d/dlogp (-A r) / 4 = -A r / 4
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.0, -0.25, 0.275, 0.0]]))


def test_symmetric_clip_changes_which_tokens_clip() -> None:
    _, stats = policy_loss(_logprobs(RATIOS), OLD, ADV, MASK, clip_low=0.2, clip_high=0.6)
    assert (stats.clip_frac_low, stats.clip_frac_high) == (0.25, 0.0)  # 1.5 < 1.6: no longer clipped


def test_dual_clip_caps_negative_advantage_tokens_by_hand() -> None:
    old = torch.zeros(1, 3)
    adv = torch.tensor([[-1.0, -1.0, 2.0]])
    logprobs = torch.log(torch.tensor([[5.0, 2.0, 5.0]])).requires_grad_(True)
    loss, stats = policy_loss(logprobs, old, adv, torch.ones(1, 3), clip_high=0.28, dual_clip=3.0)
    #   A=-1, r=5: PPO max(5, 1.28) = 5, dual cap -A * 3 = 3 -> 3 (dual-clipped, no gradient)
    #   A=-1, r=2: max(2, 1.28) = 2 < 3 -> 2
    #   A=+2, r=5: max(-10, -2.56) = -2.56 (the dual clip only acts on A < 0)
    assert loss.item() == pytest.approx((3.0 + 2.0 - 2.56) / 3, abs=1e-6)
    assert stats.dual_clip_frac == pytest.approx(1 / 3)
    loss.backward()
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 2.0 / 3, 0.0]]))


def test_policy_loss_rejects_bad_clip_parameters() -> None:
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(OLD, OLD, ADV, MASK, dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low < 1"):
        policy_loss(OLD, OLD, ADV, MASK, clip_low=1.0)
    with pytest.raises(ValueError, match=r"shapes must match: logprobs \(1, 4\)"):
        policy_loss(OLD[:, :4], OLD, ADV, MASK)


@settings(max_examples=100, deadline=None)
@given(
    st.floats(-3, 3, allow_nan=False),
    st.floats(-5, 5, allow_nan=False),
    st.floats(0, 0.9),
    st.floats(0, 2),
)
def test_clipping_never_increases_the_objective(
    log_ratio: float, adv: float, low: float, high: float
) -> None:
    lp, old, a = torch.tensor([[log_ratio]]), torch.zeros(1, 1), torch.tensor([[adv]])
    loss, _ = policy_loss(lp, old, a, torch.ones(1, 1), clip_low=low, clip_high=high)
    unclipped_objective = adv * math.exp(log_ratio)
    assert -loss.item() <= unclipped_objective + 1e-5 * (1 + abs(unclipped_objective))


def test_ratio_one_gives_minus_mean_advantage_and_no_clipping() -> None:
    loss, stats = policy_loss(OLD, OLD, ADV, MASK)
    assert loss.item() == pytest.approx(-(1.0 - 1.0 + 2.0 - 1.0) / 4)
    assert stats.clip_frac == 0.0 and stats.approx_kl == 0.0 and stats.ratio_mean == 1.0


VALUES = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
AGG_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        (Aggregation("token-mean"), (1 + 2 + 3 + 4) / 4),
        (Aggregation("seq-mean-token-mean"), ((1 + 2 + 3) / 3 + 4 / 1) / 2),
        (Aggregation("seq-mean-token-sum-norm", norm_tokens=4), ((1 + 2 + 3) / 4 + 4 / 4) / 2),
    ],
)
def test_aggregation_modes_by_hand(agg: Aggregation, expected: float) -> None:
    assert float(agg(VALUES, AGG_MASK)) == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_with_global_totals_add_up_to_the_full_batch(mode: str) -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 9.0], [5.0, 6.0, 0.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    full = Aggregation(mode, norm_tokens=3)(values, mask)  # type: ignore[arg-type]
    totals = Aggregation(mode, norm_tokens=3, total_tokens=float(mask.sum()), total_seqs=3.0)  # type: ignore[arg-type]
    parts = totals(values[:1], mask[:1]) + totals(values[1:], mask[1:])
    assert float(parts) == pytest.approx(float(full))


def test_aggregation_of_nothing_is_zero_and_ignores_garbage() -> None:
    garbage = torch.tensor([[float("nan"), float("inf")]])
    for mode in ("token-mean", "seq-mean-token-mean"):
        assert float(Aggregation(mode)(garbage, torch.zeros(1, 2))) == 0.0  # type: ignore[arg-type]


def test_aggregation_validates_its_mode() -> None:
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'; choose from token-mean"):
        Aggregation("mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs norm_tokens"):
        Aggregation("seq-mean-token-sum-norm")


def test_clipped_value_loss_by_hand() -> None:
    values = torch.tensor([[1.0, 2.0, 5.0]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 0.0]])
    returns = torch.tensor([[0.0, 3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = value_loss(values, old, returns, mask, clip=0.5)
    # token 0: V = V_old = 1, R = 0: 0.5 * 1 = 0.5
    # token 1: V = 2, V_clip = 1 + 0.5 = 1.5, R = 3: 0.5 * max(1, 2.25) = 1.125 (clipped)
    assert loss.item() == pytest.approx((0.5 + 1.125) / 2)
    assert stats.clip_frac == 0.5 and stats.value_mean == pytest.approx(1.5)
    loss.backward()
    assert values.grad is not None
    # d/dV 0.5 (V - R)^2 / 2 = (1 - 0) / 2; the clipped token has no gradient
    torch.testing.assert_close(values.grad, torch.tensor([[0.5, 0.0, 0.0]]))


def test_unclipped_value_loss_and_explained_variance() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    loss, stats = value_loss(returns.clone(), torch.zeros(1, 3), returns, torch.ones(1, 3), clip=None)
    assert loss.item() == 0.0 and stats.explained_variance == pytest.approx(1.0)
    _, flat = value_loss(torch.full((1, 3), 2.0), torch.zeros(1, 3), returns, torch.ones(1, 3), clip=None)
    assert flat.explained_variance == pytest.approx(0.0, abs=1e-6)  # a constant predicts nothing


def test_stats_flatten_for_logging() -> None:
    _, stats = policy_loss(OLD, OLD, ADV, MASK)
    logged = stats.as_dict()
    assert logged["policy/clip_frac"] == 0.0 and set(logged) >= {"policy/approx_kl", "policy/ratio_max"}
