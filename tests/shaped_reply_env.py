"""``test/ShapedReply-v0``: one reply, rewarded by the share of its characters that are letters.

A shaped reward that a randomly initialised policy already spreads out, so a GRPO group has
advantages to learn from (the built-in envs give such a policy 0 every time). Importable as
``shaped_reply_env:test/ShapedReply-v0`` wherever ``tests/`` is on the path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from srt_agent.chat.messages import Message, user
from srt_agent.env.multi_turn import MultiTurnEnv, Transition
from srt_agent.env.registration import register_env

ENV_ID = "test/ShapedReply-v0"


class ShapedReplyEnv(MultiTurnEnv):
    """Say anything; the reward is the fraction of letters in the reply (0 for an empty one)."""

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        n = int(self.np_random.integers(1000))
        return f"shaped-{n}", [user(f"Write a few words about the number {n}.")]

    def on_message(self, text: str) -> Transition:
        letters = sum(c.isalpha() for c in text)
        return Transition(reward=letters / len(text) if text else 0.0, terminated=True)


register_env(ENV_ID, ShapedReplyEnv)
