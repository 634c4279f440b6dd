"""``srt/RetailCopy-v0``: repeat a list of Retail values exactly, the copying skill Retail is built on.

Every Retail task needs four to six exact copies: a name or an email, a user id, an order id, item
ids and a payment method id, each a dozen characters that the agent read earlier in the
conversation and must write back into a tool call. A small model learns this late and all at once
(an induction circuit: find where the token just written occurred before, write what followed it);
until then it writes ids of the right shape with invented digits, and every later tool call fails.

This env isolates that skill in one short turn. The customer lists three to eight values drawn
from a freshly generated Retail store (user ids, emails, names, zip codes, order ids, product and
item ids, payment method ids), as a sentence, a JSON list or separated by spaces; the agent must
pass them, in order and unchanged, to the ``record_values`` tool. Reward 1 iff the first call's
values equal the list; the episode ends with that call. Its oracle makes the demonstrations of the
Retail builds' first stage (``srt/RetailCopy-v0`` in :data:`srt_agent.recipe.build.RETAIL_DEMOS`), and
``srt-agent eval --env srt/RetailCopy-v0`` measures whether a model copies.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from srt_agent.chat.messages import Message, system, user
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import EnvConfig, MultiTurnEnv, Observation, Transition, not_below
from srt_agent.envs.retail.db import Database, generate_database
from srt_agent.tooling.definition import Tool, tool
from srt_agent.tooling.parser import ParsedTurn, format_tool_call
from srt_agent.tooling.toolset import ToolResult, ToolSet

SYSTEM_PROMPT = (
    "The user lists values from a store's records. Pass every value, in the order given and exactly as "
    "written, to record_values."
)
STYLES = ("sentence", "json", "spaces")
"""How the customer writes the list: ``a, b and c.``, ``["a","b","c"]`` or ``a b c``."""
STORE_SEED = 0x5E7A11
"""Seeds the fixed stores of the ``stores`` option (with the store's index)."""
OPENINGS = (
    "Please record these: {values}",
    "Note these down for me: {values}",
    "Here they are: {values}",
)


class DrillStoreConfig(EnvConfig):
    """The store option every Retail drill has."""

    stores: int | None = Field(
        None,
        ge=1,
        description="Draw each task from one of this many fixed stores (None: a fresh store per task). "
        "Shared stores show the same names and ids in many tasks, with different neighbours each time.",
    )


class RetailCopyConfig(DrillStoreConfig):
    """Options of ``srt/RetailCopy-v0``."""

    max_turns: int = Field(2, ge=1, le=1000, description="Assistant turns before the episode is truncated.")
    min_values: int = Field(3, ge=1, le=32, description="Fewest values in a list.")
    max_values: int = Field(8, ge=1, le=32, description="Most values in a list (>= min_values).")

    @field_validator("max_values")
    @classmethod
    def _range_not_empty(cls, value: int, info: ValidationInfo) -> int:
        return not_below(value, info, "min_values")


def store_values(db: Database) -> list[str]:
    """Every value of a store that a Retail agent copies into a tool call or a message."""
    out: list[str] = []
    for u in db.users.values():
        out += [u.user_id, u.email, u.zip, f"{u.first_name} {u.last_name}"]
        out += [m.id for m in u.payment_methods]
    out += list(db.orders)
    for p in db.products.values():
        out.append(p.product_id)
        out += [v.item_id for v in p.variants]
    return out


def render_values(values: Sequence[str], style: str) -> str:
    """The list as the customer writes it in ``style`` (one of :data:`STYLES`)."""
    if style == "sentence":
        head = ", ".join(values[:-1])
        return f"{head} and {values[-1]}." if head else f"{values[-1]}."
    if style == "json":
        return json.dumps(list(values), separators=(",", ":"))
    if style == "spaces":
        return " ".join(values)
    raise ValueError(f"style={style!r} is not one of {list(STYLES)}")


def record_values_tool(keep: Callable[[list[str]], None]) -> Tool:
    """The drills' answer tool, ``record_values(values)``: hands a copy of the list to ``keep``."""

    @tool
    def record_values(values: list[str]) -> str:
        """Record the values the user listed, in order and exactly as written.

        Args:
            values: The values, e.g. ['#W1234567', 'emma_smith_1234'].
        """
        keep(list(values))
        return "recorded"

    return record_values


def fixed_store(index: int) -> Database:
    """Fixed store ``index``: seeded by its index alone, so the same in every episode and every build."""
    return generate_database(np.random.default_rng([STORE_SEED, index]), 8, 6)


def drill_store(rng: np.random.Generator, stores: int | None) -> Database:
    """A drill's store: fresh from ``rng``, or one of the first ``stores`` fixed ones."""
    return generate_database(rng, 8, 6) if stores is None else fixed_store(int(rng.integers(stores)))


class RecordingDrill(MultiTurnEnv):
    """A drill answered by ``record_values``: the first recorded list scores 1 iff it equals :attr:`values`.

    Subclasses set ``self._values`` in ``new_task`` and may add tools with :meth:`tools_with_record`.
    """

    def __init__(self, render_mode: str | None = None, **options: Any):
        self._values: list[str] | None = None
        self._recorded: list[str] | None = None
        super().__init__(render_mode=render_mode, **options)

    @property
    def values(self) -> list[str]:
        """What the current task must record."""
        if self._values is None:
            raise RuntimeError(f"{type(self).__name__}: no task yet; call reset() first")
        return self._values

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start a new episode with nothing recorded."""
        self._recorded = None
        return super().reset(seed=seed, options=options)

    def tools_with_record(self, *tools: Tool) -> ToolSet:
        """``tools`` and ``record_values``, whose list this env scores."""

        def keep(values: list[str]) -> None:
            self._recorded = values

        return ToolSet([*tools, record_values_tool(keep)])

    def on_tool_results(self, turn: ParsedTurn, results: list[ToolResult]) -> Transition:
        """Score the first recorded list and end the episode; other calls get their answers back."""
        messages = [r.to_message() for r in results]
        if self._recorded is None:
            return Transition(messages=messages)
        exact = self._recorded == self.values
        info = {"copied": sum(a == b for a, b in zip(self._recorded, self.values, strict=False))}
        return Transition(messages=messages, reward=1.0 if exact else 0.0, terminated=True, info=info)


class RetailCopyEnv(RecordingDrill):
    """Repeat a list of Retail values to the ``record_values`` tool (see the module docstring).

    Args:
        render_mode: ``None`` or ``"ansi"``.
        **options: :class:`RetailCopyConfig` options.
    """

    config_model = RetailCopyConfig
    config: RetailCopyConfig

    def build_tools(self) -> ToolSet:
        """One tool, ``record_values(values)``."""
        return self.tools_with_record()

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """Draw a store, the values and how they are written (reset takes no options)."""
        if options:
            raise ValueError(f"RetailCopyEnv.reset takes no options, got {sorted(options)}")
        rng = self.np_random
        db = drill_store(rng, self.config.stores)
        pool = store_values(db)
        k = int(rng.integers(self.config.min_values, self.config.max_values + 1))
        self._values = [pool[i] for i in rng.choice(len(pool), size=min(k, len(pool)), replace=False)]
        style = STYLES[int(rng.integers(len(STYLES)))]
        opening = OPENINGS[int(rng.integers(len(OPENINGS)))]
        text = opening.format(values=render_values(self._values, style))
        return f"retail-copy-{int(rng.integers(10**9)):09d}", [system(SYSTEM_PROMPT), user(text)]

    def on_message(self, text: str) -> Transition:
        """A turn without a call: ask for the call."""
        return Transition(messages=[user("Please pass the values to record_values.")])

    def oracle(self) -> Policy:
        """Calls ``record_values`` with the list."""
        return _CopyOracle(list(self.values))


class _CopyOracle:
    def __init__(self, values: list[str]):
        self.values = values

    def act(self, history: Sequence[Message]) -> str:
        return format_tool_call("record_values", {"values": self.values})
