"""A rich progress bar for long rollout runs, usable as the scheduler's progress callback."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from srt_agent.contracts.trajectory import Trajectory


class RolloutProgress:
    """Progress bar advanced by each finished trajectory, with ok/truncated/failed counts.

    Example:
        >>> with RolloutProgress(len(specs), description="srt/Calculator-v0") as bar:  # doctest: +SKIP
        ...     trajectories = run_rollouts(engine, fmt, specs, progress=bar)

    Args:
        total: Episodes expected.
        description: Label shown before the bar.
        console: Where to draw (default: a new stderr-aware rich console).
    """

    def __init__(self, total: int, *, description: str = "rollouts", console: Console | None = None):
        self.counts = {"ok": 0, "truncated": 0, "failed": 0}
        self.successes = 0
        self.tokens = 0
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[stats]}"),
            console=console,
        )
        self._task = self._progress.add_task(description, total=total, stats=self._stats())

    def _stats(self) -> str:
        c = self.counts
        return f"solved {self.successes}  trunc {c['truncated']}  failed {c['failed']}  tokens {self.tokens}"

    def __call__(self, trajectory: Trajectory) -> None:
        """Count one finished trajectory and advance the bar."""
        self.counts[trajectory.status] += 1
        self.successes += trajectory.success
        self.tokens += trajectory.generated_tokens
        self._progress.update(self._task, advance=1, stats=self._stats())

    def __enter__(self) -> RolloutProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()
