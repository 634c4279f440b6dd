"""The agent's tools and the session rules around them (authentication, ownership, confirmation).

:class:`RetailSession` holds one episode's live database and what the agent has earned so far: which
user it authenticated, and whether the user's latest message confirmed a consequential action. The
tools are built once per env (``build_tools`` runs in ``__init__``) and reach the *current* session
through a getter, so a reset swaps the database under them without rebuilding the schemas.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from srt_agent.envs.retail import actions
from srt_agent.envs.retail.actions import CancelReason, RetailError
from srt_agent.envs.retail.db import Database, Order, User
from srt_agent.tooling.definition import tool
from srt_agent.tooling.toolset import ToolSet

WRITE_TOOLS = ("cancel_pending_order", "return_delivered_order_items", "exchange_delivered_order_items")


def dumps(value: Any) -> str:
    """Compact JSON, the format of every tool output (short observations, easy to parse)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class RetailSession:
    """One episode's database plus the agent's standing with the customer.

    Args:
        db: The live database (changed in place by the write tools).
    """

    def __init__(self, db: Database):
        self.db = db
        self.auth_user_id: str | None = None
        self.confirmed = False

    # ---------------------------------------------------------------- access rules
    def _authenticate(self, user: User) -> str:
        self.auth_user_id = user.user_id
        return user.user_id

    def require_user(self, user_id: str | None = None) -> User:
        """The authenticated user (who must be ``user_id`` when given).

        Raises:
            RetailError: Nobody is authenticated yet, or ``user_id`` is someone else.
        """
        if self.auth_user_id is None:
            raise RetailError(
                "the user is not authenticated: find their user id with find_user_id_by_email or "
                "find_user_id_by_name_zip first"
            )
        if user_id is not None and user_id != self.auth_user_id:
            raise RetailError(
                f"user {user_id!r} is not the authenticated user; you may only access their data"
            )
        return self.db.users[self.auth_user_id]

    def require_own_order(self, order_id: str) -> Order:
        """An order of the authenticated user.

        Raises:
            RetailError: Not authenticated, unknown order, or the order belongs to someone else.
        """
        user = self.require_user()
        order = actions.get_order(self.db, order_id)
        if order.user_id != user.user_id:
            raise RetailError(f"order {order_id} does not belong to the authenticated user")
        return order

    def write(self, order_id: str, operation: Callable[[], dict[str, Any]]) -> str:
        """Run a consequential operation if the user's latest message confirmed it.

        The confirmation is spent only when the operation succeeds, so a call refused for a rule
        (say, a wrong item id) can be corrected without asking the user again.

        Raises:
            RetailError: No confirmation, or the operation broke a rule.
        """
        self.require_own_order(order_id)
        if not self.confirmed:
            raise RetailError(
                "this action needs the user's explicit confirmation: list the action's details to the "
                "user, ask them to confirm, and call the tool only after they answer yes"
            )
        out = operation()
        self.confirmed = False
        return dumps(out)

    # ---------------------------------------------------------------- read operations
    def find_by_email(self, email: str) -> str:
        """Authenticate by email; returns the user id."""
        needle = email.strip().lower()
        for user in self.db.users.values():
            if user.email == needle:
                return self._authenticate(user)
        raise RetailError(f"no user with email {email!r}")

    def find_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Authenticate by full name and zip code; returns the user id."""
        key = (first_name.strip().lower(), last_name.strip().lower(), zip.strip())
        for user in self.db.users.values():
            if (user.first_name.lower(), user.last_name.lower(), user.zip) == key:
                return self._authenticate(user)
        raise RetailError(f"no user named {first_name} {last_name} with zip code {zip}")

    def user_details(self, user_id: str) -> str:
        """The authenticated user's profile, payment methods and order ids."""
        user = self.require_user(user_id)
        return dumps(user.model_dump(exclude_none=True))

    def order_details(self, order_id: str) -> str:
        """One of the authenticated user's orders."""
        order = self.require_own_order(order_id)
        data = order.model_dump(exclude_defaults=True)
        data["total"] = order.total
        return dumps(data)

    def product_types(self) -> str:
        """Product names mapped to product ids."""
        return dumps({p.name: p.product_id for p in self.db.products.values()})

    def product_details(self, product_id: str) -> str:
        """A product's variants with options, price and availability."""
        product = self.db.products.get(product_id.strip())
        if product is None:
            raise RetailError(f"product {product_id!r} not found; list_all_product_types gives the ids")
        return dumps(product.model_dump())


