"""Computation plans for the calculator env's word problems, and the text helpers its families share.

A :class:`Problem` is a question plus a *plan*: the calculator expressions that solve it, in order,
where ``{i}`` stands for the result of step ``i``. The plan is what the oracle follows: it fills the
references with the numbers the calculator actually returned, so its transcripts show exactly the
computation that was performed. Plans are built with :class:`Plan`, which evaluates every step as it
is added (with the same calculator the model uses) and rejects values that would not make a clean
problem (negative, zero, not an exact short decimal), so families can simply draw numbers and retry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TypeVar

import numpy as np

from srt_agent.tools.calculator import evaluate, format_number

T = TypeVar("T")

_REF_RE = re.compile(r"\{(\d+)\}")

# Values stay well under 10 significant digits (the calculator's output precision), so every
# intermediate result the model reads back is exact.
MAX_VALUE = Fraction(1_000_000)

NAMES = (
    "Maya", "Liam", "Sofia", "Noah", "Aisha", "Lucas", "Priya", "Mateo", "Emma", "Kenji",
    "Zara", "Omar", "Chloe", "Diego", "Hana", "Ethan", "Lena", "Samir", "Grace", "Tariq",
    "Nina", "Jonas", "Amara", "Felix", "Rosa", "Arjun", "Ivy", "Marco", "Yuki", "Ben",
)  # fmt: skip


class Reject(Exception):
    """The drawn numbers do not make a clean problem; the generator draws again."""


@dataclass(frozen=True)
class Step:
    """One calculator call of a plan.

    Attributes:
        expr: The expression, with ``{i}`` standing for the result of step ``i``.
        note: A singular noun phrase naming the result ("the total cost"), used in the oracle's prose.
        unit: ``"$"`` for money, else a unit word ("km", "hours") or ``""``.
    """

    expr: str
    note: str
    unit: str = ""

    def fill(self, results: Sequence[str]) -> str:
        """The expression with each ``{i}`` replaced by ``results[i]`` (the calculator's output text)."""
        return _REF_RE.sub(lambda m: results[int(m.group(1))], self.expr)


@dataclass(frozen=True)
class Ref:
    """Handle to an earlier step's result; formats as ``{i}`` inside an expression f-string."""

    index: int
    value: Fraction

    def __str__(self) -> str:
        return "{" + str(self.index) + "}"


@dataclass
class Plan:
    """A plan under construction: each :meth:`add` evaluates the step immediately."""

    steps: list[Step] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def add(self, expr: str, note: str, unit: str = "", *, decimals: int = 2) -> Ref:
        """Append a step and return a reference to its result.

        Args:
            expr: The expression (embed earlier :class:`Ref` objects with an f-string).
            note: Noun phrase naming the result.
            unit: The result's unit (``"$"`` for money).
            decimals: Most decimal places the result may have.

        Raises:
            Reject: The result is not positive, too large, or not an exact decimal with at most
                ``decimals`` places.
        """
        step = Step(expr, note, unit)
        value = evaluate(step.fill(self.outputs))
        text = format_number(value)
        if not 0 < value < MAX_VALUE or Fraction(text) != value or _decimals(value) > decimals:
            raise Reject(f"{note} = {value}")
        self.steps.append(step)
        self.outputs.append(text)
        return Ref(len(self.steps) - 1, value)


@dataclass(frozen=True)
class Problem:
    """A word problem and the plan that solves it.

    Attributes:
        family: The problem family (``"shopping"``, ``"travel"``, ...).
        text: The question shown to the model.
        steps: The plan: one calculator expression per step.
        outputs: The calculator's output for each step (the last one is the answer).
    """

    family: str
    text: str
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]

    @property
    def answer(self) -> Fraction:
        """The exact final answer."""
        return Fraction(self.outputs[-1])


def _decimals(x: Fraction) -> int:
    """Decimal places of an exact decimal (a large number for fractions such as 1/3)."""
    places = 0
    while x.denominator != 1:
        x *= 10
        places += 1
        if places > 12:
            break
    return places


# ---------------------------------------------------------------------- text helpers for families
def pick(rng: np.random.Generator, options: Sequence[T]) -> T:
    """One element of ``options``, uniformly."""
    return options[int(rng.integers(len(options)))]


def sample(rng: np.random.Generator, options: Sequence[T], k: int) -> list[T]:
    """``k`` distinct elements of ``options`` in random order."""
    return [options[int(i)] for i in rng.choice(len(options), size=k, replace=False)]


def cents(rng: np.random.Generator, low: int, high: int, step: int = 5) -> Fraction:
    """A price in dollars drawn in whole multiples of ``step`` cents from ``low``..``high`` cents.

    Prices ending in ten cents (``$18.50``) move up by ``step`` cents: prose writes them with two
    decimals but expressions with one (``18.5``), and a model should be able to copy a price from the
    problem into an expression verbatim.
    """
    c = step * int(rng.integers(low // step, high // step + 1))
    if c % 10 == 0 and c % 100 != 0:
        c += step
    return Fraction(c, 100)


def num(x: Fraction | int) -> str:
    """A number as written in an expression (``12.5``, ``3``)."""
    return format_number(Fraction(x))


def text_num(x: Fraction | int) -> str:
    """A number as written in prose (``12500``, ``2.54``): the same digits as in an expression.

    No thousands separators: the model copies numbers from the problem into calculator expressions,
    and a copy should be verbatim, not a reformatting.
    """
    return format_number(Fraction(x))


def money(x: Fraction | int) -> str:
    """A dollar amount as written in prose (``$12.55``, ``$1250``, ``$12.50`` for 12.5).

    No thousands separators (see :func:`text_num`); prices drawn by :func:`cents` never end in ten
    cents, so a price's prose digits equal its expression digits.
    """
    x = Fraction(x)
    if x.denominator == 1:
        return f"${int(x)}"
    return f"${float(x):.2f}" if _decimals(x) <= 2 else f"${text_num(x)}"


def with_unit(value: str, unit: str) -> str:
    """A calculator output with its unit, for the oracle's prose (``$12.5``, ``245 km``).

    The output's digits are kept verbatim (no rounding to cents, no separators): the next step copies
    them into an expression, and a restatement that reformats them would teach a second spelling.
    """
    if unit == "$":
        return f"${value}"
    return f"{value} {unit}" if unit else value


def join_and(parts: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def hours(t: Fraction) -> str:
    """A duration in hours as written in prose (``1 hour``, ``2.5 hours``)."""
    return "1 hour" if t == 1 else f"{num(t)} hours"


def cap(s: str) -> str:
    """``s`` with its first letter upper-cased (the rest unchanged)."""
    return s[:1].upper() + s[1:]
