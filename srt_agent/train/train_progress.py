"""Rich progress display of a training run: a bar over steps and a bar for the current phase."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from srt_agent.contracts.trajectory import Trajectory
from srt_agent.output.console import Heartbeat
from srt_agent.rollout.scheduler import ProgressCallback


class TrainProgress:
    """Two bars: training steps (with the last step's reward and timing) and the running phase.

    The phase bar counts finished episodes of the current rollout, baseline or evaluation.

    Args:
        total_steps: ``trainer.steps``.
        done_steps: Steps already done (a resumed run).
        console: Where to draw.
        disable: Draw nothing (tests, ``--quiet`` callers).
    """

    def __init__(
        self, total_steps: int, done_steps: int = 0, *, console: Console | None = None, disable: bool = False
    ) -> None:
        self._progress = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            disable=disable,
        )
        self._steps = self._progress.add_task("steps", total=total_steps, completed=done_steps, info="")
        self._done = done_steps
        self._beat = None if disable else Heartbeat(self._progress.console, "step", total_steps)
        self._phase = self._progress.add_task("", total=1, info="", visible=False)
        self._solved = 0

    def phase(self, description: str, total: int) -> ProgressCallback:
        """Start a phase of ``total`` episodes; returns the callback that counts them."""
        self._solved = 0
        self._progress.reset(self._phase, total=total, description=description, info="", visible=True)

        def advance(trajectory: Trajectory) -> None:
            self._solved += trajectory.success
            self._progress.update(self._phase, advance=1, info=f"solved {self._solved}")

        return advance

    def step_done(self, record: dict[str, Any]) -> None:
        """Advance the step bar and show the step's headline numbers."""
        info = (
            f"reward {record.get('reward_mean', 0.0):.3f}  success {record.get('success_rate', 0.0):.0%}  "
            f"{record.get('step_s', 0.0):.1f} s/step"
        )
        if record.get("srt_speedup") is not None:
            info += f"  SRT x{record['srt_speedup']:.2f}"
        self._progress.update(self._steps, advance=1, info=info)
        self._done += 1
        if self._beat is not None:
            self._beat.update(self._done, info)

    def __enter__(self) -> TrainProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.update(self._phase, visible=False)
        self._progress.stop()