def build_toolset(session: Callable[[], RetailSession]) -> ToolSet:
    """The retail tools, each acting on ``session()`` (the env's current episode).

    Args:
        session: Returns the live session; raises if no episode is running.
    """

    @tool
    def find_user_id_by_email(email: str) -> str:
        """Find a user's id by their email address; this authenticates the user.

        Args:
            email: The user's email, e.g. 'emma.smith12@example.com'.
        """
        return session().find_by_email(email)

    @tool
    def find_user_id_by_name_zip(first_name: str, last_name: str, zip: str) -> str:
        """Find a user's id by first name, last name and zip code; this authenticates the user.

        Args:
            first_name: The user's first name, e.g. 'Emma'.
            last_name: The user's last name, e.g. 'Smith'.
            zip: The user's 5-digit zip code.
        """
        return session().find_by_name_zip(first_name, last_name, zip)

    @tool
    def get_user_details(user_id: str) -> str:
        """Get the authenticated user's profile: name, email, payment methods and order ids.

        Args:
            user_id: The authenticated user's id.
        """
        return session().user_details(user_id)

    @tool
    def get_order_details(order_id: str) -> str:
        """Get an order of the authenticated user: status, items, payment method and history, total.

        Args:
            order_id: The order id, e.g. '#W1234567' (with the '#').
        """
        return session().order_details(order_id)

    @tool
    def list_all_product_types() -> str:
        """List the store's product names with their product ids."""
        return session().product_types()

    @tool
    def get_product_details(product_id: str) -> str:
        """Get a product's variants: item id, options, price and availability.

        Args:
            product_id: The product id (see list_all_product_types or an order's items).
        """
        return session().product_details(product_id)

    @tool
    def cancel_pending_order(order_id: str, reason: CancelReason) -> str:
        """Cancel a pending order (needs the user's confirmation); its total is refunded.

        Args:
            order_id: The order id, e.g. '#W1234567'.
            reason: 'no longer needed' or 'ordered by mistake'.
        """
        s = session()
        return s.write(order_id, lambda: actions.cancel_pending_order(s.db, order_id, reason))

    @tool
    def return_delivered_order_items(order_id: str, item_ids: list[str], payment_method_id: str) -> str:
        """Return items of a delivered order (needs the user's confirmation); their price is refunded.

        Args:
            order_id: The order id, e.g. '#W1234567'.
            item_ids: The item ids to return.
            payment_method_id: Where the refund goes: the original payment method or a gift card.
        """
        s = session()
        return s.write(
            order_id,
            lambda: actions.return_delivered_order_items(s.db, order_id, item_ids, payment_method_id),
        )

    @tool
    def exchange_delivered_order_items(
        order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> str:
        """Exchange delivered items for available variants of the same products (needs user confirmation).

        Args:
            order_id: The order id, e.g. '#W1234567'.
            item_ids: The item ids to exchange.
            new_item_ids: The replacement item ids, in the same order as item_ids.
            payment_method_id: Pays or receives the price difference: the original method or a gift card.
        """
        s = session()
        return s.write(
            order_id,
            lambda: actions.exchange_delivered_order_items(
                s.db, order_id, item_ids, new_item_ids, payment_method_id
            ),
        )

    return ToolSet(
        [
            find_user_id_by_email,
            find_user_id_by_name_zip,
            get_user_details,
            get_order_details,
            list_all_product_types,
            get_product_details,
            cancel_pending_order,
            return_delivered_order_items,
            exchange_delivered_order_items,
        ]
    )
