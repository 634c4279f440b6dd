"""``srt/GuessNumber-v0``: find a secret integer with higher/lower feedback, a multi-turn game without tools.

The secret is drawn uniformly from ``[low, high]``. Each assistant turn is one guess: **the last
number in the reply** (a run of digits with an optional leading minus sign, e.g. the ``62`` in
"Between 51 and 75, so I'll try 62."). A reply with no number, a non-whole number or a number out of
range gets a corrective message and still uses up a turn. Every other wrong guess is answered with
"higher" or "lower" (varied phrasings, each containing exactly one of those two words) and the number
of turns left. Tool calls are not supported: the env has no tools, so each call is answered with the
framework's unknown-tool error, and that turn counts too.

Reward, given once, when the secret is guessed on turn ``t``:

* ``1.0`` if ``t <= optimal``, where ``optimal = floor(log2(high - low + 1)) + 1`` is the worst case of
  binary search (the fewest guesses that always suffice);
* falling linearly from ``1.0`` at ``optimal`` to ``0.1`` at ``max_turns``;
* ``0.0`` if the secret is never found (the episode is truncated at ``max_turns``).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from srt_agent.chat.messages import Message, system, user
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import EnvConfig, MultiTurnEnv, Transition

MIN_REWARD = 0.1

SYSTEM_PROMPT = """You are playing a number guessing game. The user has picked a secret whole number \
in a known range. Each turn, reply with one guess: the last number in your reply is taken as your guess. \
After a wrong guess you are told whether the secret number is higher or lower, and how many turns you \
have left. Find the number in as few guesses as possible."""

OPENINGS = (
    "I'm thinking of a whole number between {low} and {high}, inclusive. You have {turns} turns. "
    "What's your first guess?",
    "Let's play! I picked a secret number from {low} to {high}. Find it in at most {turns} turns. "
    "Your first guess?",
    "Guess my number: it is an integer from {low} to {high}, and you get {turns} tries.",
)
HIGHER = (
    "Higher!",
    "No, {g} is too small. The number is higher.",
    "Not {g}. Go higher.",
    "The secret number is higher than {g}.",
)
LOWER = (
    "Lower!",
    "No, {g} is too big. The number is lower.",
    "Not {g}. Go lower.",
    "The secret number is lower than {g}.",
)
TURNS_LEFT = ("{r} {turns} left.", "You have {r} more {turns}.", "Turns remaining: {r}.")

_NUMBER_RE = re.compile(r"(?<![\d.])-?\d+(?:\.\d+)?")
_HIGHER_RE = re.compile(r"\bhigher\b", re.IGNORECASE)
_LOWER_RE = re.compile(r"\blower\b", re.IGNORECASE)


class GuessNumberConfig(EnvConfig):
    """Options of ``srt/GuessNumber-v0``."""

    max_turns: int = Field(12, ge=1, le=1000, description="Guesses (turns) before the episode is truncated.")
    low: int = Field(1, ge=-(10**9), le=10**9, description="Smallest possible secret number.")
    high: int = Field(
        100, ge=-(10**9), le=10**9, description="Largest possible secret number (must be > low)."
    )

    @field_validator("high")
    @classmethod
    def _range_not_empty(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("low")
        if low is not None and value <= low:
            raise ValueError(f"high ({value}) must be greater than low ({low})")
        return value


def last_number(text: str) -> Fraction | None:
    """The last number written in ``text`` (``"I'll try 62."`` -> 62), or ``None`` when there is none."""
    found = _NUMBER_RE.findall(text)
    return Fraction(found[-1]) if found else None


def optimal_guesses(low: int, high: int) -> int:
    """Guesses binary search needs in the worst case on ``[low, high]``: ``floor(log2(size)) + 1``."""
    return (high - low + 1).bit_length()


def guess_reward(turns: int, optimal: int, max_turns: int) -> float:
    """Reward for finding the secret on turn ``turns`` (see the module docstring)."""
    if turns <= optimal:
        return 1.0
    return 1.0 - (1.0 - MIN_REWARD) * (turns - optimal) / (max_turns - optimal)


class GuessNumberEnv(MultiTurnEnv):
    """Guess a secret integer from higher/lower feedback, in as few turns as possible.

    See the module docstring for the reward shaping.

    Args:
        render_mode: ``None`` or ``"ansi"``.
        **options: :class:`GuessNumberConfig` options.
    """

    config_model = GuessNumberConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        super().__init__(render_mode=render_mode, **options)
        self.config: GuessNumberConfig
        self._secret: int | None = None

    @property
    def secret(self) -> int:
        """The current secret number."""
        if self._secret is None:
            raise RuntimeError("GuessNumberEnv: no secret yet; call reset() first")
        return self._secret

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """Draw the secret (reset takes no options)."""
        if options:
            raise ValueError(f"GuessNumberEnv.reset takes no options, got {sorted(options)}")
        low, high = self.config.low, self.config.high
        self._secret = int(self.np_random.integers(low, high + 1))
        opening = OPENINGS[int(self.np_random.integers(len(OPENINGS)))]
        text = opening.format(low=low, high=high, turns=self.config.max_turns)
        return f"guess-{low}-{high}-{self._secret}", [system(SYSTEM_PROMPT), user(text)]

    def _pick(self, options: Sequence[str]) -> str:
        return options[int(self.np_random.integers(len(options)))]

    def _turns_left(self) -> str:
        left = self.config.max_turns - self.turn
        if left <= 0:
            return f"That was your last turn; the number was {self.secret}."
        return self._pick(TURNS_LEFT).format(r=left, turns="turn" if left == 1 else "turns")

    def on_message(self, text: str) -> Transition:
        """Judge one guess: correct (reward, end), higher/lower, or a corrective message."""
        low, high = self.config.low, self.config.high
        value = last_number(text)
        info: dict[str, Any] = {"guess": None}
        if value is None:
            reply = (
                f"I couldn't find a number in your reply. Please guess a whole number from {low} to {high}."
            )
        elif value.denominator != 1:
            reply = (
                f"{float(value):g} is not a whole number. Please guess a whole number from {low} to {high}."
            )
        elif not low <= value <= high:
            reply = f"{value} is outside the range. Please guess a whole number from {low} to {high}."
        elif value == self.secret:
            optimal = optimal_guesses(low, high)
            turns = "turn" if self.turn == 1 else "turns"
            return Transition(
                messages=[
                    user(f"Correct! The number was {self.secret}. You found it in {self.turn} {turns}.")
                ],
                reward=guess_reward(self.turn, optimal, self.config.max_turns),
                terminated=True,
                info={"guess": self.secret, "optimal_guesses": optimal},
            )
        else:
            info["guess"] = int(value)
            reply = self._pick(HIGHER if value < self.secret else LOWER).format(g=value)
        return Transition(messages=[user(f"{reply} {self._turns_left()}")], info=info)

    def is_success(self, total_reward: float, info: dict[str, Any]) -> bool:
        """Found the number at all (any positive reward); the reward itself grades how fast."""
        return total_reward > 0

    def oracle(self) -> Policy:
        """Binary search over the range, narrowed by the feedback in the conversation."""
        return BinarySearchOracle(self.config.low, self.config.high)


class BinarySearchOracle:
    """Guesses the middle of the range still possible, read from the conversation's higher/lower replies.

    Args:
        low: Smallest possible secret.
        high: Largest possible secret.
    """

    def __init__(self, low: int, high: int):
        self.low, self.high = low, high

    def bounds(self, history: Sequence[Message]) -> tuple[int, int]:
        """The range still possible after the guesses and replies in ``history``."""
        lo, hi = self.low, self.high
        for mine, reply in itertools.pairwise(history):
            guess = last_number(mine.content)
            if mine.role != "assistant" or reply.role != "user" or guess is None or guess.denominator != 1:
                continue
            if _HIGHER_RE.search(reply.content):
                lo = max(lo, int(guess) + 1)
            elif _LOWER_RE.search(reply.content):
                hi = min(hi, int(guess) - 1)
        return lo, hi

    def act(self, history: Sequence[Message]) -> str:
        """One guess, with the reasoning in a sentence (the guess is the last number)."""
        lo, hi = self.bounds(history)
        guess = (lo + hi) // 2
        if not any(m.role == "assistant" for m in history):
            return f"I'll start in the middle of {lo} to {hi}: {guess}."
        if lo == hi:
            return f"It can only be {guess}."
        digest = hashlib.sha256("\x00".join(m.content for m in history).encode()).digest()[0]
        options = (
            f"So it is between {lo} and {hi}. My guess is {guess}.",
            f"The number must be from {lo} to {hi}, so I'll try {guess}.",
            f"That leaves {lo} to {hi}. Halfway is {guess}.",
        )
        return options[digest % len(options)]
