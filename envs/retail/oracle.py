"""A scripted agent that solves every ``srt/Retail-v0`` task the way a careful human agent would.

It is a slot-filling policy recomputed from the visible conversation at every turn: it reads the
customer's messages (email, name and zip code, order id, items, reason, refund choice) and the tool
outputs (user, order, product records), and takes the first step still missing: identify,
authenticate, look up, ask, propose and wait for "yes", act, report. The hidden task tells it only
what the customer asked for in the opening message (the kind of request and whether an amount was
requested), so its transcripts are demonstrations a model can learn from what it sees.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from srt_agent.chat.messages import Message
from srt_agent.envs.retail.db import describe_item
from srt_agent.envs.retail.tasks import Task
from srt_agent.envs.retail.tools import WRITE_TOOLS
from srt_agent.tooling.parser import format_tool_call, parse_tool_calls
from srt_agent.tooling.toolset import is_error_message

_EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+\w")
_NAME_RE = re.compile(r"(?:name is|I'm|I am)\s+([A-Z][a-z]+)\s+([A-Z][a-z]+)")
_ZIP_RE = re.compile(r"zip code(?: is)?\s+(\d{5})")
_ORDER_RE = re.compile(r"#W\d{7}")
PROPOSAL_END = "Do you confirm (yes/no)?"
"""How every proposal ends: the customer is asked for a yes or a no."""
_ANYTHING_ELSE = "Is there anything else I can help you with?"


def _money(x: float) -> str:
    return f"${x:,.2f}"


@dataclass
class _View:
    """What the conversation has shown so far, as the oracle needs it."""

    user_texts: list[str] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)  # tool name -> last successful output
    last_agent_text: str = ""  # the latest assistant turn without tool calls
    last_user: str = ""

    @classmethod
    def of(cls, history: Sequence[Message]) -> _View:
        v = cls()
        for m in history:
            if m.role == "user":
                v.user_texts.append(m.content)
                v.last_user = m.content
            elif m.role == "assistant" and not parse_tool_calls(m.content).has_calls:
                v.last_agent_text = m.content
            elif m.role == "tool" and m.name and not is_error_message(m):
                try:
                    v.outputs[m.name] = json.loads(m.content)
                except json.JSONDecodeError:  # find_user_id_* answer a bare id
                    v.outputs[m.name] = m.content.strip()
        return v

    def said(self, phrase: str) -> bool:
        """The customer wrote ``phrase`` (case-insensitive) in some message."""
        return any(phrase.lower() in t.lower() for t in self.user_texts)

    def first(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        return next((m for t in self.user_texts if (m := pattern.search(t))), None)


def last_outputs(history: Sequence[Message]) -> dict[str, Any]:
    """Each tool's last successful output in ``history`` (decoded JSON; a bare id as text)."""
    return _View.of(history).outputs


def _call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


