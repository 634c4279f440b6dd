"""Scripted players of the ecosystem tiers' games (policies reading the conversation so far)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from srt_agent.chat.messages import Message


class BinarySearch:
    """Guesses ``[n]`` in the middle of what the higher/lower hints still allow (1 to 20)."""

    def act(self, history: Sequence[Message]) -> str:
        lo, hi = 1, 20
        for mine, reply in itertools.pairwise(history):
            found = re.search(r"\[(\d+)\]", mine.content) if mine.role == "assistant" else None
            if found:
                guess = int(found.group(1))
                if "higher" in reply.content:
                    lo = guess + 1
                elif "lower" in reply.content:
                    hi = guess - 1
        return f"My guess: [{(lo + hi) // 2}]"


class Hanoi:
    """The 7 moves that solve three disks, one per turn, as ``[A C]``."""

    MOVES = ("A C", "A B", "C B", "A C", "B A", "B C", "A C")

    def act(self, history: Sequence[Message]) -> str:
        return f"[{self.MOVES[sum(m.role == 'assistant' for m in history)]}]"
