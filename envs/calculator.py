"""``srt/Calculator-v0``: multi-step arithmetic word problems solved with a ``calculator`` tool.

Each episode draws one procedurally generated word problem (shopping, discounts, restaurant bills,
savings, trips, averages, unit conversions) that takes 2 to 5 dependent calculations. The model calls
the calculator as often as it likes, one or more calls per turn, and ends the episode with its final
answer in ``<answer>...</answer>``.

Rewards:

* ``1.0`` for a correct final answer: the first number inside the last ``<answer>`` tag equals the
  exact answer within a relative tolerance of ``1e-6``. Currency signs, thousands separators and
  trailing units are ignored, so ``<answer>$1,234.50</answer>`` and ``<answer>1234.5 dollars</answer>``
  both read as 1234.5.
* ``0.0`` for a wrong or unreadable answer. Any answer ends the episode, also one written in the same
  turn as tool calls (the calls still run and their results are returned).
* A turn with neither a tool call nor an answer gets a short reminder and the episode goes on, until
  ``max_turns`` truncates it (reward 0). Tool errors (malformed calls, division by zero, ...) come back
  as tool messages and the episode goes on.

``reset(options={"family": "travel", "steps": 3})`` asks for a specific family and step count.

Two scripted policies solve every task: ``oracle()`` with one calculator call per turn, and
``mental_oracle()`` in one turn without the tool (a second demonstrator for the ``tool-choice``
model build, whose RL lesson is to use the calculator).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from srt_agent.chat.messages import Message, system, user
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import EnvConfig, MultiTurnEnv, Transition, not_below
from srt_agent.envs.calculator_families import FAMILIES, MAX_STEPS, MIN_STEPS, generate_problem
from srt_agent.envs.calculator_problems import Problem, cap, pick, with_unit
from srt_agent.tooling.parser import ParsedTurn, format_tool_call
from srt_agent.tooling.toolset import ToolResult, ToolSet
from srt_agent.tools.calculator import calculator

REL_TOL = 1e-6

SYSTEM_PROMPT = f"""You solve arithmetic word problems step by step with a calculator tool.
Call it by writing, for example:
{format_tool_call("calculator", {"expression": "(12 + 7) * 3.5"})}
Its result comes back in the next message. Make one or more calculator calls per turn and use the results \
in later steps; do not do the arithmetic in your head.
When you have the final result, reply with just the number inside answer tags, for example \
<answer>42.5</answer>. Do not round unless the problem asks you to."""

NUDGES = (
    "Please continue: use the calculator for the next step, or give the final result as "
    "<answer>NUMBER</answer>.",
    "I don't see a calculation or a final answer yet. Call the calculator tool, or reply with "
    "<answer>NUMBER</answer> when you are done.",
    "Keep going: work out the next step with the calculator, or put your final number in "
    "<answer></answer> tags.",
    "No final answer found. When you have the result, write it as <answer>NUMBER</answer>; otherwise use "
    "the calculator.",
)

_ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?")


class CalculatorConfig(EnvConfig):
    """Options of ``srt/Calculator-v0``."""

    max_turns: int = Field(10, ge=1, le=1000, description="Assistant turns before the episode is truncated.")
    min_steps: int = Field(
        MIN_STEPS, ge=MIN_STEPS, le=MAX_STEPS, description="Fewest calculator steps a problem needs."
    )
    max_steps: int = Field(
        MAX_STEPS, ge=MIN_STEPS, le=MAX_STEPS, description="Most calculator steps a problem needs."
    )
    families: tuple[str, ...] = Field(
        tuple(FAMILIES), min_length=1, description="Problem families to draw from (default: every family)."
    )

    @field_validator("max_steps")
    @classmethod
    def _steps_in_order(cls, value: int, info: ValidationInfo) -> int:
        return not_below(value, info, "min_steps")

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [f for f in value if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
        return value


def find_answer(text: str) -> str | None:
    """The content of the last ``<answer>`` tag in ``text`` (an unclosed final tag counts), or ``None``."""
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


def parse_number(text: str) -> Fraction | None:
    """The first number in ``text``, ignoring currency signs and thousands separators, or ``None``.

    Example:
        >>> parse_number("$1,234.50"), parse_number("1234.5 dollars"), parse_number("3/4 cup")
        (Fraction(2469, 2), Fraction(2469, 2), Fraction(3, 4))
    """
    cleaned = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text.replace("$", ""))
    match = _NUMBER_RE.search(cleaned)
    if match is None:
        return None
    # "74.65/78" is a valid match but not a valid Fraction literal: parse the two sides apart.
    top, _, bottom = match.group().replace(" ", "").partition("/")
    try:
        return Fraction(top) / Fraction(bottom) if bottom else Fraction(top)
    except ZeroDivisionError:
        return None


def is_correct(given: Fraction, expected: Fraction) -> bool:
    """Whether ``given`` matches ``expected`` within the relative tolerance :data:`REL_TOL`."""
    return abs(given - expected) <= Fraction(REL_TOL) * max(Fraction(1), abs(expected))


class CalculatorEnv(MultiTurnEnv):
    """Multi-step arithmetic word problems solved with a calculator tool.

    See the module docstring for the problem families and reward rules.

    Args:
        render_mode: ``None`` or ``"ansi"``.
        **options: :class:`CalculatorConfig` options.
    """

    config_model = CalculatorConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        super().__init__(render_mode=render_mode, **options)
        self.config: CalculatorConfig
        self._problem: Problem | None = None

    @property
    def problem(self) -> Problem:
        """The current problem (with its solution plan)."""
        if self._problem is None:
            raise RuntimeError("CalculatorEnv: no problem yet; call reset() first")
        return self._problem

    def build_tools(self) -> ToolSet:
        """The ``calculator`` tool."""
        return ToolSet([calculator])

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """Draw a problem; ``options`` may fix ``family`` and ``steps``.

        Raises:
            ValueError: Unknown reset option, family, or step count out of range.
        """
        unknown = sorted(set(options) - {"family", "steps"})
        if unknown:
            raise ValueError(
                f"CalculatorEnv.reset: unknown options {unknown}; valid options: 'family', 'steps'"
            )
        family = str(options.get("family") or pick(self.np_random, self.config.families))
        low, high = self.config.min_steps, self.config.max_steps
        steps = int(options.get("steps") or self.np_random.integers(low, high + 1))
        self._problem = generate_problem(self.np_random, family, steps)
        digest = hashlib.sha256(self._problem.text.encode()).hexdigest()[:12]
        return f"calculator-{family}-{steps}-{digest}", [system(SYSTEM_PROMPT), user(self._problem.text)]

    def _grade(self, raw: str) -> Transition:
        value = parse_number(raw)
        correct = value is not None and is_correct(value, self.problem.answer)
        info = {"correct": correct, "answer": raw, "expected": self.problem.outputs[-1]}
        return Transition(reward=1.0 if correct else 0.0, terminated=True, info=info)

    def on_message(self, text: str) -> Transition:
        """Grade a final answer, or remind the model how to go on when the turn has none."""
        raw = find_answer(text)
        if raw is None:
            return Transition(messages=[user(pick(self.np_random, NUDGES))], info={"nudged": True})
        return self._grade(raw)

    def on_tool_results(self, turn: ParsedTurn, results: list[ToolResult]) -> Transition:
        """Return the tool results; an answer in the same turn is graded and ends the episode."""
        messages = [r.to_message() for r in results]
        raw = find_answer(turn.text)
        if raw is None:
            return Transition(messages=messages)
        graded = self._grade(raw)
        return Transition(messages=messages, reward=graded.reward, terminated=True, info=graded.info)

    def oracle(self) -> Policy:
        """A policy that follows the problem's plan, one calculator call per turn."""
        return CalculatorOracle(self.problem)

    def mental_oracle(self) -> Policy:
        """A policy that solves the problem in one turn without the calculator (see :class:`MentalOracle`)."""
        return MentalOracle(self.problem)


