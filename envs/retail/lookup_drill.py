"""``srt/RetailLookup-v0``: read a Retail record and pass on the id of the thing the customer named.

After copying (``srt/RetailCopy-v0``), the other skill every Retail task needs is a look-up in a
tool's JSON: the product id of the item the customer named, the item id of the variant whose
options they want, the id of the payment method they chose. Retail builds learned to copy but
reproduced none of these look-ups (0 of 14 product ids in every build, docs/retail.md): the id to
write is not the one that comes next in the context but the one beside a name found earlier.

This env isolates the look-up in two turns. The customer names a record (an order id, a product id
or a user id) and something in it (an item by its name and options, a variant by its options, a
payment method by its kind); the agent reads the record with the Retail tool that shows it
(``get_order_details``, ``get_product_details``, ``get_user_details``; the same JSON as in Retail)
and passes the wanted ids, in the order named, to ``record_values``. Reward 1 iff the first recorded
list is exact; the episode ends with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

from srt_agent.chat.messages import Message, system, user
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import Transition
from srt_agent.envs.retail.copy_drill import DrillStoreConfig, RecordingDrill, drill_store
from srt_agent.envs.retail.db import Database, User, describe_item
from srt_agent.envs.retail.tools import RetailSession
from srt_agent.tooling.definition import tool
from srt_agent.tooling.parser import format_tool_call
from srt_agent.tooling.toolset import ToolSet

SYSTEM_PROMPT = (
    "The user names a store record and something in it. Read the record with its tool, then pass the ids "
    "the user asked for, in the order asked, to record_values."
)
LookupKind = Literal["product", "items", "variant", "payment"]
LOOKUP_KINDS: tuple[LookupKind, ...] = ("product", "items", "variant", "payment")
"""What is looked up: an order item's product id, order items' item ids, a product variant's item
id, or a user's payment method id."""
_OPENINGS: dict[LookupKind, tuple[str, ...]] = {
    "product": (
        "In order {record}, which product is the {what}? Please record its product id.",
        "Order {record} has the {what}. Record the product id of it.",
    ),
    "items": (
        "In order {record}, please record the item ids of the {what}.",
        "Order {record}: record the item ids of the {what}.",
    ),
    "variant": (
        "Product {record}: please record the item id of the {what}.",
        "I want the {what}. Record its item id; the product is {record}.",
    ),
    "payment": (
        "My user id is {record}. Please record the id of {what}.",
        "User {record}: record the id of {what}.",
    ),
}


class RetailLookupConfig(DrillStoreConfig):
    """Options of ``srt/RetailLookup-v0``."""

    max_turns: int = Field(3, ge=1, le=1000, description="Assistant turns before the episode is truncated.")


class RetailLookupEnv(RecordingDrill):
    """Read a record, record the named ids (see the module docstring).

    Args:
        render_mode: ``None`` or ``"ansi"``.
        **options: :class:`RetailLookupConfig` options.
    """

    config_model = RetailLookupConfig

    config: RetailLookupConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        self._read: tuple[str, dict[str, str]] | None = None
        self._session = RetailSession(Database(users={}, products={}, orders={}))
        super().__init__(render_mode=render_mode, **options)

    def build_tools(self) -> ToolSet:
        """Retail's three record readers (the customer's records readable) and ``record_values``."""

        @tool
        def get_user_details(user_id: str) -> str:
            """Get a user's profile, payment methods and order ids.

            Args:
                user_id: The user id, e.g. 'emma_smith_1234'.
            """
            return self._session.user_details(user_id)

        @tool
        def get_order_details(order_id: str) -> str:
            """Get an order's status, items (item id, product id, name, options, price) and payments.

            Args:
                order_id: The order id, e.g. '#W1234567'.
            """
            return self._session.order_details(order_id)

        @tool
        def get_product_details(product_id: str) -> str:
            """Get a product's variants: item id, options, price and availability.

            Args:
                product_id: The product id, e.g. '1234567890'.
            """
            return self._session.product_details(product_id)

        return self.tools_with_record(get_user_details, get_order_details, get_product_details)

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """Draw a store, a record in it and what to look up (reset takes no options)."""
        if options:
            raise ValueError(f"RetailLookupEnv.reset takes no options, got {sorted(options)}")
        rng = self.np_random
        db = drill_store(rng, self.config.stores)
        kind = LOOKUP_KINDS[int(rng.integers(len(LOOKUP_KINDS)))]
        customer = list(db.users.values())[int(rng.integers(len(db.users)))]
        self._session = RetailSession(db)
        self._session.auth_user_id = customer.user_id  # the customer's own records are readable
        record, what = self._draw(db, customer, kind, rng)
        opening = _OPENINGS[kind][int(rng.integers(len(_OPENINGS[kind])))]
        text = opening.format(record=record, what=what)
        return f"retail-lookup-{kind}-{int(rng.integers(10**9)):09d}", [system(SYSTEM_PROMPT), user(text)]

    def _draw(
        self, db: Database, customer: User, kind: LookupKind, rng: np.random.Generator
    ) -> tuple[str, str]:
        """Set the read call and the answer; return the record id and how the customer names the target."""
        if kind == "payment":
            method = customer.payment_methods[int(rng.integers(len(customer.payment_methods)))]
            self._read = ("get_user_details", {"user_id": customer.user_id})
            self._values = [method.id]
            names = {"paypal": "my PayPal account", "gift_card": "my gift card"}
            what = names.get(method.kind, f"my credit card ending in {method.last_four}")
            return customer.user_id, what
        if kind == "variant":
            product = list(db.products.values())[int(rng.integers(len(db.products)))]
            variant = product.variants[int(rng.integers(len(product.variants)))]
            self._read = ("get_product_details", {"product_id": product.product_id})
            self._values = [variant.item_id]
            return product.product_id, describe_item(product.name, variant.options)
        order = db.orders[customer.order_ids[int(rng.integers(len(customer.order_ids)))]]
        self._read = ("get_order_details", {"order_id": order.order_id})
        if kind == "product":
            item = order.items[int(rng.integers(len(order.items)))]
            self._values = [item.product_id]
            return order.order_id, describe_item(item.name, item.options)
        picked = rng.choice(
            len(order.items), size=int(rng.integers(1, min(2, len(order.items)) + 1)), replace=False
        )
        items = [order.items[int(i)] for i in picked]
        self._values = [i.item_id for i in items]
        return order.order_id, " and the ".join(describe_item(i.name, i.options) for i in items)

    def on_message(self, text: str) -> Transition:
        """A turn without a call: ask for the look-up."""
        return Transition(messages=[user("Please look it up and pass the ids to record_values.")])

    def oracle(self) -> Policy:
        """Reads the record, then records the ids."""
        if self._read is None:
            raise RuntimeError("RetailLookupEnv: no task yet; call reset() first")
        return _LookupOracle(
            format_tool_call(*self._read), format_tool_call("record_values", {"values": self.values})
        )


class _LookupOracle:
    def __init__(self, read: str, record: str):
        self.read, self.record = read, record

    def act(self, history: Sequence[Message]) -> str:
        return self.record if history and history[-1].role == "tool" else self.read
