"""The byte estimate is honest (close to the memory each core holds) and returns to zero when emptied."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import random
import tracemalloc

import pytest

from srt_agent import native
from srt_agent.tree_cache import TreeCache, TreeCacheConfig

PYTHON = TreeCacheConfig(backend="python")


def workload(states: int = 16, group: int = 8, length: int = 160, vocab: int = 30_000) -> list[tuple]:
    """GRPO-like groups: samples share prefixes with earlier ones and reuse common phrases."""
    rng = random.Random(0)
    phrases = [[rng.randrange(vocab) for _ in range(rng.randrange(3, 12))] for _ in range(60)]
    out = []
    for s in range(states):
        seqs: list[list[int]] = []
        for _ in range(group):
            seq = list(rng.choice(seqs)[: rng.randrange(length)]) if seqs and rng.random() < 0.7 else []
            while len(seq) < length:
                seq.extend(rng.choice(phrases) if rng.random() < 0.5 else [rng.randrange(vocab)])
            seqs.append(seq[:length])
        out.append((f"state{s}", f"task{s % 5}", [json.dumps(q) for q in seqs]))
    return out


def fill(cache: TreeCache, data: list[tuple]) -> None:
    for key, task, seqs in data:
        for i, packed in enumerate(seqs):
            tokens = json.loads(packed)  # fresh int objects, so the cache holds the only references
            if i % 2:
                cache.insert(key, task, tokens)
            else:
                for j in range(0, len(tokens), 4):
                    cache.extend(f"{key}/{i}", key, task, tokens[j : j + 4])
                cache.finish(f"{key}/{i}")


def test_byte_estimate_is_close_to_measured_memory() -> None:
    data = workload()
    gc.collect()
    tracemalloc.start()
    try:
        cache = TreeCache(PYTHON)
        fill(cache, data)
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    estimate = cache.stats().bytes
    assert 0.8 <= estimate / measured <= 1.25, (estimate, measured)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _heap_in_use() -> int | None:
    """Bytes malloc has handed out (glibc's mallinfo2), or ``None`` where it is unavailable."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _MallInfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


@pytest.mark.skipif(native.core is None, reason="the native core is not built (or SRT_NATIVE=0)")
def test_native_byte_estimate_is_close_to_the_heap_it_uses() -> None:
    data = workload()
    if _heap_in_use() is None:
        pytest.skip("needs glibc's mallinfo2")
    gc.collect()
    before = _heap_in_use()
    cache = TreeCache(TreeCacheConfig(backend="native"))
    fill(cache, data)
    gc.collect()
    after = _heap_in_use()
    assert before is not None and after is not None
    estimate = cache.stats().bytes
    python_estimate = 0
    reference = TreeCache(PYTHON)
    fill(reference, data)
    python_estimate = reference.stats().bytes
    assert 0.7 <= estimate / (after - before) <= 1.4, (estimate, after - before)
    assert estimate < python_estimate  # arrays, not objects: the same budget holds more


@pytest.mark.usefixtures("cache_backend")
def test_bytes_return_to_zero_when_everything_is_evicted() -> None:
    cache = TreeCache()
    fill(cache, workload(states=4, group=4, length=50))
    cache.extend("open", "state0", "task0", [1, 2, 3])
    assert cache.stats().bytes > 0
    cache.evict(len(cache))
    cache.finish("open")
    stats = cache.stats()
    assert (stats.bytes, stats.nodes, stats.states, stats.evictions) == (0, 0, 0, 4)
    cache.check_integrity()


def test_eviction_frees_memory_without_waiting_for_the_cyclic_gc() -> None:
    # Nodes point to their parents and parents to their children; eviction breaks those cycles so
    # the memory is back at once (the byte counter says so immediately, the heap should agree;
    # without the cycle breaking, all of it would stay until a full collection).
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        cache = TreeCache(PYTHON)
        fill(cache, workload(states=6, group=4, length=100))
        held = tracemalloc.get_traced_memory()[0]
        cache.evict(len(cache))
        left = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        gc.enable()
    assert left < 0.15 * held, (held, left)  # what stays: the index dicts' tables (dicts never shrink)
