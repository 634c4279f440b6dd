"""Advantage estimators on hand-computed cases, plus their defining properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from srt_agent.algo import (
    compute_advantages,
    discounted_returns,
    drgrpo_advantages,
    gae,
    grpo_advantages,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo_advantages,
    scale_negative,
)

# Two prompts x three samples. Group ids need not be contiguous or sorted.
SCORES = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
GROUPS = torch.tensor([7, 7, 7, 3, 3, 3])


def _close(actual: torch.Tensor, expected: list[float] | list[list[float]], tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=tol, rtol=0)


def test_grpo_two_groups_by_hand() -> None:
    # group 7: mean 1/3, unbiased var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3, std 0.577350
    # group 3: mean 5/6, unbiased var ((1/6)^2 + (1/6)^2 + (1/3)^2) / 2 = 1/12, std 0.288675
    _close(grpo_advantages(SCORES, GROUPS), [1.154700, -0.577350, -0.577350, 0.577350, 0.577350, -1.154700])


def test_drgrpo_two_groups_by_hand() -> None:
    _close(drgrpo_advantages(SCORES, GROUPS), [2 / 3, -1 / 3, -1 / 3, 1 / 6, 1 / 6, -1 / 3])


def test_rloo_two_groups_by_hand() -> None:
    # 1 - mean(0, 0) = 1;  0 - mean(1, 0) = -0.5;  1 - mean(1, 0.5) = 0.25;  0.5 - mean(1, 1) = -0.5
    _close(rloo_advantages(SCORES, GROUPS), [1.0, -0.5, -0.5, 0.25, 0.25, -0.5])


def test_interleaved_groups_give_the_same_advantages() -> None:
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    for fn in (grpo_advantages, drgrpo_advantages, rloo_advantages):
        assert torch.allclose(fn(SCORES[perm], GROUPS[perm]), fn(SCORES, GROUPS)[perm])


def test_singleton_and_constant_groups_get_zero_advantage() -> None:
    scores, groups = torch.tensor([5.0, 2.0, 2.0]), torch.tensor([0, 1, 1])
    for fn in (grpo_advantages, drgrpo_advantages, rloo_advantages):
        assert fn(scores, groups).tolist() == [0.0, 0.0, 0.0]


def test_group_ids_must_be_integers() -> None:
    with pytest.raises(ValueError, match="integer"):
        grpo_advantages(SCORES, GROUPS.float())


# Quarter steps: exact in binary, and no two distinct rewards closer than eps-sized noise.
_rewards = st.integers(-40, 40).map(lambda k: k / 4)
_groups = st.lists(st.lists(_rewards, min_size=2, max_size=6), min_size=1, max_size=4)


def _flatten(groups: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.tensor([r for g in groups for r in g], dtype=torch.float64)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    return scores, ids


@settings(max_examples=60, deadline=None)
@given(_groups)
def test_rloo_and_drgrpo_sum_to_zero_within_each_group(groups: list[list[float]]) -> None:
    scores, ids = _flatten(groups)
    for adv in (rloo_advantages(scores, ids), drgrpo_advantages(scores, ids)):
        sums = torch.zeros(len(groups), dtype=adv.dtype).index_add(0, ids, adv)
        assert sums.abs().max() < 1e-9


@settings(max_examples=60, deadline=None)
@given(_groups, st.integers(-400, 400).map(lambda k: k / 4))
def test_grpo_is_invariant_to_a_reward_shift(groups: list[list[float]], shift: float) -> None:
    scores, ids = _flatten(groups)
    assert torch.allclose(grpo_advantages(scores + shift, ids), grpo_advantages(scores, ids), atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(_groups)
def test_rloo_is_drgrpo_scaled_by_n_over_n_minus_1(groups: list[list[float]]) -> None:
    scores, ids = _flatten(groups)
    n = torch.tensor([len(groups[i]) for i in ids.tolist()], dtype=torch.float64)
    assert torch.allclose(rloo_advantages(scores, ids), n / (n - 1) * drgrpo_advantages(scores, ids))


# A multi-turn row: action, action, observation, action; and a short row with padding.
MASK = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
REWARDS = torch.tensor([[0.0, 0.5, 0.0, 1.0], [0.0, 2.0, 0.0, 0.0]])


def test_gae_four_tokens_by_hand_skipping_the_observation() -> None:
    values = torch.tensor([[0.5, 0.4, 9.0, 0.8], [1.0, 1.0, 7.0, 7.0]])
    out = gae(REWARDS, values, MASK, gamma=0.9, lam=0.8)
    # row 0, backwards; position 2 is an observation: skipped, its value 9.0 never read.
    #   t=3: delta = 1 + 0 - 0.8 = 0.2;                      A = 0.2
    #   t=1: delta = 0.5 + 0.9 * 0.8 - 0.4 = 0.82;          A = 0.82 + 0.72 * 0.2 = 0.964
    #   t=0: delta = 0 + 0.9 * 0.4 - 0.5 = -0.14;           A = -0.14 + 0.72 * 0.964 = 0.55408
    # row 1 with gamma 0.9, lam 0.8:
    #   t=1: delta = 2 - 1 = 1;                              A = 1
    #   t=0: delta = 0 + 0.9 * 1 - 1 = -0.1;                 A = -0.1 + 0.72 * 1 = 0.62
    _close(out.advantages, [[0.55408, 0.964, 0.0, 0.2], [0.62, 1.0, 0.0, 0.0]])
    _close(out.returns, [[1.05408, 1.364, 0.0, 1.0], [1.62, 2.0, 0.0, 0.0]])


def test_gae_ignores_values_on_masked_positions() -> None:
    a = torch.tensor([[0.5, 0.4, 9.0, 0.8], [1.0, 1.0, 7.0, 7.0]])
    b = torch.tensor([[0.5, 0.4, -3.0, 0.8], [1.0, 1.0, 0.0, 100.0]])
    assert torch.equal(gae(REWARDS, a, MASK).advantages, gae(REWARDS, b, MASK).advantages)


def test_gae_with_lambda_one_is_return_minus_value() -> None:
    values = torch.tensor([[0.3, -0.2, 0.0, 0.1], [0.5, 0.5, 0.0, 0.0]])
    out = gae(REWARDS, values, MASK, gamma=0.9, lam=1.0)
    expected = (discounted_returns(REWARDS, MASK, 0.9) - values) * MASK
    assert torch.allclose(out.advantages, expected, atol=1e-6)


def test_gae_whitening_normalises_over_generated_tokens() -> None:
    out = gae(REWARDS, torch.zeros_like(REWARDS), MASK, whiten=True)
    picked = out.advantages[MASK.bool()]
    assert abs(float(picked.mean())) < 1e-6
    assert float(picked.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
    assert out.advantages[~MASK.bool()].tolist() == [0.0, 0.0, 0.0]


def test_rewards_on_masked_positions_are_rejected() -> None:
    bad = REWARDS.clone()
    bad[0, 2] = 1.0
    with pytest.raises(ValueError, match=r"token_rewards\[0, 2\] = 1.0"):
        gae(bad, torch.zeros_like(bad), MASK)


def test_discounted_returns_by_hand() -> None:
    # row 0: G3 = 1; G1 = 0.5 + 0.9 * 1 = 1.4; G0 = 0.9 * 1.4 = 1.26 (the observation adds no step)
    _close(discounted_returns(REWARDS, MASK, 0.9), [[1.26, 1.4, 0.0, 1.0], [1.8, 2.0, 0.0, 0.0]])


def test_reinforce_pp_whitens_over_the_batch_by_hand() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, -1.0]])
    out = reinforce_pp(rewards, mask)
    # returns 1, 1 | -1, -1, -1: mean -0.2, population var 1 - 0.04 = 0.96, std 0.979796
    _close(out.returns, [[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    _close(out.advantages, [[1.224745, 1.224745, 0.0], [-0.816497, -0.816497, -0.816497]])


def test_reinforce_pp_baseline_subtracts_the_group_mean_by_hand() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [3.0, 0.0, 0.0]])
    groups = torch.tensor([0, 0, 1])
    out = reinforce_pp_baseline(rewards, mask, groups)
    # group 0 mean 1.5: returns 0.5, 0.5 | -0.5 x 3; group 1 (alone) mean 3: return 0.
    # whitened over the 6 generated tokens (.5 .5 -.5 -.5 -.5 0): mean -1/12, population std
    _close(out.returns, [[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5], [0.0, 0.0, 0.0]])
    mean = -1 / 12
    std = math.sqrt((2 * (0.5 - mean) ** 2 + 3 * (-0.5 - mean) ** 2 + mean**2) / 6)
    hi, lo, zero = (0.5 - mean) / std, (-0.5 - mean) / std, -mean / std
    _close(out.advantages, [[hi, hi, 0.0], [lo, lo, lo], [zero, 0.0, 0.0]])


def test_compute_advantages_broadcasts_outcome_estimators_to_tokens() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])
    out = compute_advantages("rloo", rewards, mask, group_ids=torch.tensor([0, 0, 0]))
    # scores 1, 0, 0.5: RLOO 1 - 0.25 = 0.75, 0 - 0.75 = -0.75, 0.5 - 0.5 = 0
    _close(out.advantages, [[0.75, 0.75, 0.0], [0.0, -0.75, -0.75], [0.0, 0.0, 0.0]])
    _close(out.returns, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])


def test_compute_advantages_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="needs group_ids"):
        compute_advantages("grpo", REWARDS, MASK)
    with pytest.raises(ValueError, match="needs values"):
        compute_advantages("gae", REWARDS, MASK)
    with pytest.raises(ValueError, match="unknown estimator 'ppo'; choose from gae, grpo"):
        compute_advantages("ppo", REWARDS, MASK)  # type: ignore[arg-type]


def test_scale_negative_scales_only_negative_advantages_by_hand() -> None:
    adv = torch.tensor([[0.5, -1.0, 0.0], [-0.25, 2.0, -4.0]])
    _close(scale_negative(adv, 0.5), [[0.5, -0.5, 0.0], [-0.125, 2.0, -2.0]])
    _close(scale_negative(adv, 0.0), [[0.5, 0.0, 0.0], [0.0, 2.0, 0.0]])
    assert torch.equal(scale_negative(adv, 1.0), adv)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\], got 1.5"):
        scale_negative(adv, 1.5)
