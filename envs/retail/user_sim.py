"""A rule-based customer who knows the hidden goal and reveals it only when asked.

The simulator reads each agent message for intents (keyword rules over the sentences that ask
something) and answers with templates from :mod:`phrases`, drawn with the env's ``np_random``:

* a request for confirmation (an action verb, an order id, and "confirm", "proceed", "shall I", ...)
  gets "yes" when the proposal matches the goal (order, items, reason, refund destination), else
  "no" with a correction;
* questions for identification, the order id, the items, the replacement, the reason or the refund
  destination get exactly that detail (several questions in one message get several answers);
* once the goal action was done and the facts asked for were told, any message without a question
  ends the conversation with a goodbye carrying ``###STOP###``;
* "anything else?" before that gets what is still missing; anything else gets the need restated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from srt_agent.envs.retail import phrases
from srt_agent.envs.retail.actions import CANCEL_REASONS
from srt_agent.envs.retail.db import Database, describe_item
from srt_agent.envs.retail.tasks import Task, missing_info

ORDER_ID_RE = re.compile(r"#W\d{7}")
_GOAL_TOOL = {
    "cancel": "cancel_pending_order",
    "return": "return_delivered_order_items",
    "exchange": "exchange_delivered_order_items",
}
_CONFIRM_CUES = (
    "confirm",
    "proceed",
    "shall i",
    "should i",
    "yes/no",
    "go ahead",
    "would you like me to",
    "do you want me to",
)
_CLOSING_CUES = ("anything else", "anything more", "something else", "further help", "other questions")
_ASK_START = re.compile(r"^(please|kindly|could|can|would|may|tell|give|share|provide|let me know)\b")
_KEYWORDS: dict[str, tuple[str, ...]] = {
    "email": ("email", "e-mail"),
    "name": ("name", "zip", "postal"),
    "ident": (
        "verify",
        "identity",
        "authenticate",
        "identify",
        "look up your account",
        "locate your account",
    ),
    "order": ("order id", "order number", "which order", "what order"),
    "items": ("which item", "which items", "what item", "what items", "which product", "what product"),
    "new": ("instead", "which variant", "which option", "replace it with", "swap it for", "exchange it for"),
    "reason": ("reason", "why"),
    "payment": (
        "payment method",
        "refund to go",
        "refund go",
        "refunded to",
        "which card",
        "price difference",
    ),
}


@dataclass(frozen=True)
class SimReply:
    """The customer's answer to one agent message.

    Attributes:
        text: What the customer says.
        affirmed: The customer confirmed a proposed action (this message is a fresh "yes").
        stop: The customer ended the conversation.
    """

    text: str
    affirmed: bool = False
    stop: bool = False


def _asking_sentences(text: str) -> str:
    """The sentences of ``text`` that ask for something (questions and polite imperatives), lowercased."""
    sentences = re.split(r"(?<=[.!?])\s+|\n+", text.strip())
    asks = [s for s in sentences if "?" in s or _ASK_START.match(s.strip().lower())]
    return " ".join(asks).lower()


def _has(text: str, words: tuple[str, ...]) -> bool:
    return any(re.search(rf"\b{re.escape(w)}\b", text) for w in words)


class UserSimulator:
    """The customer of one episode.

    Args:
        task: The hidden goal.
        db: The episode's initial database (read only: names and options of the items).
        rng: The env's generator (shared, so an episode is reproducible from its seed).
    """

    def __init__(self, task: Task, db: Database, rng: np.random.Generator):
        self.task = task
        self.rng = rng
        self.user = db.users[task.user_id]
        self.order = db.orders[task.order_id] if task.order_id else None
        self.topic = task.info_topic if task.kind == "info" and task.info_topic else task.kind
        self.action_done = False
        self.agent_texts: list[str] = []
        # The best proposal's share of the goal's details (the part of it the customer accepted).
        self.best_proposal = 0.0
        found = [db.find_variant(i) for i in (*task.item_ids, *task.new_item_ids)]
        names = [describe_item(p.name, v.options) for p, v in (f for f in found if f is not None)]
        self.item_names = names[: len(task.item_ids)]
        self.new_item_names = names[len(task.item_ids) :]

    def _say(self, pool: tuple[str, ...], **fields: str) -> str:
        return pool[int(self.rng.integers(len(pool)))].format(**fields)

    def _need(self) -> str:
        return self._say(phrases.NEEDS[self.topic])

    # ---------------------------------------------------------------- lifecycle
    def opening(self) -> str:
        """The first message: the intent, vaguely, with no ids or details."""
        greeting, intent = self._say(phrases.GREETINGS), self._say(phrases.INTENTS[self.topic])
        if not greeting.endswith(","):  # a new sentence starts
            intent = intent[0].upper() + intent[1:]
        text = f"{greeting} {intent}".strip()
        if self.task.wants_amount and self.task.required_info:
            text += " " + self._say(phrases.AMOUNT_ASKS[self.task.required_info[0].what])
        return text

    def observe_action(self, tool_name: str) -> None:
        """Hear that a write tool succeeded (the agent's report of it is taken on trust)."""
        if _GOAL_TOOL.get(self.task.kind) == tool_name:
            self.action_done = True

    def satisfied(self) -> bool:
        """The goal action happened (if any) and every fact asked for was told."""
        done = self.action_done or self.task.kind == "info"
        return done and not missing_info(self.task.required_info, self.agent_texts)

    def respond(self, text: str) -> SimReply:
        """Answer one agent message (see the module docstring for the rules)."""
        self.agent_texts.append(text)
        lower = text.lower()
        # A proposal names an action and an order; "can you confirm your email?" is just a question.
        proposes = any(v in lower for v in ("cancel", "return", "exchange")) and ORDER_ID_RE.search(text)
        if proposes and _has(lower, _CONFIRM_CUES):
            return self._confirm(text)
        answers = self._answers(_asking_sentences(text))
        if answers:
            return SimReply(" ".join(answers))
        if self.satisfied():
            return SimReply(self._say(phrases.GOODBYE), stop=True)
        if _has(lower, _CLOSING_CUES):
            return SimReply(self._still_needed())
        return SimReply(self._say(phrases.RESTATE, need=self._need()))

    def _still_needed(self) -> str:
        if self.task.kind != "info" and not self.action_done:
            return self._say(phrases.NOT_DONE, need=self._need())
        first = missing_info(self.task.required_info, self.agent_texts)[0].split("=")[0]
        return self._say(phrases.MISSING_INFO, what=phrases.WHAT[first])

    # ---------------------------------------------------------------- answers to questions
    def _answers(self, asks: str) -> list[str]:
        out = []
        if _has(asks, _KEYWORDS["email"] + _KEYWORDS["name"] + _KEYWORDS["ident"]):
            out.append(self._identify(_has(asks, _KEYWORDS["email"]), _has(asks, _KEYWORDS["name"])))
        if _has(asks, _KEYWORDS["order"]):
            oid = self.task.order_id
            out.append(self._say(phrases.ORDER_ID, order_id=oid) if oid else self._say(phrases.NO_ORDER))
        kind = self.task.kind
        if _has(asks, _KEYWORDS["items"]):
            if kind == "return":
                out.append(self._say(phrases.RETURN_ITEMS, items=" and the ".join(self.item_names)))
            elif kind == "exchange":
                out.append(self._say(phrases.EXCHANGE_ITEM, item=self.item_names[0]))
            elif kind == "cancel":
                out.append(self._say(phrases.WHOLE_ORDER))
            elif self.topic == "price":
                out.append(self._say(phrases.PRICE_ITEM, item=self.item_names[0]))
        if kind == "exchange" and _has(asks, _KEYWORDS["new"]):
            out.append(self._say(phrases.NEW_ITEM, item=self.new_item_names[0]))
        if kind == "cancel" and _has(asks, _KEYWORDS["reason"]):
            out.append(self._say(phrases.REASONS[self.task.reason or CANCEL_REASONS[0]]))
        if kind in _GOAL_TOOL and _has(asks, _KEYWORDS["payment"]):
            out.append(self._say(phrases.REFUND_TO[self.task.refund_choice or "original"]))
        return out

    def _identify(self, asked_email: bool, asked_name: bool) -> str:
        u = self.user
        by_email = phrases.EMAIL, {"email": u.email}
        by_name = phrases.NAME_ZIP, {"first": u.first_name, "last": u.last_name, "zip": u.zip}
        if asked_name and not asked_email:
            return self._say(by_name[0], **by_name[1])
        if asked_email and not asked_name and not self.task.prefers_email:
            # A customer who never remembers which email they used offers name and zip instead.
            return self._say(phrases.FORGOT_EMAIL) + self._say(by_name[0], **by_name[1])
        # Asked for both, for an email by an email person, or just to "verify": the customer's habit.
        pool, fields = by_email if self.task.prefers_email else by_name
        return self._say(pool, **fields)

    # ---------------------------------------------------------------- confirmation
    def _confirm(self, text: str) -> SimReply:
        if self.task.kind == "info":
            return SimReply(self._say(phrases.DENY, fix=self._need()))
        if self.action_done:
            return SimReply(self._say(phrases.ALREADY_DONE))
        fix, share = self._proposal_problem(text)
        self.best_proposal = max(self.best_proposal, share)
        if fix is not None:
            return SimReply(self._say(phrases.DENY, fix=fix))
        return SimReply(self._say(phrases.AFFIRM), affirmed=True)

    def _proposal_problem(self, text: str) -> tuple[str | None, float]:
        """The customer's correction (``None`` when the proposal is the goal) and the proposal's share.

        The share: of the goal's details, checked in order (action, order, reason or items, new
        item, refund), those the proposal got right before the first wrong one.
        """
        task, lower = self.task, text.lower()
        assert self.order is not None and task.order_id is not None
        checks = 3 if task.kind == "cancel" else 5 if task.kind == "exchange" else 4
        if task.kind not in lower:
            return self._need(), 0.0
        if set(ORDER_ID_RE.findall(text)) != {task.order_id}:
            return self._say(phrases.ORDER_ID, order_id=task.order_id), 1 / checks
        if task.kind == "cancel":
            named = [r for r in CANCEL_REASONS if r in lower]
            if named == [task.reason]:
                return None, 1.0
            return self._say(phrases.REASONS[task.reason or ""]), 2 / checks
        for item in self.order.items:
            mentioned = item.item_id in text or item.name.lower() in lower
            if mentioned != (item.item_id in task.item_ids):
                if task.kind == "return":
                    return self._say(
                        phrases.RETURN_ITEMS, items=" and the ".join(self.item_names)
                    ), 2 / checks
                return self._say(phrases.EXCHANGE_ITEM, item=self.item_names[0]), 2 / checks
        if task.kind == "exchange":
            new_id, new_name = task.new_item_ids[0], self.new_item_names[0]
            if new_id not in text and new_name.lower() not in lower:
                return self._say(phrases.NEW_ITEM, item=new_name), 3 / checks
        others = [p.id for p in self.user.payment_methods if p.id != task.payment_method_id]
        choice = task.refund_choice or "original"
        phrase = "gift card" if choice == "gift_card" else "original payment method"
        named_goal = (task.payment_method_id or "") in text or phrase in lower
        if not named_goal or any(o in text for o in others):
            return self._say(phrases.REFUND_TO[choice]), (checks - 1) / checks
        return None, 1.0