_FIRST = ("First, {note}.", "Let me start with {note}.", "Step 1: {note}.", "I'll begin with {note}.")
_NEXT = ("Next, {note}.", "Now I'll work out {note}.", "Next I need {note}.", "Then comes {note}.")
_LAST = ("Finally, {note}.", "Last step: {note}.", "All that is left is {note}.")
_DONE = ("{result}, so the answer is {value}.", "That gives {note}: {unit_value}.", "{result}.")


class CalculatorOracle:
    """Solves a problem with one calculator call per turn, reading every result from the conversation.

    The expressions come from the problem's plan, with each reference to an earlier step filled in
    with the number the calculator returned in the transcript (not a value known in advance), so its
    transcripts are faithful demonstrations. Phrasing varies with a hash of the conversation.

    Args:
        problem: The problem to solve.
    """

    def __init__(self, problem: Problem):
        self.problem = problem

    def act(self, history: Sequence[Message]) -> str:
        """The next turn: a short sentence and one calculator call, or the final answer."""
        results = [m.content.strip() for m in history if m.role == "tool" and m.name == "calculator"]
        results = [r for r in results if _is_number(r)]
        steps = self.problem.steps
        k = min(len(results), len(steps))
        digest = int.from_bytes(hashlib.sha256("\x00".join(m.content for m in history).encode()).digest()[:8])
        # What the previous call returned, as read from its tool message ("The total cost is $38.10").
        said = f"{cap(steps[k - 1].note)} is {with_unit(results[k - 1], steps[k - 1].unit)}" if k else ""
        if k == len(steps):
            done = _DONE[digest % len(_DONE)].format(
                result=said,
                value=results[k - 1],
                note=steps[-1].note,
                unit_value=with_unit(results[k - 1], steps[-1].unit),
            )
            return f"{done}\n<answer>{results[k - 1]}</answer>"
        leads = _FIRST if k == 0 else _LAST if k == len(steps) - 1 else _NEXT
        text = leads[digest % len(leads)].format(note=steps[k].note)
        if said:
            text = f"{said}. {text}"
        call = format_tool_call("calculator", {"expression": steps[k].fill(results)})
        return f"{text}\n{call}"


