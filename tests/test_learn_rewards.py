"""Trajectories to tensors: reward placement on turns, padding/grouping, and DAPO's helpers."""

from __future__ import annotations

import pytest
import torch

from srt_agent.algo import (
    collate,
    compute_advantages,
    gae,
    informative_mask,
    overlong_penalty,
    place_rewards,
    prompt_groups,
    token_rewards,
    zero_variance_groups,
)
from srt_agent.chat.messages import Message
from srt_agent.contracts.trajectory import Trajectory, TurnRecord


def _turn(index: int, start: int, end: int, reward: float) -> TurnRecord:
    return TurnRecord(index, start, end, f"k{start}", "stop", reward, end - start, None, 0.0)


def _traj(
    spans: list[tuple[int, int]],
    rewards: list[float],
    length: int,
    seed: int = 0,
    trial: int = 0,
    messages: tuple[Message, ...] = (),
) -> Trajectory:
    mask = [0] * length
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    return Trajectory(
        episode_id=f"e{seed}/{trial}",
        env_id="srt/Calculator-v0",
        task_id=f"task{seed}",
        seed=seed,
        trial=trial,
        token_ids=tuple(range(100, 100 + length)),
        loss_mask=tuple(mask),
        logprobs=tuple(-0.5 if m else 0.0 for m in mask),
        turns=tuple(_turn(i, s, e, r) for i, ((s, e), r) in enumerate(zip(spans, rewards, strict=True))),
        total_reward=sum(rewards),
        success=False,
        terminated=True,
        truncated=False,
        status="ok",
        reason="",
        tool_calls=0,
        tool_errors=0,
        messages=messages,
    )


# prompt 0..2, turn 0 = tokens 3..4, observation 5..6, turn 1 = tokens 7..9
TWO_TURNS = _traj([(3, 5), (7, 10)], [0.2, 1.0], length=10)


def test_turn_rewards_land_on_each_turns_last_token() -> None:
    row = token_rewards([TWO_TURNS])[0]
    assert row.tolist() == pytest.approx([0, 0, 0, 0, 0.2, 0, 0, 0, 0, 1.0])
    final = token_rewards([TWO_TURNS], placement="final")[0]
    assert final.tolist() == pytest.approx([0, 0, 0, 0, 0, 0, 0, 0, 0, 1.2])


def test_token_level_estimators_credit_a_turns_reward_to_that_turn_and_earlier() -> None:
    rewards = token_rewards([TWO_TURNS])
    mask = torch.tensor([TWO_TURNS.loss_mask], dtype=torch.float32)
    adv = gae(rewards, torch.zeros_like(rewards), mask, gamma=0.5, lam=1.0).advantages[0]
    # turn 1: 1.0, 0.5, 0.25 (backwards); turn 0: 0.2 + 0.5 * 0.25 = 0.325, then 0.1625
    assert adv.tolist() == pytest.approx([0, 0, 0, 0.1625, 0.325, 0, 0, 0.25, 0.5, 1.0])


def test_extras_add_on_top_and_are_checked() -> None:
    row = token_rewards([TWO_TURNS], length=12, final_rewards=[1.0], turn_bonuses=[[-0.5, 0.0]])[0]
    assert row.tolist() == pytest.approx([0, 0, 0, 0, -0.3, 0, 0, 0, 0, 2.0, 0, 0])
    with pytest.raises(ValueError, match="final_rewards has 2 entries for 1 trajectories"):
        token_rewards([TWO_TURNS], final_rewards=[1.0, 2.0])
    with pytest.raises(ValueError, match="has 10 tokens, more than 8"):
        token_rewards([TWO_TURNS], length=8)


def test_place_rewards_checks_spans_and_unplaceable_rewards() -> None:
    assert place_rewards(4, [(1, 3)], [2.0], 1.0).tolist() == [0.0, 0.0, 3.0, 0.0]
    with pytest.raises(ValueError, match=r"turn 0 span \[2, 6\) does not fit a sequence of 4 tokens"):
        place_rewards(4, [(2, 6)])
    with pytest.raises(ValueError, match="no generated turn"):
        place_rewards(4, [], final_reward=1.0)
    with pytest.raises(ValueError, match="2 turn rewards for 1 turns"):
        place_rewards(4, [(1, 2)], [1.0, 2.0])


def test_collate_pads_and_groups_by_task() -> None:
    a = _traj([(1, 3)], [1.0], length=4, seed=5, trial=0)
    b = _traj([(2, 3)], [0.0], length=3, seed=5, trial=1)
    c = _traj([(1, 2)], [0.0], length=2, seed=9)
    batch = collate([a, b, c], pad_id=-1)
    assert batch.token_ids.tolist() == [[100, 101, 102, 103], [100, 101, 102, -1], [100, 101, -1, -1]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0], [0, 0, 1, 0], [0, 1, 0, 0]]
    assert batch.logprobs.tolist() == [[0, -0.5, -0.5, 0], [0, 0, -0.5, 0], [0, -0.5, 0, 0]]
    assert batch.group_ids.tolist() == [0, 0, 1] == prompt_groups([a, b, c]).tolist()
    assert batch.num_tokens == 4
    # the pieces fit together: GRPO on the collated batch
    rewards = token_rewards([a, b, c], length=4)
    adv = compute_advantages("drgrpo", rewards, batch.loss_mask, group_ids=batch.group_ids).advantages
    assert adv.tolist() == [[0, 0.5, 0.5, 0], [0, 0, -0.5, 0], [0, 0, 0, 0]]


def test_collate_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        collate([])
    with pytest.raises(ValueError, match=r"group_ids must have shape \(1,\)"):
        collate([TWO_TURNS], group_ids=torch.tensor([0, 1]))


def test_overlong_penalty_by_hand() -> None:
    lengths = torch.tensor([5, 6, 7, 8, 10, 11])
    # L_max = 10, L_cache = 4: free up to 6, then (6 - len) / 4, and -1 past 10
    assert overlong_penalty(lengths, 10, 4).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(lengths, 10, 4, factor=0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5, -0.5]
    with pytest.raises(ValueError, match="buffer_tokens <= max_tokens"):
        overlong_penalty(lengths, 10, 11)


def test_dynamic_sampling_finds_groups_without_signal() -> None:
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5])
    groups = torch.tensor([4, 4, 4, 1, 1, 1, 2])  # group 4 all solved, group 2 alone
    assert zero_variance_groups(scores, groups).tolist() == [2, 4]
    assert informative_mask(scores, groups).tolist() == [False] * 3 + [True] * 3 + [False]
    near = torch.tensor([1.0, 1.0 + 1e-9, 0.0, 0.0])
    assert zero_variance_groups(near, torch.tensor([0, 0, 1, 1]), tol=1e-6).tolist() == [0, 1]
