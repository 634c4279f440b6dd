"""A Retail demonstrator that misreads the customer's request once and recovers when corrected.

Built Retail models copy names and ids but lose the request itself: the customer states it in the
opening message, and by the time the agent has read the order, five or more turns later, a small
model often acts on another kind of request ("Which items would you like to return?" to a customer
who asked what an order cost). The customer then restates the request ("I think there's a
misunderstanding. I need the total I paid for an order."), a turn no oracle demonstration
contains, and the model's turns fall apart from there.

The misreading demonstrator plays the env's oracle, except that its first plain-text turn after
reading an order asks about another request kind (return, exchange or cancel, drawn per task).
The simulated customer corrects it and the oracle, which recomputes its next step from the visible
conversation, goes on as it would have. The misread turn is kept as context with no loss
(:attr:`srt_agent.recipe.demos.DemoTurn.trained` false): a model learns the recovery, never the
misreading.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from srt_agent.chat.messages import Message
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import Observation
from srt_agent.envs.retail.env import RetailEnv
from srt_agent.tooling.parser import parse_tool_calls
from srt_agent.tooling.toolset import is_error_message

WRONG_ASKS: dict[str, str] = {
    "return": "Order {order_id} was delivered. Which items would you like to return?",
    "exchange": "Which item of order {order_id} would you like to exchange, and for which option?",
    "cancel": "Why would you like to cancel order {order_id}?",
}
"""The misread turn per request kind it wrongly assumes (never the task's own kind)."""


class MisreadingOracle:
    """The oracle of the current task, with its first text turn after an order look-up misread.

    Args:
        oracle: The env's oracle for the current task (stateless between turns: it reads the
            conversation each time, so the misread turn needs no replay).
        kind: The task's request kind (``cancel``, ``return``, ``exchange`` or ``info``).
        rng: Draws which other kind the misread turn assumes.

    Attributes:
        mistakes: Indexes (0-based, in the episode) of the assistant turns that were mistakes.
    """

    def __init__(self, oracle: Policy, kind: str, rng: np.random.Generator) -> None:
        self.oracle = oracle
        self.rng = rng
        self.wrong = [k for k in WRONG_ASKS if k != kind]
        self.mistakes: list[int] = []
        self._turn = 0

    def act(self, history: Sequence[Message]) -> str:
        """The oracle's action, or the misread question at the first text turn after an order look-up."""
        turn, self._turn = self._turn, self._turn + 1
        action = self.oracle.act(history)
        if self.mistakes or parse_tool_calls(action).has_calls:
            return action
        order_id = _looked_up_order(history)
        if order_id is None:
            return action
        self.mistakes.append(turn)
        kind = self.wrong[int(self.rng.integers(len(self.wrong)))]
        return WRONG_ASKS[kind].format(order_id=order_id)


def _looked_up_order(history: Sequence[Message]) -> str | None:
    """The order id of the last message if it is a successful ``get_order_details`` result."""
    if not history:
        return None
    last = history[-1]
    if last.role != "tool" or last.name != "get_order_details" or is_error_message(last):
        return None
    try:
        order_id = json.loads(last.content).get("order_id")
    except (json.JSONDecodeError, AttributeError):
        return None
    return order_id if isinstance(order_id, str) else None


def misreading_policy(env: gym.Env[Observation, str]) -> Policy:
    """The misreading demonstrator of a Retail env's current task (seeded by its task id); after ``reset``.

    Raises:
        ValueError: The env is not ``srt/Retail-v0`` (the misread turns are Retail's requests).
    """
    inner = env.unwrapped
    if not isinstance(inner, RetailEnv):
        raise ValueError(
            f"demonstrator 'misread' plays srt/Retail-v0 only, not {type(inner).__name__}: "
            "use demonstrator 'oracle'"
        )
    seed = zlib.crc32(str(inner.task_id).encode())
    return MisreadingOracle(inner.oracle(), inner.task.kind, np.random.default_rng(seed))
