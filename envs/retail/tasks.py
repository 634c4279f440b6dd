"""Tasks: what the simulated customer wants, and the hidden goal that decides the reward.

A :class:`Task` is frozen data drawn from the episode's database. Its goal has two parts: the
database state after the right write operation (computed with the same functions the tools run),
and the facts the agent must tell the user (:class:`InfoItem`), checked in the agent's messages.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict

from srt_agent.envs.retail import actions
from srt_agent.envs.retail.db import Database, Order, OrderStatus, User, money

TaskKind = Literal["cancel", "return", "exchange", "info"]
TASK_KINDS: tuple[TaskKind, ...] = get_args(TaskKind)
InfoTopic = Literal["status", "total", "price"]
RefundChoice = Literal["original", "gift_card"]


class InfoItem(BaseModel):
    """A fact the agent must state to the user: an amount (``number``) or a word (``text``)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["number", "text"]
    value: str
    what: str = ""


class Task(BaseModel):
    """One customer's request and its hidden goal.

    Attributes:
        kind: ``cancel``, ``return``, ``exchange`` or ``info``.
        user_id: The customer.
        prefers_email: Whether the customer identifies by email (else by name and zip code).
        order_id: The order concerned (``None`` for a product-price question).
        item_ids: Items to return or exchange; for a price question, the variant asked about.
        new_item_ids: Replacement variants, paired with ``item_ids`` (exchanges).
        reason: Cancellation reason, one of :data:`actions.CANCEL_REASONS`.
        refund_choice: Where money goes: the original payment method or the user's gift card.
        payment_method_id: The payment method id that ``refund_choice`` designates.
        info_topic: For ``info`` tasks: ``status``, ``total`` or ``price``.
        wants_amount: The customer also asks for the refund amount / price difference.
        required_info: Facts that must appear in the agent's messages to the user.
    """

    model_config = ConfigDict(frozen=True)

    kind: TaskKind
    user_id: str
    prefers_email: bool
    order_id: str | None = None
    item_ids: tuple[str, ...] = ()
    new_item_ids: tuple[str, ...] = ()
    reason: str | None = None
    refund_choice: RefundChoice | None = None
    payment_method_id: str | None = None
    info_topic: InfoTopic | None = None
    wants_amount: bool = False
    required_info: tuple[InfoItem, ...] = ()


def _amount(value: float, what: str) -> InfoItem:
    return InfoItem(kind="number", value=f"{value:.2f}", what=what)


def _pick(rng: np.random.Generator, seq: list[Order]) -> Order:
    return seq[int(rng.integers(len(seq)))]


def _orders(db: Database, status: OrderStatus) -> list[Order]:
    return [o for o in db.orders.values() if o.status == status]


def _ensure_order(db: Database, rng: np.random.Generator, status: OrderStatus) -> Order:
    """An order with ``status``; when the draw produced none, one order is switched to it.

    Switching happens before the goal is computed, so the database stays consistent.
    """
    found = _orders(db, status)
    if found:
        return _pick(rng, found)
    order = _pick(rng, [o for o in db.orders.values() if o.status != "cancelled"])
    order.status = status
    return order


def _refund_target(rng: np.random.Generator, user: User, order: Order) -> tuple[RefundChoice, str]:
    gift = user.gift_card()
    if gift is not None and gift.id != order.payment_method_id and rng.random() < 0.5:
        return "gift_card", gift.id
    return "original", order.payment_method_id


def sample_task(rng: np.random.Generator, db: Database, kind: TaskKind) -> Task:
    """Draw a task of ``kind`` that can be completed in ``db`` (which may be adjusted slightly).

    Args:
        rng: The env's generator.
        db: The episode's initial database.
        kind: The task kind.

    Returns:
        The task, with its ``required_info`` filled in.
    """
    prefers_email = bool(rng.random() < 0.5)
    wants_amount = bool(rng.random() < 0.5)
    if kind == "cancel":
        return _sample_cancel(rng, db, prefers_email, wants_amount)
    if kind == "return":
        return _sample_return(rng, db, prefers_email, wants_amount)
    if kind == "exchange":
        return _sample_exchange(rng, db, prefers_email, wants_amount)
    return _sample_info_task(rng, db, prefers_email)


def _sample_cancel(rng: np.random.Generator, db: Database, prefers_email: bool, wants_amount: bool) -> Task:
    order = _ensure_order(db, rng, "pending")
    return Task(
        kind="cancel",
        user_id=order.user_id,
        prefers_email=prefers_email,
        order_id=order.order_id,
        reason=actions.CANCEL_REASONS[int(rng.integers(2))],
        refund_choice="original",
        payment_method_id=order.payment_method_id,
        wants_amount=wants_amount,
        required_info=(_amount(order.total, "refund amount"),) if wants_amount else (),
    )


