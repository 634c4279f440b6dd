"""A Retail demonstrator whose proposals the customer refuses first: a wrong one, a "No", a right one.

A built Retail model fails most often at the proposal: it names an item of the order the customer
did not ask about, or the wrong payment method; the customer answers "No, that's not right." and
restates what they want. No oracle demonstration has a refused proposal in it, so the model has
never seen one, and it proposes the same wrong thing again, turn after turn, until its text falls
apart (in held-out evaluations of the shipped build, the turns past ~1,250 tokens of conversation,
beyond every demonstration's length, are garbled 15-21% of the time).

The refused-proposal demonstrator plays the env's oracle, except that one to :data:`MOST_REFUSALS`
of its proposals are first made wrong: another item of the order in place of one the customer
named, another of the customer's payment methods, or (a cancellation) the other reason. The
simulated customer refuses each and says what is wrong; the oracle, which recomputes its next
step from the visible conversation, proposes again. The wrong proposals are context with no loss
(:attr:`srt_agent.recipe.demos.DemoTurn.trained` false): a model learns to correct a refused
proposal from what the customer said, never to make the mistake.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from srt_agent.chat.messages import Message
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import Observation
from srt_agent.envs.retail.actions import CANCEL_REASONS
from srt_agent.envs.retail.db import describe_item
from srt_agent.envs.retail.env import RetailEnv
from srt_agent.envs.retail.oracle import PROPOSAL_END, last_outputs

MOST_REFUSALS = 3
"""A demonstration has 1 to this many refused proposals (drawn per task), where the task has one."""
LONG_REFUSALS = 18
"""The most refused proposals of the ``refused-long`` demonstrator: conversations as long as a
failing episode (~30 turns, ~3.5k tokens), since a built model's turns garble beyond the longest
conversation it was trained on. The oracle's longest solution takes 11 turns, so 18 refusals still
end within the env's 30-turn limit."""


class RefusedProposalOracle:
    """The oracle of the current task, with its first proposals made wrong (module docstring).

    Args:
        oracle: The env's oracle for the current task (stateless between turns).
        rng: Draws how many proposals are refused and how each is made wrong.
        most_refusals: At most this many proposals are refused (at least one).

    Attributes:
        mistakes: Indexes (0-based, in the episode) of the assistant turns that were mistakes.
    """

    def __init__(self, oracle: Policy, rng: np.random.Generator, most_refusals: int = MOST_REFUSALS) -> None:
        if most_refusals < 1:
            raise ValueError(f"most_refusals={most_refusals} must be >= 1")
        self.oracle = oracle
        self.rng = rng
        self.refusals = int(rng.integers(1, most_refusals + 1))
        self.mistakes: list[int] = []
        self._turn = 0

    def act(self, history: Sequence[Message]) -> str:
        """The oracle's action, or a wrong version of it while proposals are left to refuse."""
        turn, self._turn = self._turn, self._turn + 1
        action = self.oracle.act(history)
        if len(self.mistakes) >= self.refusals or not action.endswith(PROPOSAL_END):
            return action
        wrong = wrong_proposal(action, history, self.rng)
        if wrong is None:
            return action
        self.mistakes.append(turn)
        return wrong


def wrong_proposal(proposal: str, history: Sequence[Message], rng: np.random.Generator) -> str | None:
    """``proposal`` with one thing the customer will refuse, or ``None`` if nothing can be swapped.

    One of: an item of the order the proposal does not name in place of one it names, another of
    the customer's payment methods in place of the one it names, or the other cancellation reason.
    """
    outputs = last_outputs(history)
    order, user = outputs.get("get_order_details"), outputs.get("get_user_details")
    swaps: list[str] = []
    for reason in CANCEL_REASONS:
        other = next(r for r in CANCEL_REASONS if r != reason)
        if f"'{reason}'" in proposal:
            swaps.append(proposal.replace(f"'{reason}'", f"'{other}'"))
    if order is not None and "cancel order" not in proposal:
        named = [_mention(i) for i in order["items"] if _mention(i) in proposal]
        others = [_mention(i) for i in order["items"] if _mention(i) not in proposal]
        if named and others:
            old, new = named[int(rng.integers(len(named)))], others[int(rng.integers(len(others)))]
            swaps.append(proposal.replace(old, new))
        methods = [p["id"] for p in (user or {}).get("payment_methods", [])]
        used = [m for m in methods if m in proposal]
        unused = [m for m in methods if m not in proposal]
        if len(used) == 1 and unused:
            method = unused[int(rng.integers(len(unused)))]
            swaps.append(proposal.replace(used[0], method))
    if not swaps:
        return None
    return swaps[int(rng.integers(len(swaps)))]


def _mention(item: dict[str, Any]) -> str:
    """How a proposal names an order item: its description and its id."""
    return f"{describe_item(item['name'], item['options'])} (item {item['item_id']})"


def refused_proposal_policy(env: gym.Env[Observation, str], most_refusals: int = MOST_REFUSALS) -> Policy:
    """The refused-proposal demonstrator of a Retail env's current task (seeded by its task id).

    Args:
        env: A ``srt/Retail-v0`` env, reset to its task.
        most_refusals: At most this many proposals are refused (drawn per task from 1 up).

    Raises:
        ValueError: The env is not ``srt/Retail-v0`` (the proposals are Retail's).
    """
    inner = env.unwrapped
    if not isinstance(inner, RetailEnv):
        raise ValueError(
            f"demonstrator 'refused' plays srt/Retail-v0 only, not {type(inner).__name__}: "
            "use demonstrator 'oracle'"
        )
    seed = zlib.crc32(f"refused/{inner.task_id}".encode())
    return RefusedProposalOracle(inner.oracle(), np.random.default_rng(seed), most_refusals)
