"""Placing an episode's rewards on its tokens, so token-level estimators credit each turn.

A multi-turn episode gets a reward after each env step, and every step was caused by one
generated turn (:attr:`srt_agent.contracts.trajectory.TurnRecord.reward`). Placed on the last
token of the turn that caused it, a turn's reward is seen by GAE and REINFORCE++ from that turn's
tokens and the earlier ones, never by later turns' tokens. Outcome estimators (GRPO, RLOO) only
use the sum, which placement does not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

if TYPE_CHECKING:  # the rollout package pulls in the chat format (transformers); only types needed
    from srt_agent.contracts.trajectory import Trajectory

RewardPlacement = Literal["turn", "final"]
"""``turn``: each turn's reward on that turn's last token; ``final``: the episode's total reward on
its last generated token (the config's ``algo.reward_placement``)."""


def place_rewards(
    length: int,
    turn_spans: Sequence[tuple[int, int]],
    turn_rewards: Sequence[float] = (),
    final_reward: float = 0.0,
) -> Tensor:
    """One sequence's token-level rewards.

    Args:
        length: ``T``, the padded length.
        turn_spans: ``[start, end)`` of each generated turn, in order (``Trajectory.turn_spans``).
        turn_rewards: One reward per turn (or empty), placed at ``end - 1`` of that turn.
        final_reward: Placed at the last generated token (``end - 1`` of the last turn).

    Returns:
        ``(length,)`` float32.

    Raises:
        ValueError: A span leaves ``[0, length)``, ``turn_rewards`` has the wrong length, or a
            nonzero ``final_reward`` comes with no generated turn to carry it.
    """
    out = torch.zeros(length, dtype=torch.float32)
    if turn_rewards and len(turn_rewards) != len(turn_spans):
        raise ValueError(f"{len(turn_rewards)} turn rewards for {len(turn_spans)} turns")
    for i, (start, end) in enumerate(turn_spans):
        if not 0 <= start < end <= length:
            raise ValueError(f"turn {i} span [{start}, {end}) does not fit a sequence of {length} tokens")
        if turn_rewards:
            out[end - 1] += turn_rewards[i]
    if turn_spans:
        out[turn_spans[-1][1] - 1] += final_reward
    elif final_reward != 0.0:
        raise ValueError(f"final reward {final_reward} given for a sequence with no generated turn")
    return out


def token_rewards(
    trajectories: Sequence[Trajectory],
    *,
    length: int | None = None,
    placement: RewardPlacement = "turn",
    final_rewards: Sequence[float] | None = None,
    turn_bonuses: Sequence[Sequence[float]] | None = None,
) -> Tensor:
    """The batch's token-level rewards, aligned with :func:`srt_agent.algo.batch.collate`.

    Args:
        trajectories: ``B`` episodes.
        length: ``T``; default the longest episode.
        placement: ``turn`` puts ``Trajectory.turn_rewards`` on each turn's last token; ``final``
            puts ``Trajectory.total_reward`` on the last generated token.
        final_rewards: Extra per-episode rewards added on the last generated token (e.g. a
            success bonus computed by the trainer).
        turn_bonuses: Extra per-turn rewards added on each turn's last token (e.g. DAPO's
            overlong penalty per turn, :func:`srt_agent.algo.dapo.overlong_penalty`).

    Returns:
        ``(B, T)`` float32, nonzero only on generated tokens.

    Raises:
        ValueError: Lengths of the extras do not match, or an episode is longer than ``length``.
    """
    n = len(trajectories)
    for name, extra in (("final_rewards", final_rewards), ("turn_bonuses", turn_bonuses)):
        if extra is not None and len(extra) != n:
            raise ValueError(f"{name} has {len(extra)} entries for {n} trajectories")
    if placement not in ("turn", "final"):
        raise ValueError(f"unknown reward placement {placement!r}; choose from turn, final")
    width = max((len(t.token_ids) for t in trajectories), default=0) if length is None else length
    rows = []
    for i, traj in enumerate(trajectories):
        if len(traj.token_ids) > width:
            raise ValueError(
                f"episode {traj.episode_id!r} has {len(traj.token_ids)} tokens, more than {width}"
            )
        final = final_rewards[i] if final_rewards is not None else 0.0
        if placement == "final":
            final += traj.total_reward if traj.turns else 0.0
        row = place_rewards(width, traj.turn_spans, traj.turn_rewards if placement == "turn" else (), final)
        if turn_bonuses is not None:
            row += place_rewards(width, traj.turn_spans, turn_bonuses[i])
        rows.append(row)
    return torch.stack(rows) if rows else torch.zeros(0, width)