def _sample_return(rng: np.random.Generator, db: Database, prefers_email: bool, wants_amount: bool) -> Task:
    order = _ensure_order(db, rng, "delivered")
    choice, method_id = _refund_target(rng, db.users[order.user_id], order)
    n = int(rng.integers(1, len(order.items) + 1))
    picked = sorted(rng.choice(len(order.items), size=n, replace=False).tolist())
    refund = money(sum(order.items[i].price for i in picked))
    return Task(
        kind="return",
        user_id=order.user_id,
        prefers_email=prefers_email,
        order_id=order.order_id,
        item_ids=tuple(order.items[i].item_id for i in picked),
        refund_choice=choice,
        payment_method_id=method_id,
        wants_amount=wants_amount,
        required_info=(_amount(refund, "refund amount"),) if wants_amount else (),
    )


def _sample_exchange(rng: np.random.Generator, db: Database, prefers_email: bool, wants_amount: bool) -> Task:
    order = _ensure_order(db, rng, "delivered")
    user = db.users[order.user_id]
    choice, method_id = _refund_target(rng, user, order)
    item = order.items[int(rng.integers(len(order.items)))]
    others = [v for v in db.products[item.product_id].variants if v.available and v.item_id != item.item_id]
    new = others[int(rng.integers(len(others)))]  # products keep >= 2 variants in stock
    diff = money(new.price - item.price)
    gift = user.gift_card()
    if choice == "gift_card" and gift is not None and diff > (gift.balance or 0.0):
        choice, method_id = "original", order.payment_method_id  # the card could not pay
    payer = user.payment_method(method_id)
    if payer is not None and payer.kind == "gift_card" and diff > (payer.balance or 0.0):
        # The order was paid by that gift card, which cannot pay the difference either: top it up
        # before the episode starts (the task must be possible; no draw, so other seeds keep
        # their episodes).
        payer.balance = money(math.ceil(diff) + 10.0)
    info = (_amount(abs(diff), "price difference"),) if wants_amount and diff != 0 else ()
    return Task(
        kind="exchange",
        user_id=user.user_id,
        prefers_email=prefers_email,
        order_id=order.order_id,
        item_ids=(item.item_id,),
        new_item_ids=(new.item_id,),
        refund_choice=choice,
        payment_method_id=method_id,
        wants_amount=bool(info),
        required_info=info,
    )


def _sample_info_task(rng: np.random.Generator, db: Database, prefers_email: bool) -> Task:
    topic: InfoTopic = ("status", "total", "price")[int(rng.integers(3))]
    if topic == "price":
        user = db.users[list(db.users)[int(rng.integers(len(db.users)))]]
        product = db.products[list(db.products)[int(rng.integers(len(db.products)))]]
        variant = product.variants[int(rng.integers(len(product.variants)))]
        return Task(
            kind="info",
            user_id=user.user_id,
            prefers_email=prefers_email,
            item_ids=(variant.item_id,),
            info_topic=topic,
            required_info=(_amount(variant.price, "price"),),
        )
    # A cancelled order's payment was refunded, so "what did I pay" only makes sense for live ones.
    pool = [o for o in db.orders.values() if topic == "status" or o.status != "cancelled"]
    order = _pick(rng, pool)
    fact = InfoItem(kind="text", value=order.status, what="order status")
    return Task(
        kind="info",
        user_id=order.user_id,
        prefers_email=prefers_email,
        order_id=order.order_id,
        info_topic=topic,
        required_info=(fact if topic == "status" else _amount(order.total, "total paid"),),
    )


def goal_database(db: Database, task: Task) -> Database:
    """The database after the task's write operation (a deep copy; ``db`` is left unchanged)."""
    goal = db.model_copy(deep=True)
    assert task.order_id is not None or task.kind == "info"
    if task.kind == "cancel":
        actions.cancel_pending_order(goal, task.order_id or "", task.reason or "")
    elif task.kind == "return":
        actions.return_delivered_order_items(
            goal, task.order_id or "", task.item_ids, task.payment_method_id or ""
        )
    elif task.kind == "exchange":
        actions.exchange_delivered_order_items(
            goal, task.order_id or "", task.item_ids, task.new_item_ids, task.payment_method_id or ""
        )
    return goal


_NUMBER_RE = re.compile(r"\d[\d,]*(?:\.\d+)?|\.\d+")


def numbers_in(text: str) -> set[float]:
    """Every number written in ``text``, read leniently: ``$1,234.5`` and ``1234.50`` are both 1234.5."""
    out = set()
    for tok in _NUMBER_RE.findall(text):
        try:
            out.add(round(float(tok.replace(",", "")), 2))
        except ValueError:  # e.g. "1,2,3.4.5" fragments
            continue
    return out


def missing_info(required: Iterable[InfoItem], agent_texts: Iterable[str]) -> list[str]:
    """The required facts that no agent message to the user states (``what=value`` strings)."""
    texts = list(agent_texts)
    numbers: set[float] = set().union(*(numbers_in(t) for t in texts)) if texts else set()
    joined = " ".join(t.lower() for t in texts)
    missing = []
    for item in required:
        if item.kind == "number":
            ok = round(float(item.value), 2) in numbers
        else:
            ok = re.search(rf"\b{re.escape(item.value.lower())}\b", joined) is not None
        if not ok:
            missing.append(f"{item.what}={item.value}")
    return missing
