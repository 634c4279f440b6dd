"""The store's write operations and their domain rules, as pure functions over a :class:`Database`.

Both the tools (on the episode's live database) and the task sampler (to build the goal database)
call these, so the goal state is by construction exactly what the correct tool calls produce. Each
operation checks every rule before it changes anything: a refused call leaves the database as it was.
Authentication, ownership and the user's confirmation are the session's business (``tools.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

from srt_agent.envs.retail.db import Database, Order, Payment, PaymentMethod, User, money
from srt_agent.errors import SrtAgentError

CancelReason = Literal["no longer needed", "ordered by mistake"]
"""A cancellation's reason: the cancel tool's parameter type, so its schema carries the ``enum``."""
CANCEL_REASONS: tuple[CancelReason, ...] = get_args(CancelReason)


class RetailError(SrtAgentError, ValueError):
    """A request broke a store rule; the message tells the agent which and why."""


def get_order(db: Database, order_id: str) -> Order:
    """The order with this id.

    Raises:
        RetailError: No such order (ids look like '#W1234567').
    """
    order = db.orders.get(order_id)
    if order is None:
        raise RetailError(f"order {order_id!r} not found (order ids look like '#W1234567')")
    return order


def _refund_method(db: Database, order: Order, method_id: str) -> PaymentMethod:
    """The method a refund or price difference may go to: the original one or the user's gift card."""
    user: User = db.users[order.user_id]
    method = user.payment_method(method_id)
    if method is None:
        owned = ", ".join(p.id for p in user.payment_methods)
        raise RetailError(f"payment method {method_id!r} is not one of the user's ({owned})")
    if method.id != order.payment_method_id and method.kind != "gift_card":
        raise RetailError(
            f"refunds go to the original payment method ({order.payment_method_id}) or a gift card, "
            f"not {method_id}"
        )
    return method


def _move_money(order: Order, method: PaymentMethod, amount: float) -> None:
    """Record ``amount`` (>0 charge, <0 refund) on the order; gift card balances change at once."""
    amount = money(amount)
    if amount == 0:
        return
    kind: Literal["payment", "refund"] = "payment" if amount > 0 else "refund"
    order.payment_history.append(Payment(kind=kind, amount=abs(amount), payment_method_id=method.id))
    if method.kind == "gift_card":
        method.balance = money((method.balance or 0.0) - amount)


def _check_items(order: Order, item_ids: Sequence[str]) -> None:
    if not item_ids:
        raise RetailError("item_ids is empty: name at least one item of the order")
    if len(set(item_ids)) != len(item_ids):
        raise RetailError(f"item_ids has duplicates: {list(item_ids)}")
    for item_id in item_ids:
        if order.item(item_id) is None:
            have = ", ".join(i.item_id for i in order.items)
            raise RetailError(f"item {item_id} is not in order {order.order_id} (its items: {have})")


def cancel_pending_order(db: Database, order_id: str, reason: str) -> dict[str, Any]:
    """Cancel a pending order and refund its total to the original payment method.

    Raises:
        RetailError: Unknown order, order not pending, or a reason other than :data:`CANCEL_REASONS`.
    """
    order = get_order(db, order_id)
    if order.status != "pending":
        raise RetailError(f"order {order_id} is {order.status}; only pending orders can be cancelled")
    if reason not in CANCEL_REASONS:
        raise RetailError(f"reason must be one of {list(CANCEL_REASONS)}, got {reason!r}")
    method = _refund_method(db, order, order.payment_method_id)
    order.status = "cancelled"
    order.cancel_reason = reason
    _move_money(order, method, -order.total)
    return {
        "order_id": order_id,
        "status": order.status,
        "refund_amount": order.total,
        "refund_payment_method_id": method.id,
    }


def return_delivered_order_items(
    db: Database, order_id: str, item_ids: Sequence[str], payment_method_id: str
) -> dict[str, Any]:
    """Request the return of some items of a delivered order; their price is refunded.

    Raises:
        RetailError: Unknown order, order not delivered, items not in the order, or a refund
            method that is neither the original one nor a gift card of the user.
    """
    order = get_order(db, order_id)
    if order.status != "delivered":
        raise RetailError(f"order {order_id} is {order.status}; only delivered orders can be returned")
    _check_items(order, item_ids)
    method = _refund_method(db, order, payment_method_id)
    refund = money(sum(i.price for i in order.items if i.item_id in item_ids))
    order.status = "return requested"
    order.return_item_ids = sorted(item_ids)
    _move_money(order, method, -refund)
    return {
        "order_id": order_id,
        "status": order.status,
        "returned_item_ids": order.return_item_ids,
        "refund_amount": refund,
        "refund_payment_method_id": method.id,
    }


def exchange_delivered_order_items(
    db: Database, order_id: str, item_ids: Sequence[str], new_item_ids: Sequence[str], payment_method_id: str
) -> dict[str, Any]:
    """Request the exchange of items of a delivered order for other variants of the same products.

    ``new_item_ids[i]`` replaces ``item_ids[i]``. The price difference (new minus old) is charged
    to, or refunded to, ``payment_method_id``.

    Raises:
        RetailError: Unknown order, order not delivered, items not in the order, a new item that is
            not an available variant of the same product, a refund method that is neither the
            original one nor a gift card, or a gift card balance too small for the difference.
    """
    order = get_order(db, order_id)
    if order.status != "delivered":
        raise RetailError(f"order {order_id} is {order.status}; only delivered orders can be exchanged")
    _check_items(order, item_ids)
    if len(new_item_ids) != len(item_ids):
        raise RetailError(
            f"new_item_ids must pair up with item_ids ({len(item_ids)} items), got {len(new_item_ids)}"
        )
    diff = 0.0
    for old_id, new_id in zip(item_ids, new_item_ids, strict=True):
        old = order.item(old_id)
        assert old is not None  # checked by _check_items
        found = db.find_variant(new_id)
        if found is None or found[0].product_id != old.product_id:
            raise RetailError(f"new item {new_id} is not a variant of {old.name} (product {old.product_id})")
        if new_id == old_id:
            raise RetailError(f"new item {new_id} is the same variant as the one being exchanged")
        if not found[1].available:
            raise RetailError(f"new item {new_id} is not available")
        diff += found[1].price - old.price
    diff = money(diff)
    method = _refund_method(db, order, payment_method_id)
    if method.kind == "gift_card" and diff > (method.balance or 0.0):
        raise RetailError(
            f"gift card {method.id} balance {method.balance:.2f} cannot pay the difference {diff:.2f}"
        )
    pairs = sorted(zip(item_ids, new_item_ids, strict=True))
    order.status = "exchange requested"
    order.exchange_item_ids = [a for a, _ in pairs]
    order.exchange_new_item_ids = [b for _, b in pairs]
    _move_money(order, method, diff)
    return {
        "order_id": order_id,
        "status": order.status,
        "exchanged_item_ids": order.exchange_item_ids,
        "new_item_ids": order.exchange_new_item_ids,
        "price_difference": diff,
        "payment_method_id": method.id,
    }
