"""Calculator problem families about measurements: trips (rates), averages, and unit conversions.

Same contract as :mod:`srt_agent.envs.calculator_families`: ``(rng, n_steps) -> (question, plan)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from srt_agent.envs.calculator_problems import (
    NAMES,
    Plan,
    Ref,
    Reject,
    cap,
    cents,
    hours,
    join_and,
    money,
    num,
    pick,
    text_num,
)

TIMES = tuple(Fraction(t) for t in ("1", "1.5", "2", "2.5", "3", "4"))


@dataclass(frozen=True)
class _Mover:
    subject: str  # opens the problem; "{name}" is replaced by a name
    verb: str
    speeds: tuple[int, int, int]  # lowest, highest, step in km/h
    fuel: str  # what burns fuel ("" for movers that use none)
    short: str  # how later sentences refer to the mover


MOVERS = (
    _Mover("{name}", "drives", (50, 110, 5), "{name}'s car", "{name}"),
    _Mover("A delivery truck", "travels", (40, 90, 5), "the truck", "the truck"),
    _Mover("A passenger train", "runs", (60, 160, 10), "", "the train"),
    _Mover("{name}", "cycles", (12, 28, 2), "", "{name}"),
    _Mover("A tour bus", "travels", (40, 100, 5), "the bus", "the bus"),
)

# What may follow the distance; "avg" needs two legs, "liters" a mover that burns fuel.
TAILS = ((), ("avg",), ("rest",), ("rest", "time"), ("liters",), ("liters", "cost"))


def travel(rng: np.random.Generator, n: int) -> tuple[str, Plan]:
    """Distance from speed and time over one or two legs, then average speed, time left, or fuel."""
    mover, name = pick(rng, MOVERS), pick(rng, NAMES)
    short, fuel = mover.short.format(name=name), mover.fuel.format(name=name)
    shapes = [
        (legs, tail)
        for legs in (1, 2)
        for tail in TAILS
        if legs + (legs == 2) + len(tail) == n
        and (legs == 2 or "avg" not in tail)
        and (fuel or "liters" not in tail)
    ]
    legs, tail = pick(rng, shapes)
    low, high, step = mover.speeds

    def speed() -> int:
        return low + step * int(rng.integers((high - low) // step + 1))

    plan = Plan()
    v1, t1 = speed(), pick(rng, TIMES)
    text = f"{mover.subject.format(name=name)} {mover.verb} at {v1} km/h for {hours(t1)}"
    if legs == 1:
        dist = plan.add(f"{v1} * {num(t1)}", f"the distance covered in {hours(t1)}", "km")
        text += "."
    else:
        v2, t2 = pick(rng, [v for v in range(low, high + 1, step) if v != v1]), pick(rng, TIMES)
        d1 = plan.add(f"{v1} * {num(t1)}", "the distance of the first part", "km")
        d2 = plan.add(f"{v2} * {num(t2)}", "the distance of the second part", "km")
        dist = plan.add(f"{d1} + {d2}", "the total distance", "km")
        text += f", then at {v2} km/h for {hours(t2)}."
        question = pick(
            rng, (f"How far does {short} travel in total, in km?", f"How many kilometers does {short} cover?")
        )
    if "avg" in tail:
        plan.add(f"{dist} / ({num(t1)} + {num(t2)})", "the average speed", "km/h")
        question = f"What is {short}'s average speed over the whole trip, in km/h?"
    if "rest" in tail:
        v3 = speed()
        extra = v3 * pick(rng, TIMES) if "time" in tail else Fraction(5 * int(rng.integers(2, 41)))
        rest = plan.add(f"{num(dist.value + extra)} - {dist}", "the distance still to go", "km")
        text += f" The whole journey is {text_num(dist.value + extra)} km."
        question = "How many kilometers are left to go?"
        if "time" in tail:
            plan.add(f"{rest} / {v3}", "the time needed for the rest of the journey", "hours")
            question = f"If {short} continues at {v3} km/h, how many more hours will it take to arrive?"
    if "liters" in tail:
        per = pick(rng, tuple(Fraction(e) for e in ("8", "10", "12", "12.5", "15", "16", "20", "25")))
        liters = plan.add(f"{dist} / {num(per)}", "the fuel used", "liters", decimals=1)
        text += f" {cap(fuel)} uses 1 liter of fuel for every {num(per)} km."
        question = "How many liters of fuel does the trip take?"
        if "cost" in tail:
            price = cents(rng, 120, 220, 10)
            plan.add(f"{liters} * {num(price)}", "the cost of the fuel", "$")
            text += f" Fuel costs {money(price)} per liter."
            question = "How much does the fuel for the trip cost, in dollars?"
    return f"{text} {question}", plan


@dataclass(frozen=True)
class _Series:
    data: str  # "{name}", "{m}": how many values, "{values}"
    mean_question: str
    mean_note: str
    next_question: str  # "{name}", "{k}": values including the next one, "{t}": the target average
    next_note: str
    low: int  # range of a single value
    high: int
    unit: str


SERIES = (
    _Series("{name}'s scores on the last {m} math tests were {values}.", "What is the average test score?",
            "the average score", "What must {name} score on the next test so that the average over all "
            "{k} tests is exactly {t}?", "the score needed on the next test", 55, 100, "points"),
    _Series("{name} practiced the piano for {values} minutes on the last {m} days.",
            "What is the average practice time per day, in minutes?", "the average practice time", "How many "
            "minutes must {name} practice tomorrow for the average over {k} days to be exactly {t} minutes?",
            "the practice time needed tomorrow", 15, 90, "minutes"),
    _Series("{name}'s bowling scores in {m} games were {values}.", "What is the average score per game?",
            "the average score", "What must {name} score in the next game for the average over all {k} games "
            "to be exactly {t}?", "the score needed in the next game", 90, 220, "points"),
    _Series("Over {m} days, {name}'s lemonade stand sold {values} cups.",
            "What is the average number of cups sold per day?", "the average number of cups per day",
            "How many cups must the stand sell tomorrow for the average over {k} days to be exactly {t}?",
            "the number of cups needed tomorrow", 12, 60, "cups"),
)  # fmt: skip

# (sentence, question, unit, range of a group average, the two groups' names)
GROUPS = (
    ("Class A has {n1} students whose average test score is {a1}, and class B has {n2} students "
     "averaging {a2}.", "What is the average score of all {n} students together?", "points", (60, 95),
     ("class A", "class B")),
    ("{n1} full-time workers average {a1} hours a week, and {n2} part-time workers average {a2} hours.",
     "What is the average number of hours per week across all {n} workers?", "hours", (12, 45),
     ("the full-time workers", "the part-time workers")),
    ("A shipment has {n1} crates that average {a1} kg each and {n2} crates that average {a2} kg each.",
     "What is the average weight of all {n} crates, in kg?", "kg", (20, 80),
     ("the first {n1} crates", "the other {n2} crates")),
)  # fmt: skip


def averages(rng: np.random.Generator, n: int) -> tuple[str, Plan]:
    """Means of a list (2 steps), the value needed for a target mean (3), means of groups (4-5)."""
    name, plan = pick(rng, NAMES), Plan()
    if n <= 3:
        s, m = pick(rng, SERIES), int(rng.integers(3, 7))
        values = [int(v) for v in rng.integers(s.low, s.high + 1, size=m)]
        text = s.data.format(name=name, m=m, values=join_and([str(v) for v in values]))
        total = plan.add(" + ".join(map(str, values)), "the total so far", s.unit)
        if n == 2:
            plan.add(f"{total} / {m}", s.mean_note, s.unit)
            return f"{text} {s.mean_question}", plan
        targets = [t for t in range(s.low, s.high + 1) if s.low <= t * (m + 1) - total.value <= s.high]
        if not targets:
            raise Reject("no reachable target average")
        target = pick(rng, targets)
        goal = plan.add(f"{target} * {m + 1}", f"the total needed for an average of {target}", s.unit)
        plan.add(f"{goal} - {total}", s.next_note, s.unit)
        return f"{text} {s.next_question.format(name=name, k=m + 1, t=target)}", plan
    data, question, unit, (low, high), (g1, g2) = pick(rng, GROUPS)
    n1, n2 = (int(k) for k in rng.integers(4, 31, size=2))
    a1, a2 = (int(a) for a in rng.integers(low, high + 1, size=2))
    text = data.format(n1=n1, n2=n2, a1=a1, a2=a2)
    g1, g2 = g1.format(n1=n1), g2.format(n2=n2)
    s1 = plan.add(f"{n1} * {a1}", f"the total for {g1}", unit)
    s2 = plan.add(f"{n2} * {a2}", f"the total for {g2}", unit)
    both = plan.add(f"{s1} + {s2}", "the combined total", unit)
    # The 4-step question states the head count; the 5-step one does not, so the plan adds it up.
    count = n1 + n2 if n == 4 else f"({n1} + {n2})"
    mean = plan.add(f"{both} / {count}", "the combined average", unit)
    question = question.format(n=n1 + n2)
    if n == 5:
        lower = min(a1, a2)
        plan.add(f"{mean} - {lower}", "the difference between the averages", unit)
        question = f"By how much does the combined average exceed the lower of the two averages ({lower})?"
    return f"{text} {question}", plan


_LENGTHS = ("yards", "feet", "inches", "centimeters")
_FACTORS = ("3", "12", "2.54")  # yards->feet, feet->inches, inches->centimeters
_FACTS = ("1 yard = 3 feet", "1 foot = 12 inches", "1 inch = 2.54 cm")
MATERIALS = ("ribbon", "rope", "fabric", "garden hose", "fencing wire", "twine")


@dataclass(frozen=True)
class _Machine:
    text: str  # "{p}": the period, "{h}": the hours it runs
    period_unit: str  # "seconds" or "minutes"
    items: str
    count_question: str
    per_item: str  # "{a}": how much material one item holds or uses
    amount_unit: str
    amounts: tuple[str, ...]
    amount_note: str  # names the total material in the oracle's prose
    price_text: str  # "{c}": the price of one unit of material
    prices: tuple[int, int, int]  # lowest, highest, step in cents
    value_question: str
    value_note: str


MACHINES = (
    _Machine("A bottling machine fills one bottle every {p} seconds and runs for {h} hours.", "seconds",
             "bottles", "How many bottles does it fill?", "Each bottle holds {a} liters.", "liters",
             ("0.25", "0.5", "0.75", "1.5", "2"), "the amount of drink", "The drink sells for {c} per liter.",
             (50, 300, 10), "How much is all of that drink worth, in dollars?", "the value of the drink"),
    _Machine("A printer prints one page every {p} seconds and runs for {h} hours.", "seconds", "pages",
             "How many pages does it print?", "Each page uses {a} ml of ink.", "ml",
             ("0.05", "0.1", "0.2", "0.25"), "the amount of ink used", "Ink costs {c} per ml.", (10, 60, 5),
             "How much does the ink used cost, in dollars?", "the cost of the ink"),
    _Machine("An oven bakes one tray of cookies every {p} minutes for {h} hours.", "minutes", "trays",
             "How many trays does it bake?", "Each tray holds {a} cookies.", "cookies",
             ("12", "15", "16", "18", "20", "24"), "the number of cookies", "The cookies sell for {c} each.",
             (25, 150, 25), "How much money do all the cookies bring in?", "the money from the cookies"),
    _Machine("A loom weaves one scarf every {p} minutes during a {h}-hour shift.", "minutes", "scarves",
             "How many scarves does it weave?", "Each scarf uses {a} meters of yarn.", "meters",
             ("2.5", "3", "4", "4.5", "6"), "the length of yarn used", "Yarn costs {c} per meter.",
             (10, 60, 5), "How much does the yarn used cost, in dollars?", "the cost of the yarn"),
)  # fmt: skip

_PERIODS = {
    "seconds": (4, 5, 6, 8, 9, 10, 12, 15, 18, 20, 24, 30, 36, 40, 45),
    "minutes": (4, 5, 6, 10, 12, 15, 20),
}


def _lengths(rng: np.random.Generator, n: int) -> tuple[str, Plan]:
    """Convert a length along yards -> feet -> inches -> centimeters, maybe cutting it into pieces."""
    shapes = [(a, b, cut) for a in (0, 1) for b in (2, 3) for cut in (0, 1) if b - a + cut == n]
    start, end, cut = pick(rng, shapes)
    name, material = pick(rng, NAMES), pick(rng, MATERIALS)
    amount = int(rng.integers(2, 16) if start == 0 else rng.integers(4, 41))
    plan = Plan()
    ref: Ref | int = amount
    for i in range(start, end):
        ref = plan.add(f"{ref} * {_FACTORS[i]}", f"the length in {_LENGTHS[i + 1]}")
    text = f"{name} has {amount} {_LENGTHS[start]} of {material} ({join_and(_FACTS[start:end])})."
    question = pick(
        rng, (f"How many {_LENGTHS[end]} of {material} is that?", f"How long is it in {_LENGTHS[end]}?")
    )
    if cut:
        pieces = int(rng.integers(2, 13))
        plan.add(f"{ref} / {pieces}", "the length of each piece", _LENGTHS[end], decimals=3)
        question = f"{name} cuts it into {pieces} equal pieces. How long is each piece, in {_LENGTHS[end]}?"
    return f"{text} {question}", plan


def _production(rng: np.random.Generator, n: int) -> tuple[str, Plan]:
    """Count what a machine makes in some hours, then maybe the material it uses and its value."""
    m = pick(rng, [m for m in MACHINES if 0 <= n - (3 if m.period_unit == "seconds" else 2) <= 2])
    h, p = int(rng.integers(1, 9)), pick(rng, _PERIODS[m.period_unit])
    plan = Plan()
    time = plan.add(f"{h} * 60", "the running time in minutes")
    if m.period_unit == "seconds":
        time = plan.add(f"{time} * 60", "the running time in seconds")
    count = plan.add(f"{time} / {p}", f"the number of {m.items}")
    sentences = [m.text.format(p=p, h=h)]
    question = m.count_question
    extras = n - len(plan.steps)
    if extras >= 1:
        amount = pick(rng, m.amounts)
        total = plan.add(
            f"{count} * {amount}", m.amount_note, "" if m.amount_unit == "cookies" else m.amount_unit
        )
        sentences.append(m.per_item.format(a=amount))
        question = f"How many {m.amount_unit} is that in total?"
        if extras == 2:
            price = cents(rng, *m.prices)
            plan.add(f"{total} * {num(price)}", m.value_note, "$")
            sentences.append(m.price_text.format(c=money(price)))
            question = m.value_question
    return " ".join([*sentences, question]), plan


def units(rng: np.random.Generator, n: int) -> tuple[str, Plan]:
    """Unit conversions: lengths (2-4 steps) or machine output over hours (2-5 steps)."""
    if n <= 4 and rng.integers(2):
        return _lengths(rng, n)
    return _production(rng, n)