class MentalOracle:
    """Solves a problem in one turn without the tool: each step's arithmetic and result written out.

    A second demonstrator for warm starts in which *whether to use the tool* is left for RL to
    learn. Its answers are right (the results come from the problem's plan), but a small model that
    imitates it has to do multi-digit arithmetic token by token, which it gets wrong nearly always;
    the tool path works far more often. Its sentences open like :class:`CalculatorOracle`'s, so the
    two part ways at the first step's expression: a calculator call, or the arithmetic inline.

    Args:
        problem: The problem to solve.
    """

    def __init__(self, problem: Problem):
        self.problem = problem

    def act(self, history: Sequence[Message]) -> str:
        """The whole solution and the final answer, in one turn."""
        steps, outputs = self.problem.steps, self.problem.outputs
        digest = int.from_bytes(hashlib.sha256("\x00".join(m.content for m in history).encode()).digest()[:8])
        parts = []
        for k, step in enumerate(steps):
            leads = _FIRST if k == 0 else _LAST if k == len(steps) - 1 else _NEXT
            lead = leads[(digest >> (3 * k)) % len(leads)].format(note=step.note)
            parts.append(f"{lead} {step.fill(outputs)} = {outputs[k]}.")
        return " ".join(parts) + f"\n<answer>{outputs[-1]}</answer>"


def _is_number(text: str) -> bool:
    try:
        Fraction(text)
    except (ValueError, ZeroDivisionError):
        return False
    return True
