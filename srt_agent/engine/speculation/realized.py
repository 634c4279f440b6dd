"""What verify and plain decode steps really cost per token, per request group: the cost model's guard.

The cost model (:mod:`srt_agent.engine.speculation.budget`) decides from predicted step times,
fitted by forward size alone. Where a step's cost depends on more than its size (on a CPU,
attention over each row's context: Retail's contexts run to 2,000 tokens), the fits can be off
long enough for drafting to lose: measured on 2 CPU cores, Retail verified nearly every step at
1.6 tokens per forward while a verify step cost 1.8-2x a plain one (0.85x of plain decoding).

So the steps' real cost is kept too: per request group (an env), a decayed mean of seconds per
emitted token of verify steps, and of seconds per row of plain steps (one token each; the
cost model's control steps keep it fresh while drafting). A group whose verify steps cost more
per token than its plain steps is *losing*: it is not asked for drafts outside probes, which go on
re-measuring it. A verify step's cost includes its draft lookups; drafting must be 5% cheaper per
token than plain decoding to go on (a tie is noise, not a gain).
"""

from __future__ import annotations

from collections.abc import Iterable

_DECAY = 0.8  # per step: the last ~5 steps of each kind decide
_MIN_STEPS = 3  # steps of each kind seen before a verdict
_MARGIN = 0.95  # drafting must be this much cheaper per token to go on: a tie is noise, not a gain


class RealizedCost:
    """Decayed seconds per token of verify and of plain steps, per request group."""

    def __init__(self) -> None:
        self._plain: dict[str, tuple[float, int]] = {}  # group: (seconds per token, steps seen)
        self._verify: dict[str, tuple[float, int]] = {}

    def observe(self, groups: Iterable[str], seconds: float, tokens: int, *, verify: bool) -> None:
        """Add a step that emitted ``tokens`` tokens (a plain step: one per row) in ``seconds``.

        Every group with rows in the step gets it (a step's cost is not split by row).
        """
        per_token = seconds / max(tokens, 1)
        table = self._verify if verify else self._plain
        for group in groups:
            mean, seen = table.get(group, (per_token, 0))
            table[group] = (_DECAY * mean + (1 - _DECAY) * per_token, seen + 1)

    def losing(self, group: str) -> bool:
        """Whether ``group``'s recent verify steps cost more per token than its plain steps."""
        plain, verify = self._plain.get(group), self._verify.get(group)
        if plain is None or verify is None or min(plain[1], verify[1]) < _MIN_STEPS:
            return False
        return verify[0] > _MARGIN * plain[0]

    def seconds_per_token(self, group: str) -> tuple[float | None, float | None]:
        """``(plain, verify)`` decayed seconds per token of ``group`` (``None``: none seen)."""
        plain, verify = self._plain.get(group), self._verify.get(group)
        return (plain[0] if plain else None, verify[0] if verify else None)
