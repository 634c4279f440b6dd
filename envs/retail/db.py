"""The retail store's database: records (users, products, orders) and their procedural generation.

Every episode gets its own small database drawn from the env's ``np_random``, so tasks never repeat
verbatim and nothing is memorised across seeds. The records are mutable pydantic models: tools change
them in place, and the episode's reward compares the final database with the goal database by value.
"""

from __future__ import annotations

import itertools
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

PaymentKind = Literal["credit_card", "gift_card", "paypal"]
OrderStatus = Literal[
    "pending", "processed", "delivered", "cancelled", "return requested", "exchange requested"
]


class PaymentMethod(BaseModel):
    """A stored way to pay: a credit card, a gift card (with a balance) or a PayPal account."""

    id: str = Field(description="e.g. 'credit_card_4821937' or 'gift_card_1029384'.")
    kind: PaymentKind
    last_four: str | None = Field(default=None, description="Credit cards only.")
    balance: float | None = Field(default=None, description="Gift cards only, in dollars.")


class User(BaseModel):
    """A customer account."""

    user_id: str
    first_name: str
    last_name: str
    email: str
    zip: str
    payment_methods: list[PaymentMethod]
    order_ids: list[str] = Field(default_factory=list)

    def payment_method(self, method_id: str) -> PaymentMethod | None:
        """The user's payment method with this id, if any."""
        return next((p for p in self.payment_methods if p.id == method_id), None)

    def gift_card(self) -> PaymentMethod | None:
        """The user's first gift card, if any."""
        return next((p for p in self.payment_methods if p.kind == "gift_card"), None)


class Variant(BaseModel):
    """One purchasable version of a product (an item id with fixed options)."""

    item_id: str
    options: dict[str, str]
    price: float
    available: bool


class Product(BaseModel):
    """A product type with its variants."""

    product_id: str
    name: str
    variants: list[Variant]

    def variant(self, item_id: str) -> Variant | None:
        """The variant with this item id, if any."""
        return next((v for v in self.variants if v.item_id == item_id), None)


class OrderItem(BaseModel):
    """One item of an order: a variant at the price paid."""

    item_id: str
    product_id: str
    name: str
    options: dict[str, str]
    price: float


class Payment(BaseModel):
    """A money movement on an order: a charge or a refund."""

    kind: Literal["payment", "refund"]
    amount: float
    payment_method_id: str


class Order(BaseModel):
    """An order and everything that happened to it."""

    order_id: str
    user_id: str
    status: OrderStatus
    items: list[OrderItem]
    payment_method_id: str = Field(description="The method the order was paid with.")
    payment_history: list[Payment]
    cancel_reason: str | None = None
    return_item_ids: list[str] = Field(default_factory=list)
    exchange_item_ids: list[str] = Field(default_factory=list)
    exchange_new_item_ids: list[str] = Field(default_factory=list)

    @property
    def total(self) -> float:
        """What the items cost when ordered (the amount charged at checkout)."""
        return money(sum(i.price for i in self.items))

    def item(self, item_id: str) -> OrderItem | None:
        """The order's item with this id, if any."""
        return next((i for i in self.items if i.item_id == item_id), None)


class Database(BaseModel):
    """The whole store: users, products and orders, keyed by id."""

    users: dict[str, User]
    products: dict[str, Product]
    orders: dict[str, Order]

    def find_variant(self, item_id: str) -> tuple[Product, Variant] | None:
        """The product and variant of an item id, if it exists."""
        for product in self.products.values():
            variant = product.variant(item_id)
            if variant is not None:
                return product, variant
        return None


def money(x: float) -> float:
    """Round to cents (every stored amount goes through this, so equal histories compare equal)."""
    return round(float(x), 2) + 0.0  # + 0.0 turns -0.0 into 0.0