class RetailOracle:
    """Scripted agent for one episode (see the module docstring).

    Args:
        task: The episode's task; only its kind, info topic and ``wants_amount`` are used, all of
            which the customer's opening message states.
    """

    def __init__(self, task: Task):
        self.topic = task.info_topic if task.kind == "info" and task.info_topic else task.kind

    def act(self, history: Sequence[Message]) -> str:
        """The next assistant turn: one question, one tool call, one proposal or one report."""
        v = _View.of(history)
        user_id = v.outputs.get("find_user_id_by_email") or v.outputs.get("find_user_id_by_name_zip")
        if user_id is None:
            return self._authenticate(v)
        user = v.outputs.get("get_user_details")
        if user is None:
            return _call("get_user_details", user_id=user_id)
        if self.topic == "price":
            return self._price(v)
        order_match = v.first(_ORDER_RE)
        if order_match is None:
            return (
                f"Thank you, {user['first_name']}, your account is verified. Which order is this about? "
                "Please give me the order ID; it starts with #W."
            )
        order = v.outputs.get("get_order_details")
        if order is None or order["order_id"] != order_match.group(0):
            return _call("get_order_details", order_id=order_match.group(0))
        if self.topic == "status":
            return f"Your order {order['order_id']} is currently {order['status']}. {_ANYTHING_ELSE}"
        if self.topic == "total":
            return (
                f"For order {order['order_id']} you paid a total of {_money(order['total'])}, "
                f"charged to {order['payment_method_id']}. {_ANYTHING_ELSE}"
            )
        write = next((v.outputs[t] for t in WRITE_TOOLS if t in v.outputs), None)
        if write is not None:
            return self._report(write)
        if self.topic == "cancel":
            return self._cancel(v, order)
        return self._return_or_exchange(v, user, order)

    # ---------------------------------------------------------------- steps
    def _authenticate(self, v: _View) -> str:
        email = v.first(_EMAIL_RE)
        if email is not None:
            return _call("find_user_id_by_email", email=email.group(0))
        name, zip_code = v.first(_NAME_RE), v.first(_ZIP_RE)
        if name is not None and zip_code is not None:
            return _call(
                "find_user_id_by_name_zip",
                first_name=name.group(1),
                last_name=name.group(2),
                zip=zip_code.group(1),
            )
        return (
            "I'd be happy to help with that. First, I need to verify your identity. Could you give me the "
            "email address on your account, or your first name, last name and zip code?"
        )

    def _confirmed(self, v: _View) -> bool:
        """The customer just said yes to the proposal made in the previous turn."""
        return v.last_agent_text.endswith(PROPOSAL_END) and v.last_user.lower().startswith("yes")

    def _cancel(self, v: _View, order: dict[str, Any]) -> str:
        oid = order["order_id"]
        reason = (
            "ordered by mistake"
            if v.said("by mistake")
            else "no longer needed"
            if v.said("no longer need")
            else None
        )
        if reason is None:
            items = ", ".join(describe_item(i["name"], i["options"]) for i in order["items"])
            return (
                f"I see order {oid} ({items}) is {order['status']}. Could you tell me the reason for the "
                "cancellation: is it no longer needed, or was it ordered by mistake?"
            )
        if self._confirmed(v):
            return _call("cancel_pending_order", order_id=oid, reason=reason)
        return (
            f"Here is what I'll do: cancel order {oid} with the reason '{reason}'. The total of "
            f"{_money(order['total'])} will be refunded to the original payment method, "
            f"{order['payment_method_id']}. {PROPOSAL_END}"
        )

    def _refund_target(
        self, v: _View, user: dict[str, Any], order: dict[str, Any], charge: float
    ) -> str | None:
        """The payment method for the refund or difference, ``None`` while the customer must choose."""
        original = str(order["payment_method_id"])
        gift = next((p for p in user["payment_methods"] if p["kind"] == "gift_card"), None)
        if gift is None or gift["id"] == original or charge > gift.get("balance", 0.0):
            return original  # no real choice to offer
        if v.said("gift card"):
            return str(gift["id"])
        if v.said("original payment method"):
            return original
        return None

    def _return_or_exchange(self, v: _View, user: dict[str, Any], order: dict[str, Any]) -> str:
        oid = order["order_id"]
        named = [i for i in order["items"] if v.said(describe_item(i["name"], i["options"]))]
        if not named:
            listing = ", ".join(describe_item(i["name"], i["options"]) for i in order["items"])
            ask = (
                "Which items would you like to return?"
                if self.topic == "return"
                else "Which item would you like to exchange, and which variant would you like instead?"
            )
            return f"Order {oid} was {order['status']} with these items: {listing}. {ask}"
        descs = " and ".join(f"{describe_item(i['name'], i['options'])} (item {i['item_id']})" for i in named)
        charge, new = 0.0, None
        if self.topic == "exchange":
            product = v.outputs.get("get_product_details")
            if product is None or product["product_id"] != named[0]["product_id"]:
                return _call("get_product_details", product_id=named[0]["product_id"])
            new = next(
                (
                    p
                    for p in product["variants"]
                    if p["item_id"] != named[0]["item_id"]
                    and v.said(describe_item(product["name"], p["options"]))
                ),
                None,
            )
            if new is None:
                return f"Which variant of the {product['name']} would you like instead?"
            charge = round(new["price"] - named[0]["price"], 2)
        target = self._refund_target(v, user, order, charge)
        if target is None:
            gift = next(p["id"] for p in user["payment_methods"] if p["kind"] == "gift_card")
            options = f"the original payment method ({order['payment_method_id']}) or your gift card ({gift})"
            if self.topic == "return":
                return f"Should the refund go to {options}?"
            return f"For the price difference, should I use {options}?"
        if self._confirmed(v):
            item_ids = [i["item_id"] for i in named]
            if new is None:
                return _call(
                    "return_delivered_order_items", order_id=oid, item_ids=item_ids, payment_method_id=target
                )
            return _call(
                "exchange_delivered_order_items",
                order_id=oid,
                item_ids=item_ids,
                new_item_ids=[new["item_id"]],
                payment_method_id=target,
            )
        if new is None:
            refund = sum(i["price"] for i in named)
            money_line = f"The refund of {_money(refund)} will go to {target}."
            return f"Here is what I'll do: return {descs} from order {oid}. {money_line} {PROPOSAL_END}"
        new_desc = f"{describe_item(named[0]['name'], new['options'])} (item {new['item_id']})"
        return (
            f"Here is what I'll do: exchange {descs} from order {oid} for {new_desc}. "
            f"{self._difference_line(charge, target)} {PROPOSAL_END}"
        )

    @staticmethod
    def _difference_line(diff: float, method: str) -> str:
        if diff > 0:
            return f"The price difference of {_money(diff)} will be charged to {method}."
        if diff < 0:
            return f"The price difference of {_money(-diff)} will be refunded to {method}."
        return f"There is no price difference; {method} stays on file."

    def _report(self, result: dict[str, Any]) -> str:
        oid, status = result["order_id"], result["status"]
        if status == "cancelled":
            done = f"Your order {oid} has been cancelled."
        else:
            done = f"The {status.split()[0]} for order {oid} has been requested."
        if "refund_amount" in result:
            money_line = (
                f"{_money(result['refund_amount'])} will be refunded to {result['refund_payment_method_id']}."
            )
        else:
            money_line = self._difference_line(result["price_difference"], result["payment_method_id"])
        return f"{done} {money_line} {_ANYTHING_ELSE}"

    def _price(self, v: _View) -> str:
        ask = "Which product are you interested in, and with which options (such as color or size)?"
        types = v.outputs.get("list_all_product_types")
        if types is None:
            # Ask first; look the catalogue up once the customer has answered.
            return _call("list_all_product_types") if v.last_agent_text == ask else ask
        named = [name for name in types if v.said(name)]
        if not named:
            return ask
        product = v.outputs.get("get_product_details")
        if product is None or product["name"] != named[0]:
            return _call("get_product_details", product_id=types[named[0]])
        variant = next(
            (p for p in product["variants"] if v.said(describe_item(product["name"], p["options"]))), None
        )
        if variant is None:
            return f"Which options of the {product['name']} would you like to know the price of?"
        stock = "in stock" if variant["available"] else "currently out of stock"
        return (
            f"The {describe_item(product['name'], variant['options'])} costs {_money(variant['price'])} "
            f"and is {stock}. {_ANYTHING_ELSE}"
        )
