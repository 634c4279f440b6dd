"""Gymnasium spaces for chat: any text as the action, a tuple of messages as the observation.

``gymnasium.spaces.Text`` checks every character against a fixed charset whose default is
alphanumeric only, so it rejects ordinary prose (spaces, punctuation, newlines, non-ASCII). These
spaces accept any string; ``sample`` draws strings that look like assistant output, including
fragments of tool-call syntax, so that ``validate_env_options`` exercises an env's handling of messy text.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium.spaces import Space

from srt_agent.chat.messages import Message

_SAMPLE_PIECES = [
    *string.ascii_letters,
    *string.digits,
    *string.punctuation,
    *[" ", " ", " ", "\n", "é", "→", "数"],
    *["<tool_call>", "</tool_call>", '{"name": ', '"arguments": {}', "}", "<answer>", "</answer>"],
]


class AnyText(Space[str]):
    """Any Python ``str`` of at most ``max_length`` characters (Unicode, whitespace and all)."""

    def __init__(self, max_length: int = 100_000, seed: int | np.random.Generator | None = None):
        """Create the space.

        Args:
            max_length: Longest accepted string, in characters.
            seed: Seed for :meth:`sample`.
        """
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = max_length
        super().__init__(dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Text has no fixed-size numeric form."""
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string of up to 64 pieces drawn from letters, punctuation and tool-call syntax."""
        if mask is not None or probability is not None:
            raise ValueError("AnyText.sample does not support mask or probability")
        n = int(self.np_random.integers(0, min(64, self.max_length) + 1))
        pieces = self.np_random.choice(len(_SAMPLE_PIECES), size=n)
        return "".join(_SAMPLE_PIECES[i] for i in pieces)[: self.max_length]

    def contains(self, x: Any) -> bool:
        """True for any ``str`` no longer than ``max_length``."""
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyText) and other.max_length == self.max_length

    def __hash__(self) -> int:
        return hash(("AnyText", self.max_length))


class MessagesSpace(Space[tuple[Message, ...]]):
    """A tuple of :class:`~srt_agent.chat.messages.Message` (the new messages of one env step)."""

    def __init__(self, max_messages: int = 64, seed: int | np.random.Generator | None = None):
        """Create the space.

        Args:
            max_messages: Most messages one observation may hold.
            seed: Seed for :meth:`sample`.
        """
        self.max_messages = max_messages
        self._text = AnyText(max_length=4096)
        super().__init__(dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Messages have no fixed-size numeric form."""
        return False

    def seed(self, seed: int | None = None) -> int | list[int] | dict[str, int]:
        """Seed this space and its text sampler."""
        out = super().seed(seed)
        self._text.seed(int(self.np_random.integers(2**31)))
        return out

    def sample(self, mask: Any = None, probability: Any = None) -> tuple[Message, ...]:
        """One to three random user or tool messages."""
        if mask is not None or probability is not None:
            raise ValueError("MessagesSpace.sample does not support mask or probability")
        n = int(self.np_random.integers(1, min(3, self.max_messages) + 1))
        out = []
        for i in range(n):
            if self.np_random.random() < 0.5:
                out.append(Message(role="user", content=self._text.sample()))
            else:
                out.append(
                    Message(role="tool", content=self._text.sample(), tool_call_id=f"call_{i}", name="tool")
                )
        return tuple(out)

    def contains(self, x: Any) -> bool:
        """True for a tuple of at most ``max_messages`` Message objects."""
        return isinstance(x, tuple) and len(x) <= self.max_messages and all(isinstance(m, Message) for m in x)

    def __repr__(self) -> str:
        return f"MessagesSpace(max_messages={self.max_messages})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagesSpace) and other.max_messages == self.max_messages

    def __hash__(self) -> int:
        return hash(("MessagesSpace", self.max_messages))