def describe_item(name: str, options: dict[str, str]) -> str:
    """How people in the dialogue name a variant: ``"T-Shirt (color: blue, size: M)"``.

    The user simulator and the oracle share this one spelling, so the oracle can find an item the
    user named by reading the conversation (as a model must).
    """
    return f"{name} ({', '.join(f'{k}: {v}' for k, v in options.items())})"


# Product templates: name, option axes (in display order), base price. Names never contain one
# another, so naming one product in a message never looks like naming another.
CATALOG: tuple[tuple[str, dict[str, tuple[str, ...]], float], ...] = (
    ("T-Shirt", {"color": ("red", "blue", "black", "white"), "size": ("S", "M", "L", "XL")}, 25.0),
    ("Running Shoes", {"color": ("black", "white", "grey"), "size": ("8", "9", "10", "11")}, 90.0),
    ("Water Bottle", {"capacity": ("500ml", "750ml", "1000ml"), "color": ("blue", "green", "steel")}, 20.0),
    ("Desk Lamp", {"color": ("black", "white", "silver"), "bulb": ("LED", "halogen")}, 45.0),
    ("Backpack", {"color": ("black", "navy", "olive"), "size": ("small", "medium", "large")}, 60.0),
    ("Headphones", {"color": ("black", "white", "blue"), "style": ("over-ear", "in-ear")}, 120.0),
    ("Coffee Maker", {"capacity": ("4 cups", "8 cups", "12 cups"), "color": ("black", "stainless")}, 80.0),
    ("Yoga Mat", {"thickness": ("4mm", "6mm", "8mm"), "color": ("purple", "teal", "black")}, 30.0),
    ("Hiking Jacket", {"color": ("red", "green", "black"), "size": ("S", "M", "L")}, 150.0),
    ("Office Chair", {"color": ("black", "grey"), "material": ("mesh", "leather")}, 200.0),
)

FIRST_NAMES = (
    "Emma", "Liam", "Olivia", "Noah", "Ava", "Ethan", "Sophia", "Mason", "Mia", "Lucas",
    "Isabella", "Yusuf", "Aisha", "Mei", "Omar", "Lena", "Raj", "Sofia", "Daniel", "Chloe",
)  # fmt: skip
LAST_NAMES = (
    "Smith", "Garcia", "Kim", "Nguyen", "Patel", "Brown", "Silva", "Muller", "Rossi", "Khan",
    "Lopez", "Chen", "Johnson", "Ito", "Novak", "Ahmed", "Martin", "Davis", "Moreau", "Wilson",
)  # fmt: skip

# Order statuses at generation time and their odds; pending and delivered dominate because the
# write tasks need them.
_STATUSES: tuple[OrderStatus, ...] = ("pending", "processed", "delivered", "cancelled")
_STATUS_P = (0.35, 0.1, 0.45, 0.1)


