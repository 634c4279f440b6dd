"""What verify steps really gain over plain decode steps, per request group: the cost model's guard.

The cost model (:mod:`srt_agent.engine.speculation.budget`) decides from predicted step times,
fitted by forward size alone. Where a step's cost depends on more than its size (on a CPU,
attention over each row's context: Retail's contexts run to 2,000 tokens), the fits can be off
long enough for drafting to lose: measured on 2 CPU cores, Retail verified nearly every step at
1.6 tokens per forward while a verify step cost 1.7-2.3x a plain one at the same batch size.

So the steps' real cost is kept too. Plain steps are timed per batch-size bucket (a power of two:
a step's fixed cost makes the time per row fall several-fold from 1 row to 32), kept fresh while
drafting by the cost model's control steps. Each verify step then yields, per request group (an
env) with rows in it, a realized speed-up: the group's tokens per row over the step's cost in
plain steps of the same bucket (its draft lookups included). A group whose decayed speed-up is
below :data:`MIN_SPEEDUP` is *losing*: it is not asked for drafts outside probes, which go on
re-measuring it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from srt_agent.engine.step_graphs import bucket

MIN_SPEEDUP = 1.05
"""Realized speed-up a group's verify steps must keep to go on drafting (a tie is noise, not a gain)."""

_DECAY = 0.8  # per observation: the last ~5 decide
_MIN_STEPS = 3  # verify steps of a group seen before a verdict


class RealizedCost:
    """Decayed plain-step seconds per batch bucket, and realized verify speed-ups per request group."""

    def __init__(self) -> None:
        self._plain: dict[tuple[str, int], float] = {}  # (group, bucket): seconds of a plain step
        self._speedup: dict[str, tuple[float, int]] = {}  # group: (speed-up, verify steps seen)

    def observe_plain(self, groups: Iterable[str], rows: int, seconds: float) -> None:
        """Add a plain decode step of ``rows`` rows (of these groups) that took ``seconds``."""
        key_bucket = bucket(rows)
        for group in groups:
            key = (group, key_bucket)
            old = self._plain.get(key)
            self._plain[key] = seconds if old is None else _DECAY * old + (1 - _DECAY) * seconds

    def observe_verify(self, per_group: Mapping[str, tuple[int, int]], rows: int, seconds: float) -> None:
        """Add a verify step of ``rows`` rows that took ``seconds`` (its lookups included).

        Args:
            per_group: Per group with rows in the step: ``(its rows, tokens they emitted)``.
            rows: Rows in the step.
            seconds: The step's time.
        """
        for group, (group_rows, tokens) in per_group.items():
            plain = self._plain.get((group, bucket(rows)))
            if plain is None or group_rows == 0 or seconds <= 0:
                continue  # no plain step of this size to compare with yet
            speedup = (tokens / group_rows) * plain / seconds
            old, seen = self._speedup.get(group, (speedup, 0))
            self._speedup[group] = (_DECAY * old + (1 - _DECAY) * speedup, seen + 1)

    def speedup(self, group: str) -> float | None:
        """``group``'s decayed realized speed-up of verify steps over plain ones (``None``: unmeasured)."""
        found = self._speedup.get(group)
        return found[0] if found else None

    def losing(self, group: str) -> bool:
        """Whether ``group``'s recent verify steps gained less than :data:`MIN_SPEEDUP`."""
        found = self._speedup.get(group)
        return found is not None and found[1] >= _MIN_STEPS and found[0] < MIN_SPEEDUP
