"""Speculation metrics of an engine: counters updated by its worker, read as resettable snapshots."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

from srt_agent.contracts.speculation import SpecStats


class SpecCounters:
    """Mutable counters behind :class:`SpecStats` (updated by the worker, read from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ints: Counter[str] = Counter()
        self._seconds: Counter[str] = Counter()
        self._histogram: list[int] = []
        self._sources: Counter[str] = Counter()
        self._idle_since: float | None = None

    def add(self, **counts: int) -> None:
        """Add to integer counters (names of :class:`SpecStats` fields)."""
        with self._lock:
            self._ints.update(counts)

    def add_time(
        self,
        *,
        draft: float = 0.0,
        forward: float = 0.0,
        verify: float = 0.0,
        prefill: float = 0.0,
        step: float = 0.0,
        device: float = 0.0,
        decode_step: float = 0.0,
        verify_step: float = 0.0,
        decode_device: float = 0.0,
        verify_device: float = 0.0,
        prefill_device: float = 0.0,
    ) -> None:
        """Add seconds to the time split (each ``name`` to :class:`SpecStats`' ``name_s``)."""
        with self._lock:
            self._seconds.update(
                {
                    "draft": draft,
                    "forward": forward,
                    "verify": verify,
                    "prefill": prefill,
                    "step": step,
                    "device": device,
                    "decode_step": decode_step,
                    "verify_step": verify_step,
                    "decode_device": decode_device,
                    "verify_device": verify_device,
                    "prefill_device": prefill_device,
                }
            )

    def idle_begin(self) -> None:
        """The engine starts waiting with nothing to run."""
        with self._lock:
            self._idle_since = time.perf_counter()

    def idle_end(self) -> None:
        """The wait that :meth:`idle_begin` started is over."""
        with self._lock:
            if self._idle_since is not None:
                self._seconds.update({"idle": time.perf_counter() - self._idle_since})
                self._idle_since = None

    def add_verified_many(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        """Record every row of a step that verified a non-empty draft, under one lock acquisition.

        Args:
            rows: ``(source, drafted, accepted, runahead_accepted)`` per row that verified a draft.
        """
        if not rows:
            return
        drafted = accepted_total = runahead = 0
        with self._lock:
            histogram, sources = self._histogram, self._sources
            for source, n, accepted, from_runahead in rows:
                drafted += n
                accepted_total += accepted
                runahead += from_runahead
                sources[source] += 1
                if accepted >= len(histogram):
                    histogram.extend([0] * (accepted + 1 - len(histogram)))
                histogram[accepted] += 1
            self._ints.update(
                drafted_row_steps=len(rows),
                nodes_drafted=drafted,
                nodes_accepted=accepted_total,
                runahead_nodes_accepted=runahead,
            )

    def snapshot(self, reset: bool = False) -> SpecStats:
        """The counters as a :class:`SpecStats`; with ``reset``, start counting afresh."""
        with self._lock:
            s = self._seconds
            # A wait in progress counts up to now, so the difference of two snapshots is the idle
            # time between them even when a wait spans one of them.
            since = self._idle_since
            idle = s["idle"] + (time.perf_counter() - since if since is not None else 0.0)
            stats = SpecStats(
                **{name: self._ints[name] for name in _INT_FIELDS},
                acceptance_histogram=tuple(self._histogram),
                drafts_by_source=dict(self._sources),
                **{f"{name}_s": value for name, value in s.items() if name != "idle"},
                idle_s=idle,
            )
            if reset:
                self._ints.clear()
                self._seconds.clear()
                if self._idle_since is not None:
                    self._idle_since = time.perf_counter()
                self._histogram = []
                self._sources.clear()
        return stats


_INT_FIELDS = (
    "target_forwards",
    "verify_forwards",
    "prefill_forwards",
    "prefill_rows",
    "prefill_tokens",
    "row_steps",
    "tokens",
    "runahead_tokens",
    "drafted_row_steps",
    "nodes_drafted",
    "nodes_accepted",
    "runahead_nodes_accepted",
    "empty_drafts",
    "probes",
    "preempted",
    "draft_errors",
)
