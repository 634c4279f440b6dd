"""torch.profiler around an engine's work: where a step's device and host time go, kernel by kernel.

The engine runs its steps on its own worker thread, and torch.profiler records host operators on
the thread that starts it, so the profiler is started and stopped there. The engine labels its
work (:data:`RANGES`), so the tables give each kind of step's host and device time as one row
besides the kernels and operators under it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from srt_agent.engine.batching import DECODE_RANGE, DRAFT_RANGE, PREFILL_RANGE, VERIFY_RANGE

T = TypeVar("T")

RANGES = (PREFILL_RANGE, DECODE_RANGE, VERIFY_RANGE, DRAFT_RANGE)
"""The labels (``torch.profiler.record_function``) of the engine's prefills, plain decode steps,
verify steps and draft lookups."""


class _OnWorker(Protocol):
    def _call(self, fn: Callable[[], Any]) -> Any: ...


def device_us(event: object, own: bool = True) -> float:
    """An averaged profiler event's device (CUDA) time in microseconds (0 on a CPU).

    ``own``: the kernels it launched itself; else those of its children too (a range's total).
    """
    prefix = "self_" if own else ""
    for attr in (f"{prefix}device_time_total", f"{prefix}cuda_time_total"):  # newer, older torch
        value = getattr(event, attr, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_engine(engine: _OnWorker, work: Callable[[], T], path: Path, title: str) -> tuple[T, float]:
    """Run ``work`` with torch.profiler on ``engine``'s worker; write the tables to ``path``.

    Args:
        engine: A TorchEngine (anything that runs a callable on its worker thread with ``_call``).
        work: What to profile (e.g. one generation or one round of rollouts).
        path: The text file to write: ``title``, then the top operators and kernels by device
            time and by host time (the engine's :data:`RANGES` among them).
        title: The file's first line.

    Returns:
        ``work``'s result and the kernels' total device time in milliseconds (0 on a CPU).
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities)
    engine._call(prof.start)
    try:
        result = work()
    finally:
        engine._call(prof.stop)
    averages = prof.key_averages()
    total_ms = sum(device_us(e) for e in averages) / 1000
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write(f"{title}; kernels {total_ms:.1f} ms\n\n")
        ranges = [e for e in averages if e.key in RANGES]
        for e in ranges:
            n = max(e.count, 1)
            host_ms, device_ms = e.cpu_time_total / 1000 / n, device_us(e, own=False) / 1000 / n
            f.write(f"{e.key}: {e.count} calls, host {host_ms:.3f} ms each (its operators included), ")
            f.write(f"device {device_ms:.3f} ms each\n")
        f.write("\n")
        for key in ("self_device_time_total", "self_cpu_time_total"):
            try:
                f.write(averages.table(sort_by=key, row_limit=30) + "\n")
            except (AttributeError, KeyError, ValueError):  # an older torch names the column otherwise
                f.write(averages.table(sort_by="self_cuda_time_total", row_limit=30) + "\n")
    return result, total_ms
