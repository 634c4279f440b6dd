"""The format penalty: garbled assistant turns found, penalised on their own tokens, and learned from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_learn_rewards import _traj as spans_trajectory

from srt_agent.algo import compute_advantages, format_penalties, garbled_turns, token_rewards
from srt_agent.chat.messages import Message, assistant, tool_result, user
from srt_agent.contracts.trajectory import Trajectory

CALL = '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}}</tool_call>'
GARBLED = 'Order #W1", "arguments": {"order_id"</tool_call>'


def _traj(
    texts: list[str], *, trial: int = 0, reward: float = 0.0, prompt: tuple[Message, ...] = ()
) -> Trajectory:
    """An episode whose turn ``i`` is tokens ``[3 + 4i, 5 + 4i)`` and whose assistant texts are ``texts``."""
    spans = [(3 + 4 * i, 5 + 4 * i) for i in range(len(texts))]
    rewards = [0.0] * (len(texts) - 1) + [reward]
    messages = [*prompt, user("hi")]
    for text in texts:
        messages += [assistant(text), tool_result("{}", call_id="c", name="get_order_details")]
    return spans_trajectory(spans, rewards, 3 + 4 * len(texts), trial=trial, messages=tuple(messages))


def test_garbled_turns_are_found_in_turn_order() -> None:
    traj = _traj([CALL, "Which item?", GARBLED, ""])  # an empty turn is garbled too
    assert garbled_turns(traj) == [False, False, True, True]
    assert format_penalties([traj], 0.25) == [[0.0, 0.0, -0.25, -0.25]]
    # An assistant message of the env's prompt (a few-shot example) is not a turn of the policy.
    shot = _traj([CALL, GARBLED], prompt=(user("example"), assistant("")))
    assert garbled_turns(shot) == [False, True]


def test_the_penalty_lands_on_the_garbled_turns_last_token() -> None:
    traj = _traj([CALL, GARBLED], reward=1.0)  # turn 0 = tokens 3..4, turn 1 = 7..8
    row = token_rewards([traj], turn_bonuses=format_penalties([traj], 0.1))[0]
    assert row.tolist() == pytest.approx([0, 0, 0, 0, 0, 0, 0, 0, 0.9, 0, 0])


def test_a_negative_penalty_is_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        format_penalties([_traj([CALL])], -0.1)


def test_a_group_of_failures_gets_a_signal_only_from_the_penalty() -> None:
    """Every sample failed: GRPO's advantages are all zero, unless the garbled one is penalised."""
    group = [_traj([CALL, "Which item?"], trial=0), _traj([CALL, GARBLED], trial=1)]
    mask = torch.tensor([t.loss_mask for t in group], dtype=torch.float32)
    ids = torch.zeros(2, dtype=torch.long)
    plain = compute_advantages("grpo", token_rewards(group), mask, group_ids=ids).advantages
    assert plain.abs().sum() == 0
    shaped = token_rewards(group, turn_bonuses=format_penalties(group, 0.1))
    adv = compute_advantages("grpo", shaped, mask, group_ids=ids).advantages
    assert (adv[0][mask[0].bool()] > 0).all() and (adv[1][mask[1].bool()] < 0).all()


def test_the_learner_applies_the_configured_penalty(tmp_path: Path) -> None:
    from srt_agent.config import RunConfig
    from srt_agent.speed.random_model import save_random_model
    from srt_agent.train.learner import Learner
    from srt_agent.train.optim import build_optimizer
    from srt_agent.train.policy_model import PolicyModel

    model = save_random_model(tmp_path / "m", vocab_size=128, hidden_size=32, intermediate_size=64)
    cpu = torch.device("cpu")
    policy = PolicyModel.load(model, cpu)
    group = [_traj([CALL, "Which item?"], trial=0), _traj([CALL, GARBLED], trial=1)]

    def advantages(penalty: float) -> torch.Tensor:
        cfg = RunConfig.model_validate({"algo": {"format_penalty": penalty}})
        optimizer, scheduler = build_optimizer(policy, cfg)
        return Learner(policy, optimizer, scheduler, cfg, cpu).prepare(group).advantages

    assert advantages(0.0).abs().sum() == 0
    shaped = advantages(0.1)
    assert shaped[0].sum() > 0 > shaped[1].sum()
