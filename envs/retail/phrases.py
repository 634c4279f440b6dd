"""What the simulated customer says: template pools, one entry drawn per reply with ``np_random``.

Kept apart from the simulator's logic so the wording can grow without touching the rules. Templates
use ``str.format`` fields; every pool has several entries so transcripts differ across seeds.
Phrases the oracle must be able to read back (names, zip codes, reasons, refund choices) always
contain the same cue words (``name is``/``I'm``, ``zip code``, ``no longer need``, ``by mistake``,
``original payment method``, ``gift card``).
"""

from __future__ import annotations

STOP = "###STOP###"

GREETINGS = ("Hi.", "Hello!", "Hi there.", "Hey,", "Good morning.", "Hello,", "")

INTENTS: dict[str, tuple[str, ...]] = {
    "cancel": (
        "I need to cancel an order I placed.",
        "I'd like to cancel one of my orders, please.",
        "I want to cancel something I ordered recently.",
        "can you help me cancel an order?",
    ),
    "return": (
        "I'd like to return some items from an order that was delivered.",
        "I received my order but I want to send a few things back.",
        "I need to return something I bought.",
        "I want to return part of a delivered order.",
    ),
    "exchange": (
        "I'd like to exchange an item I received for a different version of it.",
        "something I got doesn't suit me and I'd like to swap it for another option.",
        "can I exchange an item from one of my orders?",
        "I want to exchange a product I received for a different variant.",
    ),
    "status": (
        "I'd like to know the status of one of my orders.",
        "can you tell me what's happening with my order?",
        "I want to check on an order of mine.",
    ),
    "total": (
        "I need to know how much I paid for one of my orders.",
        "could you tell me the total I was charged for an order?",
        "I'm trying to figure out what I paid for an order.",
    ),
    "price": (
        "I'm thinking about buying something and I'd like to know its price.",
        "could you check the price of a product for me?",
        "how much does one of your products cost?",
    ),
}

AMOUNT_ASKS: dict[str, tuple[str, ...]] = {
    "refund amount": (
        "Please also tell me how much I'll get back.",
        "I'd also like to know how much the refund will be.",
        "And how much money will I get back?",
    ),
    "price difference": (
        "Please also tell me the price difference.",
        "I'd also like to know how much the difference in price is.",
    ),
}

# What the customer still wants, restated when the agent is unclear or declares victory too early.
NEEDS: dict[str, tuple[str, ...]] = {
    "cancel": ("I want to cancel an order.", "I just need one of my orders cancelled."),
    "return": ("I want to return some items from a delivered order.", "I'd like to send some items back."),
    "exchange": (
        "I want to exchange an item for a different variant.",
        "I'd like to swap an item I received.",
    ),
    "status": ("I'd like to know the status of my order.", "I just want to know where my order stands."),
    "total": ("I want to know how much I paid for an order.", "I need the total I paid for an order."),
    "price": ("I want to know the price of a product.", "I'd just like to know what something costs."),
}

RESTATE = (
    "Sorry, I'm not sure what you mean. {need}",
    "I think there's a misunderstanding. {need}",
    "Hmm, that's not what I asked about. {need}",
    "Let me say it again: {need}",
    "{need} Can you help me with that?",
)

NOT_DONE = (
    "Actually, my request isn't taken care of yet. {need}",
    "Not yet, sorry. {need}",
    "Well, we're not done. {need}",
)

MISSING_INFO = (
    "Yes, one thing: you haven't told me {what}.",
    "Before I go, could you tell me {what}?",
    "Actually, I still don't know {what}.",
)

WHAT: dict[str, str] = {
    "refund amount": "how much the refund is",
    "price difference": "what the price difference is",
    "order status": "what the status of my order is",
    "total paid": "how much I paid",
    "price": "how much it costs",
}

EMAIL = (
    "Sure, my email is {email}.",
    "It's {email}.",
    "You can find me under {email}.",
    "My email is {email}.",
)
NAME_ZIP = (
    "My name is {first} {last} and my zip code is {zip}.",
    "Sure, I'm {first} {last}, zip code {zip}.",
    "I'm {first} {last}. My zip code is {zip}.",
    "The name is {first} {last}, and the zip code is {zip}.",
)
FORGOT_EMAIL = (
    "I don't remember which email I used. ",
    "I'm not sure which email is on the account. ",
)

ORDER_ID = (
    "It's {order_id}.",
    "The order ID is {order_id}.",
    "Sure, it's order {order_id}.",
    "I believe it's {order_id}.",
)
NO_ORDER = ("It's not about an order; I want to know the price of a product.",)

RETURN_ITEMS = (
    "I want to return the {items}.",
    "The {items}, please.",
    "I'd like to send back the {items}.",
)
EXCHANGE_ITEM = ("It's the {item} I want to exchange.", "The {item}.", "I'd like to exchange the {item}.")
NEW_ITEM = (
    "I'd like the {item} instead.",
    "Could I get the {item} instead?",
    "I want the {item} in exchange.",
)
PRICE_ITEM = ("The {item}.", "I'm interested in the {item}.", "It's the {item}.")
WHOLE_ORDER = ("The whole order, please.", "All of it: I want the entire order cancelled.")

REASONS: dict[str, tuple[str, ...]] = {
    "no longer needed": (
        "I no longer need it.",
        "I realised I no longer need it.",
        "Honestly, I no longer need it.",
    ),
    "ordered by mistake": (
        "I ordered it by mistake.",
        "It was ordered by mistake.",
        "I placed it by mistake.",
    ),
}

REFUND_TO: dict[str, tuple[str, ...]] = {
    "original": (
        "Please use the original payment method.",
        "The original payment method is fine.",
        "Just the original payment method, please.",
    ),
    "gift_card": ("Please use my gift card.", "I'd prefer my gift card.", "My gift card, please."),
}

AFFIRM = ("Yes, please go ahead.", "Yes, that's right.", "Yes, please.", "Yes, do it.", "Yes, I confirm.")
DENY = ("No, that's not right. {fix}", "No. {fix}", "No, wait. {fix}")
ALREADY_DONE = ("No, that's already been taken care of.", "No need, you already did that.")

GOODBYE = (
    "Great, that's all I needed. Thanks! " + STOP,
    "No, that's everything. Thank you for your help! " + STOP,
    "That's all, thanks. Bye! " + STOP,
    "Nothing else, thank you. Have a nice day! " + STOP,
    "Perfect, thanks a lot. Goodbye! " + STOP,
)
