"""Handing freed heap memory back to the operating system after a rollout batch (glibc only).

A batch allocates and frees a lot from many threads: env calls run in threads of their own, each
drawing on one of glibc's per-thread arenas, and a huge observation or tool output is a
multi-megabyte string for a moment. glibc keeps what was freed inside its arenas, so a long run's
RSS climbed with the number of episodes although nothing was leaked (Python's own heap stayed
flat under ``tracemalloc``). ``malloc_trim(0)`` returns the free pages of every arena; measured by
``benchmarks/soak.py``, 5,000 episodes with 10% faults: RSS from episode 1,000 to 5,000 +8% without
it, +2% with it (``docs/results.md``). It costs a few milliseconds a batch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any

__all__ = ["release_free_heap"]


@functools.cache
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None  # musl has none


def release_free_heap() -> bool:
    """Return free heap pages to the OS (``malloc_trim(0)``); ``False`` where there is no glibc."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
