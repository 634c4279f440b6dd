"""``is_success`` for a proxy of an env that lives elsewhere (a worker process, a Ray env worker).

The rollout asks ``env.unwrapped.is_success(total, info)`` after ``close``, but a remote env is gone
by then. So the proxy asks the env's own judge while closing, with the rewards and info it saw, and
answers from that verdict afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class JudgedAtClose:
    """The success verdict a remote env gave at ``close``, read back by the rollout."""

    _verdict: tuple[float, bool | None] | None = None  # (total judged, the env's answer; None: no judge)
    _judge_error: BaseException | None = None  # what the env's judge raised, if it did

    def is_success(self, total_reward: float, final_info: Mapping[str, Any]) -> bool:
        """The env's own judgement (asked remotely at ``close``); without one, reward >= 1.

        Raises:
            Exception: What the env's judge raised (the rollout counts the episode as not solved).
        """
        if self._judge_error is not None:
            raise self._judge_error
        if self._verdict is not None and self._verdict[0] == total_reward and self._verdict[1] is not None:
            return self._verdict[1]
        return total_reward >= 1.0 - 1e-9
