"""TreeCache's batched calls: one draft per row from the streams' cursors, one report per step."""

from __future__ import annotations

import random

import pytest

from srt_agent.contracts.draft import DraftQuery, DraftTree, StreamUpdate
from srt_agent.tree_cache import TreeCache, TreeCacheConfig

pytestmark = pytest.mark.usefixtures("cache_backend")


def q(stream: str, generated: list[int], budget: int = 8, state: str = "s", task: str = "T") -> DraftQuery:
    return DraftQuery(stream, state, task, [9], generated, budget)


def same(a: DraftTree, b: DraftTree) -> bool:
    return (a.token_ids, a.parents, a.probs, a.source, a.backoff) == (
        b.token_ids,
        b.parents,
        b.probs,
        b.source,
        b.backoff,
    )


def test_batched_drafts_equal_per_row_drafts() -> None:
    """GRPO-like groups in lockstep: every step's batched drafts equal per-row draft() calls."""
    rng = random.Random(0)
    cache = TreeCache(TreeCacheConfig(backoff_window=1))
    base = [rng.randrange(50) for _ in range(60)]
    for _ in range(3):  # earlier samples of the state, each a variation of the base text
        seq = [t if rng.random() > 0.1 else rng.randrange(50) for t in base]
        cache.insert("s", "T", seq)
    streams = {f"r{i}": [t if rng.random() > 0.1 else rng.randrange(50) for t in base] for i in range(4)}
    sources = set()
    for step in range(len(base)):
        queries = [q(sid, seq[:step]) for sid, seq in streams.items()]
        batched = cache.draft_many(queries)
        for query, got in zip(queries, batched, strict=True):
            want = cache.draft(query.state_key, query.task_id, query.prompt_ids, query.generated, 8)
            assert same(got, want), (step, query.stream_id)
            sources.add(got.source)
        cache.extend_many([StreamUpdate(sid, "s", "T", [seq[step]]) for sid, seq in streams.items()])
    assert {"exact", "task"} <= sources  # both the cursor and the fallback search were exercised
    cache.check_integrity()


def test_the_cursor_spares_the_walk_from_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = TreeCache()
    if cache.backend != "python":
        pytest.skip("reads the Python core's internals")
    text = list(range(1, 400))
    cache.insert("s", "T", [*text, 0])
    cache.extend("r", "s", "T", text[:300])
    walked = []
    locate = cache._core._locate  # type: ignore[attr-defined]
    monkeypatch.setattr(
        cache._core, "_locate", lambda state, gen: walked.append(len(gen)) or locate(state, gen)
    )
    draft = cache.draft_many([q("r", text[:300])])[0]
    assert (draft.source, draft.token_ids) == ("exact", tuple(text[300:308]))
    assert walked == []  # served from the stream's cursor
    cache.draft("s", "T", [9], text[:300], 8)
    assert walked == [300]


def test_queries_the_cursor_cannot_serve_are_searched() -> None:
    cache = TreeCache()
    cache.insert("s", "T", [1, 2, 3])
    # No such stream, another state, or a stream that has not reported these tokens yet.
    cache.extend("r", "s", "T", [1])
    for query in (q("nobody", [1]), q("r", [1, 2]), q("r", [1], state="s2")):
        got = cache.draft_many([query])[0]
        want = cache.draft(query.state_key, query.task_id, query.prompt_ids, query.generated, 8)
        assert same(got, want)
    assert cache.draft_many([q("r", [1], budget=0)])[0].source == "none"
    with pytest.raises(ValueError, match="budget must be >= 0"):
        cache.draft_many([q("r", [1], budget=-1)])


def test_extend_many_applies_the_valid_updates_and_names_the_bad_ones() -> None:
    cache = TreeCache()
    cache.extend("a", "s", "T", [1])
    with pytest.raises(ValueError) as err:
        cache.extend_many(
            [
                StreamUpdate("a", "s", "T", [2]),
                StreamUpdate("a2", "s", "T", [-3]),
                StreamUpdate("a", "s", "T", [3], "runahead"),
                StreamUpdate("b", "s", "T", [1, 5]),
            ]
        )
    assert "'a2'" in str(err.value) and "'a'" in str(err.value) and "runahead" in str(err.value)
    draft = cache.draft("s", "T", [9], [1], 8)  # both valid updates applied: 2 and 5 follow 1
    assert sorted(draft.token_ids) == [2, 5] and draft.parents == (-1, -1)
    cache.finish("a")
    cache.finish("b")
    cache.check_integrity()


def test_index_keys_from_a_path_equal_the_walk_up_the_tree() -> None:
    from srt_agent.tree_cache.prefix_tree import Node, add_child
    from srt_agent.tree_cache.suffix_index import node_keys, path_keys

    rng = random.Random(1)
    root = Node(-1, None, 0)
    node, path = root, []
    for tick in range(1, 12):
        path.append(rng.randrange(5))
        node, _ = add_child(node, path[-1], tick)
        for windows in ((3,), (3, 1), (5, 2)):
            assert path_keys(path, windows) == node_keys(node, windows)
