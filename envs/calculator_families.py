"""Problem families of the calculator env: shopping, discounts, trips, bills, averages, units, savings.

Each family is a function ``(rng, n_steps) -> (question, plan)`` that builds a problem needing exactly
``n_steps`` dependent calculator calls (2 to 5), drawing names, items, numbers and phrasing from
``rng``. A family raises :class:`~srt_agent.envs.calculator_problems.Reject` when its draw gives
unclean numbers (e.g. a bill that does not split into whole cents); :func:`generate_problem` then
draws again from the same generator, so a seed still determines the problem.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from srt_agent.envs.calculator_measures import averages, travel, units
from srt_agent.envs.calculator_problems import (
    NAMES,
    Plan,
    Problem,
    Ref,
    Reject,
    cents,
    join_and,
    money,
    num,
    pick,
    sample,
)

Family = Callable[[np.random.Generator, int], tuple[str, Plan]]

MIN_STEPS, MAX_STEPS = 2, 5
_MAX_DRAWS = 2000

STORES = ("corner shop", "market", "supermarket", "school fair", "general store", "village shop")
SALE_STORES = ("department store", "outlet store", "big-box store", "online shop", "mall")

# (singular, plural, lowest price, highest price) with prices in cents.
GOODS = (
    ("notebook", "notebooks", 120, 450),
    ("pen", "pens", 45, 250),
    ("apple", "apples", 35, 95),
    ("loaf of bread", "loaves of bread", 180, 450),
    ("bottle of juice", "bottles of juice", 125, 375),
    ("candle", "candles", 150, 650),
    ("box of crayons", "boxes of crayons", 199, 499),
    ("bag of rice", "bags of rice", 250, 900),
    ("pack of batteries", "packs of batteries", 300, 850),
    ("mug", "mugs", 350, 1200),
)

# (singular, plural, lowest, highest) list prices in whole dollars.
SALE_GOODS = (
    ("jacket", "jackets", 40, 160),
    ("backpack", "backpacks", 25, 90),
    ("pair of boots", "pairs of boots", 50, 180),
    ("desk lamp", "desk lamps", 15, 70),
    ("board game", "board games", 20, 60),
    ("blender", "blenders", 30, 120),
    ("bicycle helmet", "bicycle helmets", 25, 80),
    ("coffee maker", "coffee makers", 40, 150),
)

DISHES = (
    ("a pizza", 1200, 2200),
    ("a large salad", 800, 1400),
    ("a bowl of noodles", 950, 1600),
    ("a plate of tacos", 1000, 1500),
    ("garlic bread", 450, 750),
    ("a pitcher of lemonade", 600, 1000),
    ("a dessert platter", 900, 1800),
    ("a curry", 1100, 1900),
)


def _payment(rng: np.random.Generator, owed: Fraction) -> Fraction:
    """A round amount someone plausibly pays with: the first or second bill size above ``owed``."""
    bills = [Fraction(b) for b in (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if b > owed]
    if not bills:
        raise Reject(f"nothing pays {owed}")
    return bills[min(int(rng.integers(2)), len(bills) - 1)]


def shopping(rng: np.random.Generator, n: int) -> tuple[str, Plan]:
    """Several items at unit prices, their total, and maybe the change from a payment."""
    n_items, change = {2: (1, True), 3: (2, False), 4: pick(rng, [(2, True), (3, False)]), 5: (3, True)}[n]
    name, store = pick(rng, NAMES), pick(rng, STORES)
    each = pick(rng, ("{q} {p} at {c} each", "{q} {p} for {c} each", "{q} {p} priced at {c} apiece"))
    plan, parts, costs = Plan(), [], []
    for _, plural, low, high in sample(rng, GOODS, n_items):
        q, price = int(rng.integers(2, 10)), cents(rng, low, high)
        parts.append(each.format(q=q, p=plural, c=money(price)))
        costs.append(plan.add(f"{q} * {num(price)}", f"the cost of the {q} {plural}", "$"))
    total = costs[0] if n_items == 1 else plan.add(" + ".join(map(str, costs)), "the total cost", "$")
    intro = pick(
        rng,
        (
            f"{name} goes to the {store} and buys {join_and(parts)}.",
            f"At the {store}, {name} picks up {join_and(parts)}.",
            f"{name} is shopping at the {store} and gets {join_and(parts)}.",
        ),
    )
    if change:
        paid = _payment(rng, total.value)
        plan.add(f"{num(paid)} - {total}", f"the change from {money(paid)}", "$")
        question = pick(
            rng,
            (
                f"{name} pays with {money(paid)}. How much change should {name} get back, in dollars?",
                f"If {name} hands the cashier {money(paid)}, how many dollars of change come back?",
                f"{name} pays with {money(paid)}. How much change is due?",
            ),
        )
    else:
        question = pick(
            rng,
            (
                f"How much does {name} spend in total, in dollars?",
                "What is the total bill in dollars?",
                f"How many dollars does {name} pay altogether?",
            ),
        )
    return f"{intro} {question}", plan


def discount(rng: np.random.Generator, n: int) -> tuple[str, Plan]:
    """A percentage off a list price, then maybe a quantity, a coupon and the change."""
    extras = pick(rng, list(itertools.combinations(("qty", "coupon", "change"), n - 2)))
    name, store = pick(rng, NAMES), pick(rng, SALE_STORES)
    single, plural, low, high = pick(rng, SALE_GOODS)
    price, pct = int(rng.integers(low, high + 1)), pick(rng, (10, 15, 20, 25, 30, 40, 50))
    intro = pick(
        rng,
        (
            f"A {single} at the {store} normally costs {money(price)}, and this week it is {pct}% off.",
            f"The {store} has {pct}% off all {plural}; the regular price of a {single} is {money(price)}.",
            f"The regular price of a {single} is {money(price)}, but the {store} is selling it for "
            f"{pct}% off.",
        ),
    )
    plan = Plan()
    off = plan.add(f"{price} * {pct} / 100", f"the {pct}% discount on one {single}", "$")
    cur = plan.add(f"{price} - {off}", f"the sale price of one {single}", "$")
    sentences = [intro]
    question = pick(
        rng,
        (
            f"What is the sale price of one {single}, in dollars?",
            f"How much is one {single} after the discount?",
        ),
    )
    if "qty" in extras:
        q = int(rng.integers(2, 5))
        cur = plan.add(f"{cur} * {q}", f"the cost of {q} {plural} on sale", "$")
        sentences.append(f"{name} buys {q} of them.")
        question = f"How much do the {q} {plural} cost in total after the discount?"
    elif extras:
        sentences.append(f"{name} buys one.")
    if "coupon" in extras:
        coupon = pick(rng, [c for c in (5, 10, 15, 20) if c < cur.value / 2] or [2])
        cur = plan.add(f"{cur} - {coupon}", "the price after the coupon", "$")
        sentences.append(f"{name} also has a {money(coupon)} coupon that comes off the discounted price.")
        question = pick(
            rng, (f"How much does {name} pay in the end?", "What is the final price, in dollars?")
        )
    if "change" in extras:
        paid = _payment(rng, cur.value)
        plan.add(f"{num(paid)} - {cur}", f"the change from {money(paid)}", "$")
        sentences.append(f"{name} pays with {money(paid)}.")
        question = pick(
            rng, (f"How much change does {name} get back?", "How many dollars of change are due?")
        )
    return " ".join([*sentences, question]), plan


def bill(rng: np.random.Generator, n: int) -> tuple[str, Plan]:
    """A restaurant bill: subtotal, tip, total, each person's share, and one person's change."""
    people, name = int(rng.integers(2, 7)), pick(rng, NAMES)
    friends = f"{name} and a friend" if people == 2 else f"{name} and {people - 1} friends"
    among = "between the two of them" if people == 2 else f"among the {people} of them"
    dishes = sample(rng, DISHES, int(rng.integers(2, 5)))
    prices = [cents(rng, low, high, 25) for _, low, high in dishes]
    listed = join_and([f"{dish} for {money(p)}" for (dish, _, _), p in zip(dishes, prices, strict=True)])
    intro = pick(
        rng,
        (
            f"{friends} eat out and order {listed}.",
            f"At dinner, {friends} share {listed}.",
            f"{friends} go to a restaurant; the order is {listed}.",
        ),
    )
    plan = Plan()
    cur = plan.add(" + ".join(num(p) for p in prices), "the cost of the food", "$")
    sentences = [intro]
    if n == 2:
        plan.add(f"{cur} / {people}", "each person's share", "$")
        question = f"They split the bill evenly {among}. How much does each person pay?"
        return " ".join([*sentences, question]), plan
    tip_pct = pick(rng, (10, 15, 18, 20, 25))
    tip = plan.add(f"{cur} * {tip_pct} / 100", f"the {tip_pct}% tip", "$")
    cur = plan.add(f"{cur} + {tip}", "the total with the tip", "$")
    article = "an" if tip_pct == 18 else "a"
    sentences.append(f"They add {article} {tip_pct}% tip on top of the food.")
    question = "What is the total, tip included, in dollars?"
    if n >= 4:
        cur = plan.add(f"{cur} / {people}", "each person's share", "$")
        sentences.append(f"The total is split evenly {among}.")
        question = "How much does each person pay?"
    if n == 5:
        paid = _payment(rng, cur.value)
        plan.add(f"{num(paid)} - {cur}", f"{name}'s change from {money(paid)}", "$")
        question = f"{name} pays their share with {money(paid)}. How much change does {name} get?"
    return " ".join([*sentences, question]), plan


def _growth_deposit(rng: np.random.Generator, rate: int, years: int) -> Fraction | None:
    """A deposit that grows by ``rate``% a year for ``years`` years in whole cents, if one is plausible."""
    factor = Fraction(100 + rate, 100)
    # Whole cents every year needs the deposit (in cents) to be a multiple of the factor's denominator
    # to the power ``years``; also keep it a multiple of $100 so the deposit looks like one.
    unit = math.lcm(factor.denominator**years, 10_000)
    choices = [m * unit for m in range(1, 200) if 50_000 <= m * unit <= 2_000_000]
    return Fraction(pick(rng, choices), 100) if choices else None


def savings(rng: np.random.Generator, n: int) -> tuple[str, Plan]:
    """Compound interest year by year, optionally ending with the interest earned."""
    earned = n > 2 and bool(rng.integers(2))
    years = n - 1 if earned else n
    options = [(r, d) for r in (2, 4, 5, 10, 20, 25) if (d := _growth_deposit(rng, r, years)) is not None]
    rate, deposit = pick(rng, options)
    name = pick(rng, NAMES)
    what = pick(rng, ("a savings account", "a certificate of deposit", "a college fund"))
    intro = pick(
        rng,
        (
            f"{name} puts {money(deposit)} into {what} that pays {rate}% interest per year, "
            "compounded once a year.",
            f"{name} deposits {money(deposit)} in {what} earning {rate}% a year, compounded annually.",
        ),
    )
    plan = Plan()
    # "* (100 + 4) / 100" rather than "* 1.04": every number in the expression is copied from the text.
    cur: Ref | str = num(deposit)
    for year in range(1, years + 1):
        cur = plan.add(f"{cur} * (100 + {rate}) / 100", f"the balance after year {year}", "$")
    if earned:
        plan.add(f"{cur} - {num(deposit)}", "the interest earned", "$")
        question = f"How much interest has the money earned after {years} years, in dollars?"
    else:
        question = pick(
            rng,
            (
                f"What is the balance after {years} years?",
                f"How much is in the account after {years} years, in dollars?",
            ),
        )
    return f"{intro} No money is added or taken out. {question}", plan


FAMILIES: dict[str, Family] = {
    "shopping": shopping,
    "discount": discount,
    "bill": bill,
    "savings": savings,
    "travel": travel,
    "averages": averages,
    "units": units,
}
"""Every family, by name. Each supports every step count from ``MIN_STEPS`` to ``MAX_STEPS``."""


def generate_problem(rng: np.random.Generator, family: str, n_steps: int) -> Problem:
    """Draw a problem of ``family`` that takes ``n_steps`` calculator calls.

    Args:
        rng: The source of all randomness (the env's ``np_random``).
        family: A key of :data:`FAMILIES`.
        n_steps: Number of dependent calculator steps, ``MIN_STEPS`` to ``MAX_STEPS``.

    Raises:
        ValueError: Unknown family or step count out of range.
        RuntimeError: No clean problem after many draws (a bug in the family).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown problem family {family!r}; choose from {', '.join(FAMILIES)}")
    if not MIN_STEPS <= n_steps <= MAX_STEPS:
        raise ValueError(f"n_steps must be from {MIN_STEPS} to {MAX_STEPS}, got {n_steps}")
    for _ in range(_MAX_DRAWS):
        try:
            text, plan = FAMILIES[family](rng, n_steps)
        except Reject:
            continue
        if len(plan.steps) != n_steps:
            raise RuntimeError(f"family {family!r} built {len(plan.steps)} steps, asked for {n_steps}")
        return Problem(family, text, tuple(plan.steps), tuple(plan.outputs))
    raise RuntimeError(f"family {family!r} found no clean {n_steps}-step problem in {_MAX_DRAWS} draws")
