"""``is_success`` for a proxy of an env that lives elsewhere (a worker process, a Ray env worker).

The rollout asks ``env.unwrapped.is_success(total, info)`` after ``close``, but a remote env is gone
by then. So the proxy keeps the rewards and info it saw, asks the env's own judge with them while
closing, and answers from that verdict afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any


class JudgedAtClose:
    """What a remote env's judge needs (rewards and info seen) and the verdict it gave at ``close``.

    A proxy calls :meth:`_start_judging` before each ``reset`` (and in ``__init__``), feeds what
    ``reset`` and ``step`` returned to :meth:`_saw_info` and :meth:`_saw_step`, and sets
    ``_verdict`` or ``_judge_error`` when it closes.
    """

    _total: float  # rewards seen this episode
    _info: dict[str, Any]  # the last info seen
    _verdict: tuple[float, bool | None] | None  # (total judged, the env's answer; None: no judge)
    _judge_error: BaseException | None  # what the env's judge raised, if it did

    def _start_judging(self) -> None:
        """Forget the previous episode's rewards, info and verdict."""
        self._total, self._info, self._verdict, self._judge_error = 0.0, {}, None, None

    def _saw_info(self, info: Any) -> None:
        if isinstance(info, dict):
            self._info = info

    def _saw_step(self, result: Any) -> None:
        """Keep the reward and info of a ``step`` result (anything malformed is the rollout's to name)."""
        if isinstance(result, tuple) and len(result) == 5:
            with contextlib.suppress(TypeError, ValueError):
                self._total += float(result[1])
            self._saw_info(result[4])

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
