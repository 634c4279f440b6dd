"""A reward penalty for garbled assistant turns: the turn format as a lesson RL can learn.

An outcome reward says nothing about a turn that is neither a well-formed tool call nor plain
text (a call block that does not decode, a stray ``</tool_call>``, a chat-template token written as
text: :func:`srt_agent.tooling.parser.turn_form`). When every sample of a task fails, as they do on
the hardest Retail tasks, the group's advantages are all zero and the policy learns nothing
there. A small per-turn penalty separates the failed samples that kept their turns readable from
those that did not, the same shaping DeepSeek-R1's format reward and DAPO's overlong penalty
(:func:`srt_agent.algo.dapo.overlong_penalty`) apply: it changes what the policy is rewarded for,
not how its tokens are sampled or scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from srt_agent.tooling.parser import turn_form

if TYPE_CHECKING:
    from srt_agent.contracts.trajectory import Trajectory


def garbled_turns(trajectory: Trajectory) -> list[bool]:
    """Whether each generated turn of ``trajectory`` is garbled, in turn order.

    The turns' texts are the episode's last ``num_turns`` assistant messages (an env's prompt may
    carry earlier assistant messages of its own, such as few-shot examples). A turn with no
    message (an episode cut before its action was recorded) counts as not garbled.
    """
    n = trajectory.num_turns
    texts = [m.content for m in trajectory.messages if m.role == "assistant"][-n:] if n else []
    return [False] * (n - len(texts)) + [turn_form(t) == "garbled" for t in texts]


def format_penalties(trajectories: Sequence[Trajectory], penalty: float) -> list[list[float]]:
    """``-penalty`` for each garbled turn, 0 for the others.

    The result is :func:`srt_agent.algo.rewards.token_rewards`'s ``turn_bonuses``.

    Raises:
        ValueError: ``penalty`` is negative (a bonus for garbling).
    """
    if penalty < 0:
        raise ValueError(f"format penalty {penalty} must be >= 0 (it is subtracted)")
    return [[-penalty if g else 0.0 for g in garbled_turns(t)] for t in trajectories]
