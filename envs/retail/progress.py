"""How far an unfinished or failed Retail episode got toward its goal, for a partial-credit reward.

τ-bench scores an episode 1 or 0, and so does ``srt/Retail-v0`` by default. For RL that is a sparse
signal: when a task is solved by every sample of a group or by none, the group's rewards are equal
and GRPO's group baseline cancels them. Partial credit tells apart two failures that differ in how
far they got, by three milestones of equal weight:

- identified: the agent authenticated the task's customer;
- proposed (write tasks): the best proposal's share of the goal's details, as the customer judges
  it (the action, the order, the reason or items, the new item, the refund's destination, checked
  in that order); the customer only confirms a proposal that is the goal, so without this a
  failed write task would almost never have changed the database;
- the outcome (:func:`task_progress`): the database, compared field by field: of the fields the
  goal changes (an order's status, its returned or exchanged items, its payment history, a gift
  card's balance), how many the final database has right, less the fields changed that the goal
  leaves alone (a wrong order touched); and the facts the customer asked for, stated or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from srt_agent.envs.retail.db import Database
from srt_agent.envs.retail.tasks import InfoItem, missing_info


def flatten_fields(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``{"orders.#W1.status": value, ...}``; lists are single fields (compared whole)."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_fields(value, path + "."))
        else:
            out[path] = value
    return out


def task_progress(
    initial: Database,
    goal: Database,
    final: Database,
    required: Iterable[InfoItem],
    agent_texts: Iterable[str],
) -> float:
    """The share of the goal reached, in [0, 1]: 1 iff the final database is the goal and every fact was told.

    Args:
        initial: The database when the episode began.
        goal: The database after the task's write operation (equal to ``initial`` for info tasks).
        final: The database when the episode ended.
        required: The facts the agent must state to the customer.
        agent_texts: Everything the agent said to the customer.
    """
    before = flatten_fields(initial.model_dump())
    want = flatten_fields(goal.model_dump())
    got = flatten_fields(final.model_dump())
    to_change = {p for p in want if want[p] != before.get(p)}
    right = sum(got.get(p) == want[p] for p in to_change)
    # Fields outside the goal's change that the episode changed (or created: a record that is not in
    # the goal at all) count against it, so a write on the wrong order does not earn credit.
    wrong = sum(got[p] != before.get(p) for p in got if p not in to_change)
    facts = list(required)
    told = len(facts) - len(missing_info(facts, agent_texts))
    total = len(to_change) + len(facts)
    if total == 0:
        return 0.0
    return float(max(0, right + told - wrong) / total)


def dialogue_progress(identified: bool, proposal: float | None, outcome: float) -> float:
    """The mean of the milestones, in [0, 1]; 1 iff every one is complete.

    Args:
        identified: The agent authenticated the task's customer.
        proposal: The best proposal's share of the goal (``None`` for an info task: no proposal).
        outcome: :func:`task_progress` of the episode.
    """
    parts = [float(identified), outcome] if proposal is None else [float(identified), proposal, outcome]
    return sum(parts) / len(parts)
