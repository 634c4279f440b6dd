"""TreeCache persistence (save/load, bad files), trace warm-up and the integrity check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from srt_agent.contracts.generation import state_key
from srt_agent.rollout import TraceFormatError, TraceTurn
from srt_agent.rollout.trace import ingest_trace
from srt_agent.tree_cache import (
    TREE_CACHE_FORMAT,
    CacheFileError,
    CacheIntegrityError,
    TreeCache,
    TreeCacheConfig,
)

pytestmark = pytest.mark.usefixtures("cache_backend")


def filled() -> TreeCache:
    cache = TreeCache(TreeCacheConfig(window=2))
    cache.insert("s0", "A", [1, 2, 3, 4])
    cache.insert("s0", "A", [1, 2, 5])
    cache.extend("r", "s1", "A", [7, 2, 3, 9], kind="runahead")
    cache.insert("s2", "", [300_000, 1, 2])  # a big token id, a state without a task
    cache.draft("s0", "A", [0], [1], budget=4)
    return cache


QUERIES = [("s0", "A", []), ("s0", "A", [1, 2]), ("s9", "A", [2, 3]), ("s9", "Z", [1, 2]), ("s1", "A", [7])]


def test_save_load_round_trip(tmp_path: Path) -> None:
    cache = filled()
    path = tmp_path / "run" / "cache.npz"
    cache.save(path)
    loaded = TreeCache.load(path)
    loaded.check_integrity()
    assert loaded.config == cache.config
    assert loaded.state_keys() == cache.state_keys()
    before, after = cache.stats(), loaded.stats()
    assert after.streams == 0  # the in-flight stream was saved as far as it got
    assert (after.nodes, after.states, after.drafts_exact, after.tokens_added) == (
        before.nodes,
        before.states,
        before.drafts_exact,
        before.tokens_added,
    )
    cache.finish("r")  # now both hold the same sequences
    for key, task, gen in QUERIES:
        assert loaded.draft(key, task, [0], gen, 8) == cache.draft(key, task, [0], gen, 8), (key, gen)
    # The loaded cache keeps working: new nodes get fresh creation ticks.
    loaded.extend("x", "s0", "A", [1, 2, 6])
    loaded.check_integrity()


def test_arrays_are_stored_narrow_when_they_fit_and_older_deflated_files_load(tmp_path: Path) -> None:
    cache = filled()
    cache._core.next_tick = 2**40  # creation ticks past int32 (a long run): that array stays int64
    cache.insert("s3", "B", [5, 6])
    cache.save(tmp_path / "c.npz")
    with np.load(tmp_path / "c.npz") as data:
        arrays = {name: data[name] for name in data.files}
    assert arrays["tokens"].dtype == np.int32 and arrays["counts"].dtype == np.int32
    assert arrays["ticks"].dtype == np.int64 and arrays["ticks"].max() >= 2**40
    loaded = TreeCache.load(tmp_path / "c.npz")
    loaded.check_integrity()
    assert loaded.draft("s3", "B", [0], [5], 4) == cache.draft("s3", "B", [0], [5], 4)
    # Files written before (deflated, int64 arrays) still load, to the same cache.
    wide = {k: (v.astype(np.int64) if k not in ("meta", "parents") else v) for k, v in arrays.items()}
    with (tmp_path / "old.npz").open("wb") as f:
        np.savez_compressed(f, **wide)
    old = TreeCache.load(tmp_path / "old.npz")
    assert old.state_keys() == loaded.state_keys() and old.stats().nodes == loaded.stats().nodes


def test_load_with_a_smaller_budget_evicts_least_recent(tmp_path: Path) -> None:
    cache = filled()
    cache.save(tmp_path / "c.npz")
    budget = cache.stats().bytes // 2
    loaded = TreeCache.load(tmp_path / "c.npz", TreeCacheConfig(byte_budget=budget))
    assert loaded.stats().bytes <= budget
    assert loaded.state_keys() == cache.state_keys()[-len(loaded) :]


def write_npz(path: Path, meta: object, **arrays: np.ndarray) -> None:
    base = {
        name: np.zeros(0, dtype=np.int64) for name in ("parents", "tokens", "counts", "ends", "live", "ticks")
    }
    base["offsets"] = np.zeros(1, dtype=np.int64)
    with path.open("wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta)), **{**base, **arrays})


def test_bad_files_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CacheFileError, match="no such tree cache file"):
        TreeCache.load(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(CacheFileError, match="not a tree cache save file"):
        TreeCache.load(tmp_path / "junk.npz")
    write_npz(tmp_path / "v99.npz", {"format": "srt-tree-cache/99", "state_keys": [], "task_ids": []})
    with pytest.raises(CacheFileError, match=r"format 'srt-tree-cache/99'.*reads 'srt-tree-cache/1'.*delete"):
        TreeCache.load(tmp_path / "v99.npz")
    # Object arrays would need pickle, which loading never allows.
    with (tmp_path / "pickle.npz").open("wb") as f:
        np.savez(f, meta=np.array([{"format": TREE_CACHE_FORMAT}], dtype=object))
    with pytest.raises(CacheFileError, match="not a tree cache save file"):
        TreeCache.load(tmp_path / "pickle.npz")
    meta = {"format": TREE_CACHE_FORMAT, "state_keys": ["s"], "task_ids": ["T"]}
    write_npz(tmp_path / "shapes.npz", meta)  # one state listed, no rows
    with pytest.raises(CacheFileError, match="inconsistent array shapes"):
        TreeCache.load(tmp_path / "shapes.npz")


def test_load_rejects_inconsistent_counts(tmp_path: Path) -> None:
    cache = filled()
    cache.save(tmp_path / "c.npz")
    with np.load(tmp_path / "c.npz") as data:
        arrays = {name: data[name] for name in data.files}
    arrays["counts"] = arrays["counts"].copy()
    arrays["counts"][1] += 1
    with (tmp_path / "bad.npz").open("wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(CacheFileError, match=r"(?s)inconsistent tree cache content.*count 1 != children's 2"):
        TreeCache.load(tmp_path / "bad.npz")


def test_integrity_check_reports_what_is_inconsistent() -> None:
    cache = filled()
    cache.check_integrity()
    if cache.backend != "python":
        pytest.skip("corrupts the Python core's internals")
    core: Any = cache._core
    root = core._states["s0"].root
    node = root.kids
    assert node is not None and not isinstance(node, dict)
    node.count += 1
    with pytest.raises(CacheIntegrityError, match=r"state 's0': node \[1\]: count 3 != children's 2"):
        cache.check_integrity()
    node.count -= 1
    core._bytes += 8
    with pytest.raises(CacheIntegrityError, match="byte counter"):
        cache.check_integrity()
    core._bytes -= 8
    core._states.move_to_end("s0", last=False)
    core._states["s0"], core._states["s2"] = core._states["s2"], core._states["s0"]
    with pytest.raises(CacheIntegrityError, match="the LRU table files state"):
        cache.check_integrity()


def trace_line(episode: int, turn: int, prefix: list[int], new_prompt: list[int], tokens: list[int]) -> str:
    return TraceTurn(
        episode_id=f"e{episode}",
        env_id="srt/Calculator-v0",
        task_id="calc-1",
        seed=0,
        trial=episode,
        turn=turn,
        state_key=state_key(prefix),
        prefix_len=len(prefix),
        new_prompt_ids=tuple(new_prompt),
        token_ids=tuple(tokens),
        logprobs=(-0.1,) * len(tokens),
        finish_reason="stop",
        reward=0.0,
        forward_passes=len(tokens),
        sampling_seed=None,
        last=turn == 1,
        episode_status="ok",
        episode_success=True,
    ).to_json()


def test_a_trace_warms_the_cache(tmp_path: Path) -> None:
    prompt, gen0, obs, gen1 = [1, 2, 3], [10, 11, 12], [20, 21], [30, 31]
    lines = [
        trace_line(0, 0, prompt, prompt, gen0),
        trace_line(0, 1, prompt + gen0 + obs, obs, gen1),
        trace_line(1, 0, prompt, prompt, [10, 13]),
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    cache = TreeCache()
    assert ingest_trace(cache, path) == 3
    assert len(cache) == 2 and cache.stats().tokens_added == 7
    draft = cache.draft(state_key(prompt), "calc-1", prompt, [10], budget=4)
    assert (draft.source, set(draft.token_ids)) == ("exact", {11, 12, 13})
    turn1 = prompt + gen0 + obs
    assert cache.draft(state_key(turn1), "calc-1", turn1, [], budget=4).token_ids == (30, 31)
    path.write_text(lines[0] + "\n{broken\n")
    with pytest.raises(TraceFormatError, match=":2:"):
        ingest_trace(TreeCache(), path)