class _Ids:
    """Draws unique numeric ids (``prefix`` + ``digits`` random digits) from one generator."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.used: set[str] = set()

    def new(self, prefix: str, digits: int) -> str:
        while True:
            n = int(self.rng.integers(10 ** (digits - 1), 10**digits))
            key = f"{prefix}{n}"
            if key not in self.used:
                self.used.add(key)
                return key


def _pick(rng: np.random.Generator, seq: tuple[str, ...] | list[str]) -> str:
    return seq[int(rng.integers(len(seq)))]


def _generate_products(rng: np.random.Generator, ids: _Ids, n: int) -> dict[str, Product]:
    products: dict[str, Product] = {}
    for t in sorted(rng.choice(len(CATALOG), size=n, replace=False).tolist()):
        name, axes, base = CATALOG[t]
        combos = list(itertools.product(*axes.values()))
        chosen = sorted(
            rng.choice(len(combos), size=min(len(combos), int(rng.integers(3, 6))), replace=False)
        )
        variants = []
        for j, c in enumerate(chosen):
            # The first two variants are always in stock so every product can be exchanged.
            variants.append(
                Variant(
                    item_id=ids.new("", 10),
                    options=dict(zip(axes, combos[c], strict=True)),
                    price=money(base * rng.uniform(0.8, 1.3)),
                    available=j < 2 or bool(rng.random() < 0.7),
                )
            )
        pid = ids.new("", 8)
        products[pid] = Product(product_id=pid, name=name, variants=variants)
    return products


def _generate_user(rng: np.random.Generator, ids: _Ids, first: str, last: str) -> User:
    methods = [PaymentMethod(id=ids.new("credit_card_", 7), kind="credit_card", last_four=ids.new("", 4))]
    if rng.random() < 0.6:
        balance = money(rng.uniform(20, 300))
        methods.append(PaymentMethod(id=ids.new("gift_card_", 7), kind="gift_card", balance=balance))
    if rng.random() < 0.3:
        methods.append(PaymentMethod(id=ids.new("paypal_", 7), kind="paypal"))
    return User(
        user_id=f"{first.lower()}_{last.lower()}_{ids.new('', 4)}",
        first_name=first,
        last_name=last,
        email=f"{first.lower()}.{last.lower()}{int(rng.integers(10, 100))}@example.com",
        zip=ids.new("", 5),
        payment_methods=methods,
    )


def _generate_order(rng: np.random.Generator, ids: _Ids, user: User, products: list[Product]) -> Order:
    n_items = int(rng.integers(1, 4))
    # Distinct products within an order: naming a product then names exactly one item.
    picks = rng.choice(len(products), size=min(n_items, len(products)), replace=False)
    items = []
    for p in sorted(picks.tolist()):
        product = products[p]
        v = product.variants[int(rng.integers(len(product.variants)))]
        items.append(
            OrderItem(
                item_id=v.item_id,
                product_id=product.product_id,
                name=product.name,
                options=v.options,
                price=v.price,
            )
        )
    status = _STATUSES[int(rng.choice(len(_STATUSES), p=_STATUS_P))]
    method = user.payment_methods[int(rng.integers(len(user.payment_methods)))].id
    order = Order(
        order_id=ids.new("#W", 7),
        user_id=user.user_id,
        status=status,
        items=items,
        payment_method_id=method,
        payment_history=[],
    )
    order.payment_history.append(Payment(kind="payment", amount=order.total, payment_method_id=method))
    if status == "cancelled":
        order.cancel_reason = _pick(rng, ["no longer needed", "ordered by mistake"])
        order.payment_history.append(Payment(kind="refund", amount=order.total, payment_method_id=method))
    return order


def generate_database(rng: np.random.Generator, num_users: int, num_products: int) -> Database:
    """Draw a fresh store.

    Args:
        rng: The env's generator (all randomness comes from it).
        num_users: Users to create (names are distinct, so name + zip identifies a user).
        num_products: Product types to stock, drawn from :data:`CATALOG`.

    Returns:
        A database in which every user has one to three orders.
    """
    if not 1 <= num_products <= len(CATALOG):
        raise ValueError(f"num_products must be in [1, {len(CATALOG)}], got {num_products}")
    if not 1 <= num_users <= len(FIRST_NAMES) * len(LAST_NAMES):
        raise ValueError(f"num_users must be in [1, {len(FIRST_NAMES) * len(LAST_NAMES)}], got {num_users}")
    ids = _Ids(rng)
    products = _generate_products(rng, ids, num_products)
    product_list = list(products.values())
    names = rng.choice(len(FIRST_NAMES) * len(LAST_NAMES), size=num_users, replace=False)
    users: dict[str, User] = {}
    orders: dict[str, Order] = {}
    for k in names.tolist():
        first, last = FIRST_NAMES[k // len(LAST_NAMES)], LAST_NAMES[k % len(LAST_NAMES)]
        user = _generate_user(rng, ids, first, last)
        for _ in range(int(rng.integers(1, 4))):
            order = _generate_order(rng, ids, user, product_list)
            orders[order.order_id] = order
            user.order_ids.append(order.order_id)
        users[user.user_id] = user
    return Database(users=users, products=products, orders=orders)
