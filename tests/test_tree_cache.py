"""TreeCache unit tests: counts, draft selection, fallbacks, run-ahead flags, eviction, errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pydantic import ValidationError

from srt_agent.contracts.draft import DraftSourceProtocol, DraftTree
from srt_agent.tree_cache import TreeCache, TreeCacheConfig, TreeCacheStats

pytestmark = pytest.mark.usefixtures("cache_backend")


def paths(draft: DraftTree) -> dict[tuple[int, ...], float]:
    return {tuple(draft.token_ids[j] for j in draft.path(i)): draft.probs[i] for i in range(len(draft))}


def test_implements_the_draft_source_protocol() -> None:
    assert isinstance(TreeCache(), DraftSourceProtocol)


def test_exact_draft_is_best_first_by_count() -> None:
    cache = TreeCache()
    for seq in ([1, 2, 3], [1, 2, 3], [1, 2, 4], [5, 6]):
        cache.insert("s", "T", seq)
    draft = cache.draft("s", "T", [9], [], budget=10)
    assert draft.source == "exact"
    assert paths(draft) == {
        (1,): 0.75,
        (1, 2): 0.75,
        (1, 2, 3): 0.5,
        (5,): 0.25,
        (5, 6): 0.25,
        (1, 2, 4): 0.25,
    }
    # Chosen in rank order: probability, then depth, then token path; parents before children.
    assert draft.token_ids == (1, 2, 3, 5, 6, 4)
    assert draft.parents == (-1, 0, 1, -1, 3, 1)
    # A budget keeps the best nodes, still a tree.
    assert paths(cache.draft("s", "T", [9], [], budget=3)) == {(1,): 0.75, (1, 2): 0.75, (1, 2, 3): 0.5}
    cache.check_integrity()


def test_draft_walks_the_generated_tokens_and_conditions_on_going_on() -> None:
    cache = TreeCache()
    cache.insert("s", "T", [1, 2, 3, 4])
    cache.insert("s", "T", [1, 2])  # stopped at 2: says nothing about what follows 2
    cache.insert("s", "T", [1, 2, 7])
    draft = cache.draft("s", "T", [9], (1, 2), budget=8)
    assert draft.source == "exact"
    assert paths(draft) == {(3,): 0.5, (3, 4): 0.5, (7,): 0.5}


def test_second_sample_of_a_group_drafts_from_the_first_in_flight() -> None:
    cache = TreeCache()
    first = [10, 11, 12, 13, 14]
    for t in first:  # the engine commits tokens one step at a time
        cache.extend("g/0", "s", "T", [t])
    # Sample 2 of the group starts at the same state while sample 1 is still generating.
    draft = cache.draft("s", "T", [9], [], budget=8)
    assert (draft.source, draft.token_ids, draft.probs) == ("exact", tuple(first), (1.0,) * 5)
    cache.extend("g/1", "s", "T", [10, 11])
    # From its own position, sample 2 gets the rest of sample 1; its own cursor (an in-flight end
    # at this node) does not dilute the estimate.
    draft = cache.draft("s", "T", [9], [10, 11], budget=8)
    assert (draft.token_ids, draft.probs) == ((12, 13, 14), (1.0, 1.0, 1.0))
    # Sample 1 is at the frontier: nothing followed it yet, so no exact draft (fallback instead).
    assert cache.draft("s", "T", [9], first, budget=8).source != "exact"
    cache.finish("g/0")
    cache.finish("g/1")
    assert cache.stats().streams == 0
    cache.check_integrity()


def test_fallbacks_task_then_global_then_none() -> None:
    cache = TreeCache(TreeCacheConfig(window=2))
    cache.insert("a1", "A", [1, 2, 3, 4, 5])
    cache.insert("b1", "B", [7, 2, 3, 8])
    # The walk falls off a1's tree after [1, 9]; the last tokens [2, 3] occurred in both tasks.
    draft = cache.draft("a1", "A", [0], [1, 9, 2, 3], budget=4)
    assert (draft.source, paths(draft)) == ("task", {(4,): 1.0, (4, 5): 1.0})
    # A new state of task B: task B's own trees win over task A's.
    draft = cache.draft("b2", "B", [0], [6, 2, 3], budget=4)
    assert (draft.source, paths(draft)) == ("task", {(8,): 1.0})
    # A task with nothing cached: the global tree, merging what followed in both tasks.
    draft = cache.draft("c1", "C", [0], [6, 2, 3], budget=4)
    assert (draft.source, paths(draft)) == ("global", {(4,): 0.5, (8,): 0.5, (4, 5): 0.5})
    # A longer match wins over shorter ones: [9, 2, 3] only occurred in task B.
    cache.insert("b1", "B", [9, 2, 3, 6])
    assert paths(cache.draft("c1", "C", [0], [9, 2, 3], budget=4)) == {(6,): 1.0}
    # Nothing matches: an empty draft.
    assert cache.draft("c1", "C", [0], [42, 43], budget=4).source == "none"
    # The start of a continuation matches the start of cached ones (the same task's, first).
    assert paths(cache.draft("a2", "A", [0], [], budget=2)) == {(1,): 1.0, (1, 2): 1.0}
    stats = cache.stats()
    assert stats.drafts_by_source == {"exact": 0, "task": 3, "global": 2, "none": 1}


def test_fallback_backs_off_to_a_shorter_suffix_longer_matches_first() -> None:
    cache = TreeCache(TreeCacheConfig(window=3, backoff_window=1))
    cache.insert("a1", "A", [1, 2, 3, 4])
    cache.insert("b1", "B", [5, 6, 7, 8, 3, 9])
    # [0, 0, 3]: no cached place has those three tokens; on the last token alone, task A's wins.
    draft = cache.draft("a2", "A", [0], [0, 0, 3], budget=4)
    assert (draft.source, paths(draft)) == ("task", {(4,): 1.0})
    # The task's own trees come first, even on one token against three in another task's.
    draft = cache.draft("a2", "A", [0], [7, 8, 3], budget=4)
    assert (draft.source, paths(draft)) == ("task", {(4,): 1.0})
    # A task with nothing cached: three matching tokens beat one (task B's place, then A's).
    draft = cache.draft("c1", "C", [0], [7, 8, 3], budget=4)
    assert (draft.source, paths(draft)) == ("global", {(9,): 1.0})
    # Without back-off the first query finds nothing.
    plain = TreeCache(TreeCacheConfig(window=3, backoff_window=0))
    plain.insert("a1", "A", [1, 2, 3, 4])
    assert plain.draft("a2", "A", [0], [0, 0, 3], budget=4).source == "none"
    assert TreeCacheConfig(window=1, backoff_window=1).windows == (1,) and TreeCacheConfig().windows == (3, 1)
    cache.check_integrity()


def test_runahead_flags_mark_nodes_only_runahead_streams_reached() -> None:
    cache = TreeCache()
    cache.extend("r", "s", "T", [1, 2, 3], kind="runahead")
    cache.extend("l", "s", "T", [1, 2, 4], kind="live")
    draft = cache.draft("s", "T", [9], [], budget=8)
    flags = {tuple(draft.token_ids[j] for j in draft.path(i)): draft.runahead[i] for i in range(len(draft))}
    assert flags == {(1,): False, (1, 2): False, (1, 2, 3): True, (1, 2, 4): False}
    stats = cache.stats()
    assert (stats.nodes_served, stats.runahead_nodes_served) == (4, 1)


def test_lru_eviction_under_the_byte_budget() -> None:
    probe = TreeCache()
    probe.insert("x", "T", list(range(20)))
    one_state = probe.stats().bytes
    cache = TreeCache(TreeCacheConfig(byte_budget=int(2.5 * one_state)))
    cache.insert("old", "T", list(range(20)))
    cache.insert("mid", "T", list(range(100, 120)))
    cache.draft("old", "T", [0], [], budget=4)  # a draft is a use: "mid" is now the least recent
    cache.insert("new", "T", list(range(200, 220)))
    assert cache.state_keys() == ["old", "new"]
    stats = cache.stats()
    assert stats.evictions == 1 and stats.bytes <= stats.byte_budget
    cache.check_integrity()


def test_stream_of_an_evicted_state_is_detached_until_it_finishes() -> None:
    cache = TreeCache()
    cache.extend("x", "s", "T", [1, 2])
    assert cache.evict() == ["s"]
    cache.extend("x", "s", "T", [3, 4])  # dropped: its prefix is gone
    cache.check_integrity()
    assert len(cache) == 0
    cache.finish("x")
    cache.extend("y", "s", "T", [5])  # a new stream starts a new tree
    assert cache.draft("s", "T", [0], [], budget=4).token_ids == (5,)


def test_zero_budget_disables_the_cache_but_keeps_streams_consistent() -> None:
    cache = TreeCache(TreeCacheConfig(byte_budget=0))
    cache.extend("x", "s", "T", [1, 2, 3])
    cache.insert("s", "T", [1, 2, 3])
    assert len(cache) == 0
    assert cache.draft("s", "T", [0], [1], budget=4).source == "none"
    cache.check_integrity()
    cache.finish("x")


def test_bad_input_errors_name_the_value_and_the_fix() -> None:
    cache = TreeCache()
    with pytest.raises(ValueError, match=r"budget must be >= 0.*got -1"):
        cache.draft("s", "T", [0], [], budget=-1)
    with pytest.raises(ValueError, match="token ids must be >= 0, got -5"):
        cache.extend("x", "s", "T", [1, -5])
    with pytest.raises(ValueError, match="token ids must be >= 0, got -2"):
        cache.insert("s", "T", [-2])
    cache.extend("x", "s", "T", [1])
    with pytest.raises(ValueError, match=r"stream 'x' is a live stream from state 's'.*new stream id"):
        cache.extend("x", "other", "T", [2])
    with pytest.raises(ValueError, match="not a runahead one"):
        cache.extend("x", "s", "T", [2], kind="runahead")
    with pytest.raises(ValueError, match="kind must be 'live' or 'runahead', got 'bogus'"):
        cache.extend("x", "s", "T", [2], kind="bogus")  # type: ignore[arg-type]
    cache.finish("x")
    with pytest.raises(ValueError, match="stream 'x' is not in flight"):
        cache.finish("x")
    with pytest.raises(ValueError, match="evict count must be >= 0"):
        cache.evict(-1)
    cache.check_integrity()  # nothing half-done by the rejected calls


def test_config_validation() -> None:
    with pytest.raises(ValidationError, match="byte_budget"):
        TreeCacheConfig(byte_budget=-1)
    with pytest.raises(ValidationError, match=r"max_match \(2\) must be >= window \(3\)"):
        TreeCacheConfig(window=3, max_match=2)
    with pytest.raises(ValidationError, match="extra"):
        TreeCacheConfig(budget=10)  # type: ignore[call-arg]


def test_stats_are_a_frozen_snapshot() -> None:
    cache = TreeCache()
    cache.extend("x", "s", "T", [1, 2, 3])
    stats = cache.stats()
    assert isinstance(stats, TreeCacheStats)
    assert (stats.states, stats.nodes, stats.streams, stats.tokens_added) == (1, 4, 1, 3)
    assert stats.bytes > 0
    with pytest.raises(AttributeError):
        stats.states = 2  # type: ignore[misc]
    cache.insert("s", "T", [4])
    assert stats.tokens_added == 3 and cache.stats().tokens_added == 4


def test_extend_cost_does_not_grow_with_the_stream_length() -> None:
    # The stream's cursor is kept: extending a 20k-token stream costs what extending a short one
    # does (a walk from the root would make it ~1000x slower).
    cache = TreeCache()
    cache.extend("long", "a", "T", list(range(20_000)))
    cache.extend("short", "b", "T", list(range(10)))

    def best_of(stream: str, key: str, start: int) -> float:
        times = []
        for rep in range(5):
            t0 = time.perf_counter()
            for i in range(200):
                cache.extend(stream, key, "T", [start + 200 * rep + i])
            times.append(time.perf_counter() - t0)
        return min(times)

    assert best_of("long", "a", 30_000) < 5 * best_of("short", "b", 30_000)


def _hammer(cache: TreeCache) -> None:
    """Three threads extending, drafting and finishing streams on one cache at once."""

    def worker(w: int) -> None:
        for i in range(300):
            stream, key = f"w{w}/{i // 50}", f"s{(i // 50 + w) % 7}"  # a stream keeps its state
            cache.extend(stream, key, "T", [i % 11, w])
            cache.draft(f"s{i % 7}", "T", [0], [i % 11], budget=8)
            if i % 50 == 49:
                cache.finish(stream)

    with ThreadPoolExecutor(3) as pool:
        for done in [pool.submit(worker, w) for w in range(3)]:
            done.result()  # re-raises a worker's exception
    cache.check_integrity()


def test_concurrent_callers_keep_the_cache_consistent() -> None:
    unbounded = TreeCache()
    _hammer(unbounded)
    stats = unbounded.stats()
    assert stats.streams == 0 and stats.evictions == 0
    assert stats.tokens_added == 3 * 300 * 2  # every token of every thread, none lost
    # Under a small budget, evictions run while the threads work (a stream whose state was evicted
    # is detached and adds nothing more, so the count is then only bounded).
    small = TreeCache(TreeCacheConfig(byte_budget=200_000))
    _hammer(small)
    stats = small.stats()
    assert stats.streams == 0 and stats.evictions > 0 and stats.tokens_added <= 3 * 300 * 2


def test_micro_benchmark_writes_every_timed_call_to_json(tmp_path: Path, cache_backend: str) -> None:
    """``benchmarks/tree_cache_micro.py --json`` records one ``<backend>_<call>_us`` per timed call kind."""
    out = tmp_path / "micro.json"
    script = Path(__file__).parents[1] / "benchmarks" / "tree_cache_micro.py"
    args = ["--states", "2", "--group", "2", "--length", "160", "--reps", "5", "--rows", "4"]
    args += ["--backends", cache_backend, "--json", str(out)]
    subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True)
    record = json.loads(out.read_text())
    timed = {k for k in record if k.endswith("_us")}
    assert len(timed) == 12 and all(k.startswith(cache_backend) and record[k] > 0 for k in timed)
    assert record["nodes_per_state"] > 0 and record["states"] == 2 and record["budget"] == 32
