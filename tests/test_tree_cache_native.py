"""The native core against the Python reference, bit for bit, on large GRPO-like workloads.

Both cores get the same operations (streams extended a few tokens per step as an engine reports
them, whole inserts, drafts from cursors and by search, finishes, a byte budget small enough to
evict, saves and loads) with the native core pricing bytes as the Python one does. Every draft,
counter, size, LRU order and saved array must agree exactly, and each core must read the other's
files.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from srt_agent import native
from srt_agent.contracts.draft import DraftQuery, StreamUpdate
from srt_agent.tree_cache import TreeCache, TreeCacheConfig

pytestmark = pytest.mark.skipif(native.core is None, reason="the native core is not built (or SRT_NATIVE=0)")


def pair(config: TreeCacheConfig) -> tuple[TreeCache, TreeCache]:
    """A Python and a native cache with the same options and byte prices."""
    py = TreeCache(config.model_copy(update={"backend": "python"}))
    nat = TreeCache(config.model_copy(update={"backend": "native"}), python_prices=True)
    assert (py.backend, nat.backend) == ("python", "native")
    return py, nat


def same_state(py: TreeCache, nat: TreeCache) -> None:
    assert py.stats() == nat.stats()
    assert py.state_keys() == nat.state_keys()


def saved_arrays(cache: TreeCache, path: Path) -> dict[str, np.ndarray]:
    cache.save(path)
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def workload(py: TreeCache, nat: TreeCache, rng: random.Random, steps: int, tmp_path: Path) -> int:
    """Drive both caches alike; returns how many draft nodes were compared."""
    phrases = [[rng.randrange(50) for _ in range(rng.randrange(2, 9))] for _ in range(40)]
    states = [(f"s{i}", f"task{i % 5}" if i % 7 else "") for i in range(24)]
    live: dict[str, tuple[str, str, list[int], str]] = {}  # stream -> (state, task, tokens, kind)
    compared = 0
    for step in range(steps):
        # New streams join (GRPO groups: several samples of one state), others finish.
        while len(live) < 12:
            key, task = rng.choice(states)
            kind = "runahead" if rng.random() < 0.15 else "live"
            live[f"r{step}-{len(live)}-{rng.randrange(10**6)}"] = (key, task, [], kind)
        queries = []
        for sid, (key, task, toks, _) in live.items():
            # Mostly the engine's query (the stream's own tokens), sometimes a stale or foreign one.
            gen = toks if rng.random() < 0.8 else toks[: rng.randrange(len(toks) + 1)]
            queries.append(DraftQuery(sid, key, task, (), list(gen), rng.choice((0, 1, 4, 8, 16))))
        if rng.random() < 0.1:  # a query for a state no one has seen
            queries.append(DraftQuery("nobody", "fresh", rng.choice(["task1", ""]), (), [1, 2, 3], 8))
        want, got = py.draft_many(queries), nat.draft_many(queries)
        assert got == want, step
        compared += sum(len(d) for d in want)
        updates = []
        for sid, (key, task, toks, kind) in live.items():
            new = rng.choice(phrases)[: rng.randrange(1, 5)] if rng.random() < 0.7 else [rng.randrange(400)]
            toks.extend(new)
            updates.append(StreamUpdate(sid, key, task, new, kind))  # type: ignore[arg-type]
        py.extend_many(updates)
        nat.extend_many(updates)
        for sid in [s for s, v in live.items() if len(v[2]) > rng.randrange(20, 120)]:
            py.finish(sid)
            nat.finish(sid)
            del live[sid]
        if rng.random() < 0.2:
            key, task = rng.choice(states)
            seq = [t for _ in range(rng.randrange(1, 12)) for t in rng.choice(phrases)]
            py.insert(key, task, seq)
            nat.insert(key, task, seq)
        if rng.random() < 0.02:
            assert py.evict(1) == nat.evict(1)
        same_state(py, nat)
        if step % 97 == 96:  # save both, compare the files, and carry on from loads (crossed over)
            a, b = saved_arrays(py, tmp_path / "py.npz"), saved_arrays(nat, tmp_path / "nat.npz")
            assert a.keys() == b.keys()
            for name in a:
                assert np.array_equal(a[name], b[name]) and a[name].dtype == b[name].dtype, name
            for sid in live:  # streams do not survive a load
                py.finish(sid)
                nat.finish(sid)
            live.clear()
            py = TreeCache.load(tmp_path / "nat.npz", py.config)
            nat = TreeCache.load(tmp_path / "py.npz", nat.config, python_prices=True)
            same_state(py, nat)
    py.check_integrity()
    nat.check_integrity()
    return compared


@pytest.mark.parametrize(
    ("budget", "windows"),
    [(2**30, (3, 0)), (400_000, (3, 0)), (300_000, (3, 1)), (150_000, (2, 1))],
    ids=["no-evictions", "evicting", "evicting-backoff", "tight-backoff"],
)
def test_native_core_matches_python_bit_for_bit(
    tmp_path: Path, budget: int, windows: tuple[int, int]
) -> None:
    config = TreeCacheConfig(byte_budget=budget, window=windows[0], backoff_window=windows[1])
    py, nat = pair(config)
    compared = workload(py, nat, random.Random(budget), 300, tmp_path)
    assert compared > 5_000  # the drafts compared were real, not empty
    if budget < 2**30:
        assert py.stats().evictions > 0  # the budget was small enough to evict


@pytest.mark.slow
def test_native_core_matches_python_on_a_long_workload(tmp_path: Path) -> None:
    py, nat = pair(TreeCacheConfig(byte_budget=2_000_000, backoff_window=1))
    assert workload(py, nat, random.Random(7), 3000, tmp_path) > 50_000


def test_native_core_refuses_bad_input_as_python_does() -> None:
    py, nat = pair(TreeCacheConfig())
    for cache in (py, nat):
        with pytest.raises(ValueError, match="draft budget must be >= 0"):
            cache.draft_many([DraftQuery("a", "s", "", (), [], -1)])
        with pytest.raises(ValueError, match="token ids must be >= 0, got -3"):
            cache.extend("a", "s", "", [1, -3])
        cache.extend("a", "s", "", [1])
        with pytest.raises(ValueError, match="is a live stream from state 's', not a runahead one"):
            cache.extend("a", "s", "", [2], "runahead")
        with pytest.raises(ValueError, match="kind must be 'live' or 'runahead'"):
            cache.extend("b", "s", "", [2], "lazy")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="is not in flight"):
            cache.finish("never")
    same_state(py, nat)


def test_native_core_refuses_token_ids_past_int32() -> None:
    _, nat = pair(TreeCacheConfig())
    with pytest.raises(ValueError, match="past 2\\*\\*31 - 1"):
        nat.extend("a", "s", "", [2**31])
    with pytest.raises(ValueError, match="past 2\\*\\*31 - 1"):
        nat.insert("s", "", [2**40])


def test_backend_native_without_the_core_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "core", None)
    with pytest.raises(RuntimeError, match=r"native core is not available.*pip install -e"):
        TreeCache(TreeCacheConfig(backend="native"))
    assert TreeCache(TreeCacheConfig(backend="auto")).backend == "python"
