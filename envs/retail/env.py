"""``srt/Retail-v0``: a customer-service dialogue over a small generated store (τ-bench-retail style).

Each episode draws a store (users, products, orders) and a customer with a hidden goal: cancel a
pending order, return or exchange items of a delivered order, or learn a fact (order status, total
paid, a variant's price), sometimes with the amount of money involved. The agent talks to the
rule-based customer (:mod:`user_sim`) in plain turns and to the store through tools (:mod:`tools`).
The customer ends the conversation with ``###STOP###``; the episode then terminates with reward 1
iff the database equals the goal database and every requested fact was told to the customer, else
0 (as τ-bench scores). With ``partial_credit=w`` a failed episode, ended by the customer or by the
turn limit, earns ``w`` times how far it got (:mod:`progress`: the customer identified, the best
proposal's share of the goal, the final database and the facts told); success is still reward 1
only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_args

from pydantic import Field, field_validator

from srt_agent.chat.messages import Message, system, user
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import EnvConfig, MultiTurnEnv, Transition
from srt_agent.envs.retail.db import CATALOG, Database, generate_database
from srt_agent.envs.retail.progress import dialogue_progress, task_progress
from srt_agent.envs.retail.tasks import TASK_KINDS, Task, TaskKind, goal_database, missing_info, sample_task
from srt_agent.envs.retail.tools import WRITE_TOOLS, RetailSession, build_toolset
from srt_agent.envs.retail.user_sim import UserSimulator
from srt_agent.tooling.parser import ParsedTurn
from srt_agent.tooling.toolset import ToolResult, ToolSet

SYSTEM_PROMPT = """\
You are a customer service agent for an online store. Help the user with their request, following \
these rules.
- Authenticate the user first, in every conversation: find their user id with their email, or with \
their first name, last name and zip code. Only then use the other user and order tools.
- Act only on the authenticated user's own orders. Get facts from the tools; never guess them.
- Only pending orders can be cancelled. The reason must be 'no longer needed' or 'ordered by \
mistake'; the total is refunded to the original payment method.
- Only delivered orders can have items returned or exchanged. An item can only be exchanged for an \
available variant of the same product. Refunds and price differences go to the original payment \
method or to a gift card of the user.
- Before cancelling, returning or exchanging, list the action's details (order id, items, reason, \
payment method) and ask the user to confirm; call the tool only after they answer yes.
- A message without a tool call goes to the user. Ask for what you need; tell the user the outcome, \
including any amounts, then ask if there is anything else you can help with."""


class RetailConfig(EnvConfig):
    """Options of ``srt/Retail-v0``."""

    max_turns: int = Field(30, ge=1, le=1000, description="Assistant turns before the episode is truncated.")
    num_users: int = Field(8, ge=2, le=50, description="Customers in each generated store.")
    num_products: int = Field(
        6, ge=3, le=len(CATALOG), description=f"Product types in each store (at most {len(CATALOG)})."
    )
    task_kinds: tuple[TaskKind, ...] = Field(
        TASK_KINDS, min_length=1, description=f"Task kinds drawn from, uniformly; any of {list(TASK_KINDS)}."
    )

    partial_credit: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Reward of a failed episode per share of the goal it reached (0: reward is 1 or 0, "
        "as in tau-bench; e.g. 0.5 for RL whose groups all fail or all succeed).",
    )

    @field_validator("task_kinds")
    @classmethod
    def _distinct(cls, kinds: tuple[TaskKind, ...]) -> tuple[TaskKind, ...]:
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"task_kinds has duplicates: {list(kinds)}")
        return kinds


class RetailEnv(MultiTurnEnv):
    """τ-bench-style retail customer service with a simulated customer and a store database.

    See the module docstring for the rules and the reward.

    ``reset(options={"task_kind": "cancel"})`` forces the task kind of one episode.

    Args:
        render_mode: ``None`` or ``"ansi"``.
        **options: :class:`RetailConfig` options.
    """

    config_model = RetailConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        self._session: RetailSession | None = None
        super().__init__(render_mode=render_mode, **options)
        self.config: RetailConfig
        self._task: Task | None = None
        self._goal: Database | None = None
        self._sim: UserSimulator | None = None
        self._initial: Database | None = None

    # ---------------------------------------------------------------- episode state
    def _live(self) -> RetailSession:
        if self._session is None:
            raise RuntimeError("no episode in progress: call reset() first")
        return self._session

    def _require_task(self) -> tuple[Task, Database, UserSimulator]:
        if self._task is None or self._goal is None or self._sim is None:
            raise RuntimeError("no episode in progress: call reset() first")
        return self._task, self._goal, self._sim

    @property
    def task(self) -> Task:
        """The current hidden task (for oracles, tests and analysis; never shown to the agent)."""
        return self._require_task()[0]

    @property
    def db(self) -> Database:
        """The current episode's live database."""
        return self._live().db

    # ---------------------------------------------------------------- MultiTurnEnv hooks
    def task_info(self) -> dict[str, Any]:
        """``task_kind``: cancel, return, exchange or info (per-kind figures in eval and training)."""
        return {"task_kind": self._task.kind} if self._task is not None else {}

    def build_tools(self) -> ToolSet:
        """The retail tools, bound to whichever episode is current."""
        return build_toolset(self._live)

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """Draw a store, a task and a customer; open with the policy and the customer's request.

        Raises:
            ValueError: ``options`` has a key other than ``task_kind`` or an unknown kind.
        """
        unknown = set(options) - {"task_kind"}
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; the only one is 'task_kind'")
        rng = self.np_random
        kind = options.get("task_kind")
        if kind is None:
            kind = self.config.task_kinds[int(rng.integers(len(self.config.task_kinds)))]
        elif kind not in get_args(TaskKind):
            raise ValueError(f"task_kind={kind!r} is not one of {list(TASK_KINDS)}")
        db = generate_database(rng, self.config.num_users, self.config.num_products)
        self._task = sample_task(rng, db, kind)
        self._goal = goal_database(db, self._task)
        self._initial = db.model_copy(deep=True)  # read only: the customer's memory and partial credit's base
        self._sim = UserSimulator(self._task, self._initial, rng)
        self._session = RetailSession(db)
        task_id = f"retail-{kind}-{int(rng.integers(10**9)):09d}"
        return task_id, [system(SYSTEM_PROMPT), user(self._sim.opening())]

    def on_message(self, text: str) -> Transition:
        """Hand the agent's message to the customer; score the episode when the customer leaves."""
        task, goal, sim = self._require_task()
        session = self._live()
        reply = sim.respond(text)
        # A confirmation is only good until the customer says anything else.
        session.confirmed = reply.affirmed
        info: dict[str, Any] = {"authenticated": session.auth_user_id is not None}
        if not reply.stop:
            return Transition(messages=[user(reply.text)], info=info)
        db_match = session.db == goal
        missing = missing_info(task.required_info, sim.agent_texts)
        info.update(db_match=db_match, missing_info=missing)
        end = Transition(reward=1.0, info={"progress": 1.0}) if db_match and not missing else self._partial()
        return Transition(
            messages=[user(reply.text)], reward=end.reward, terminated=True, info={**info, **end.info}
        )

    def on_truncation(self) -> Transition:
        """The turn limit ended the episode: partial credit for the share of the goal reached."""
        return self._partial()

    def _partial(self) -> Transition:
        task, goal, sim = self._require_task()
        assert self._initial is not None
        outcome = task_progress(self._initial, goal, self.db, task.required_info, sim.agent_texts)
        identified = self._live().auth_user_id == task.user_id
        proposal = None if task.kind == "info" else sim.best_proposal
        progress = dialogue_progress(identified, proposal, outcome)
        return Transition(reward=self.config.partial_credit * progress, info={"progress": progress})

    def on_tool_results(self, turn: ParsedTurn, results: list[ToolResult]) -> Transition:
        """Return the results; tell the customer about successful write actions."""
        sim = self._require_task()[2]
        for r in results:
            if r.ok and r.name in WRITE_TOOLS:
                sim.observe_action(r.name)
        info = {"authenticated": self._live().auth_user_id is not None}
        return Transition(messages=[r.to_message() for r in results], info=info)

    def oracle(self) -> Policy:
        """A scripted agent that solves the current task from what the conversation shows."""
        from srt_agent.envs.retail.oracle import RetailOracle

        return RetailOracle(self.task)
