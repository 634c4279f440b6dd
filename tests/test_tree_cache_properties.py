"""Property tests: TreeCache against the naive reference on random operation sequences.

Small alphabets (tokens 0..2, four states in two tasks plus one without a task, five stream ids)
make sequences share prefixes, match each other's suffixes, collide in the suffix index and
overflow the candidate caps, so every branch of the draft logic is exercised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tree_cache_reference import ReferenceCache

from srt_agent.contracts.draft import DraftTree
from srt_agent.tree_cache import TreeCache, TreeCacheConfig

pytestmark = pytest.mark.usefixtures("cache_backend")

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
THOROUGH = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

STATES = ["s0", "s1", "s2", "s3"]
TASK_OF = {"s0": "A", "s1": "A", "s2": "B", "s3": ""}
DRAFT_TASKS = ["A", "B", "", "C"]
STREAMS = ["t0", "t1", "t2", "t3", "t4"]
KINDS = ["live", "runahead"]

tokens = st.lists(st.integers(0, 2), max_size=6)
extend_op = st.tuples(
    st.just("extend"), st.sampled_from(STREAMS), st.sampled_from(STATES), tokens, st.sampled_from(KINDS)
)
insert_op = st.tuples(st.just("insert"), st.sampled_from(STATES), tokens, st.sampled_from(KINDS))
draft_op = st.tuples(
    st.just("draft"),
    st.sampled_from(STATES),
    st.sampled_from(DRAFT_TASKS),
    st.integers(0, 10**6),
    st.lists(st.integers(0, 2), max_size=2),
    st.integers(0, 7),
    st.booleans(),
    st.booleans(),
)
# A few sequences first, then a mix weighted towards drafts (the operation with most logic).
ops = st.builds(
    lambda warm, mixed: warm + mixed,
    st.lists(st.one_of(insert_op, extend_op), min_size=2, max_size=6),
    st.lists(
        st.one_of(
            extend_op,
            insert_op,
            draft_op,
            draft_op,
            draft_op,
            st.tuples(st.just("finish"), st.sampled_from(STREAMS)),
            st.tuples(st.just("evict"), st.integers(0, 2)),
            st.tuples(st.just("save_load")),
        ),
        min_size=8,
        max_size=40,
    ),
)

CONFIG = TreeCacheConfig(window=2, backoff_window=1, max_match=4, scan_limit=3, max_candidates=2)
# Small windows and caps: many candidates per key, so recency order, caps and ranking all matter.
CONFIGS = st.sampled_from(
    [
        CONFIG,  # windows (2, 1): back-off to one token
        TreeCacheConfig(window=1, max_match=3, scan_limit=5, max_candidates=2),
        TreeCacheConfig(window=3, max_match=4, scan_limit=3, max_candidates=2),  # no back-off
        TreeCacheConfig(backoff_window=1),
    ]
)


def paths(draft: DraftTree) -> dict[tuple[int, ...], tuple[float, bool]]:
    out = {}
    for i in range(len(draft)):
        path = tuple(draft.token_ids[j] for j in draft.path(i))
        out[path] = (draft.probs[i], draft.runahead[i])
    assert len(out) == len(draft)  # distinct paths: siblings are distinct
    return out


def pick_generated(
    ref: ReferenceCache, key: str, seed: int, tail: list[int], own: bool
) -> tuple[str, list[int]]:
    """A prefix of some cached sequence (so exact walks and suffix matches hit) plus a random tail
    (so they also miss); with ``own``, drafted from that sequence's own state."""
    seqs = [(k, s.tokens) for k, state in ref.states.items() for s in state.seqs]
    if not seqs:
        return key, tail
    seq_key, seq = seqs[seed % len(seqs)]
    return (seq_key if own else key), seq[: (seed // len(seqs)) % (len(seq) + 1)] + tail


def run(ops_: list[tuple[Any, ...]], config: TreeCacheConfig, tmp: Path, *, sync_evictions: bool) -> None:
    cache = TreeCache(config)
    ref = ReferenceCache(config.windows, config.max_match, config.scan_limit, config.max_candidates)
    for step, op in enumerate(ops_):
        name = op[0]
        if name == "extend":
            _, sid, key, toks, kind = op
            if sid in ref.streams:  # keep a stream on its own state and kind (mismatches: unit tests)
                key, kind = ref.streams[sid].key, "live" if ref.streams[sid].live else "runahead"
            cache.extend(sid, key, TASK_OF[key], toks, kind)  # type: ignore[arg-type]
            ref.extend(sid, key, TASK_OF[key], toks, kind)
        elif name == "finish":
            if op[1] in ref.streams:
                cache.finish(op[1])
                ref.finish(op[1])
            else:
                with pytest.raises(ValueError, match="not in flight"):
                    cache.finish(op[1])
        elif name == "insert":
            _, key, toks, kind = op
            cache.insert(key, TASK_OF[key], tuple(toks), kind)
            ref.insert(key, TASK_OF[key], toks, kind)
        elif name == "draft":
            _, key, task, seed, tail, budget, as_tuple, own = op
            key, gen = pick_generated(ref, key, seed, tail, own)
            got = cache.draft(key, task, [9, 9], tuple(gen) if as_tuple else gen, budget)
            want_source, want = ref.draft(key, task, gen, budget)
            assert (got.source, paths(got)) == (want_source, want), (
                f"step {step}: draft({key}, {task}, {gen})"
            )
            assert list(paths(got)) == list(want)  # and chosen in the same (rank) order
            assert len(got) <= budget
        elif name == "evict":
            evicted = cache.evict(op[1])
            assert evicted == [ref.evict_lru() for _ in range(min(op[1], len(ref.states)))]
        else:
            cache.save(tmp / "cache.npz")
            cache = TreeCache.load(tmp / "cache.npz")
            ref.forget_streams()
        cache.check_integrity()
        if sync_evictions:  # the real cache evicted on its byte budget: it must have dropped the LRU states
            while len(ref.states) > len(cache):
                ref.evict_lru()
        assert cache.state_keys() == list(ref.states), f"step {step}: LRU order"
        assert cache.stats().bytes <= config.byte_budget or len(cache) == 0
    stats = cache.stats()
    assert stats.drafts_by_source == {s: ref.served[s] for s in ("exact", "task", "global", "none")}
    assert (stats.nodes_served, stats.runahead_nodes_served) == (ref.served["nodes"], ref.served["runahead"])
    assert stats.streams == len(ref.streams)


@FAST
@given(ops, CONFIGS)
def test_matches_reference(
    tmp_path_factory: pytest.TempPathFactory, ops_: list[tuple[Any, ...]], config: TreeCacheConfig
) -> None:
    run(ops_, config, tmp_path_factory.mktemp("cache"), sync_evictions=False)


@FAST
@given(ops, CONFIGS, st.integers(2000, 20000))
def test_matches_reference_under_byte_budget(
    tmp_path_factory: pytest.TempPathFactory,
    ops_: list[tuple[Any, ...]],
    config: TreeCacheConfig,
    budget: int,
) -> None:
    config = config.model_copy(update={"byte_budget": budget})
    run(ops_, config, tmp_path_factory.mktemp("cache"), sync_evictions=True)


@pytest.mark.slow
@THOROUGH
@given(ops, CONFIGS, st.integers(2000, 100_000))
def test_matches_reference_thoroughly(
    tmp_path_factory: pytest.TempPathFactory,
    ops_: list[tuple[Any, ...]],
    config: TreeCacheConfig,
    budget: int,
) -> None:
    config = config.model_copy(update={"byte_budget": budget})
    run(ops_, config, tmp_path_factory.mktemp("cache"), sync_evictions=True)
