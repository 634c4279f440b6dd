"""TreeCache's batched calls: one draft per row from the streams' cursors, one report per step."""

from __future__ import annotations

import random

import pytest

from srt_agent.spec import DraftTree, TreeCache, TreeCacheConfig
from srt_agent.spec.draft import DraftQuery, StreamUpdate


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


def test_exact_drafts_from_the_cursor_equal_the_searched_ones() -> None:
    """GRPO-like groups in lockstep: every step's batched drafts equal per-row draft() calls."""
    rng = random.Random(0)
    cache = TreeCache()
    base = [rng.randrange(50) for _ in range(60)]
    for _ in range(3):  # earlier samples of the state, each a variation of the base text
        seq = [t if rng.random() > 0.1 else rng.randrange(50) for t in base]
        cache.insert("s", "T", seq)
    streams = {f"r{i}": [t if rng.random() > 0.1 else rng.randrange(50) for t in base] for i in range(4)}
    for step in range(len(base)):
        queries = [q(sid, seq[:step]) for sid, seq in streams.items()]
        batched = cache.draft_many(queries)
        for query, got in zip(queries, batched, strict=True):
            want = cache.draft(query.state_key, query.task_id, query.prompt_ids, query.generated, 8)
            if want.source == "exact":
                assert same(got, want), (step, query.stream_id)
            else:  # a fallback: the cursor may keep an older match; any valid draft is fine
                assert got.source in ("task", "global", "none")
        cache.extend_many([StreamUpdate(sid, "s", "T", [seq[step]]) for sid, seq in streams.items()])
    cache.check_integrity()


def test_fallback_cursor_advances_without_searching_again(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = TreeCache(TreeCacheConfig(window=2))
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    cache.insert("other", "T", text)  # another state of the task said it before
    searches = []
    search = cache._suffix_roots

    def counted(task_id: str, gen: list[int]) -> object:
        searches.append(len(gen))
        return search(task_id, gen)

    monkeypatch.setattr(cache, "_suffix_roots", counted)
    gen = [40, 1, 2]  # the new state's stream: its own first token, then the task's text
    cache.extend("r", "s", "T", gen)
    first = cache.draft_many([q("r", gen)])[0]
    assert (first.source, first.token_ids) == ("task", (3, 4, 5, 6, 7, 8, 9, 10))
    for t in (3, 4, 5):  # the stream goes on as the match did: the cursor follows it
        gen.append(t)
        cache.extend("r", "s", "T", [t])
        draft = cache.draft_many([q("r", gen)])[0]
        assert (draft.source, draft.token_ids[0]) == ("task", t + 1)
    assert searches == [3]
    gen.append(77)  # the stream leaves the matched text: the cursor falls off, a new search runs
    cache.extend("r", "s", "T", [77])
    assert cache.draft_many([q("r", gen)])[0].source == "none"
    assert searches == [3, 7]
    cache.finish("r")
    cache.check_integrity()


def test_backoff_match_counts_as_full_once_it_has_gone_on_a_window() -> None:
    cache = TreeCache(TreeCacheConfig(window=3, backoff_window=1))
    cache.insert("other", "T", [1, 2, 3, 4, 5, 6])
    gen = [50, 51, 2]  # only the last token matches: a back-off draft
    cache.extend("r", "s", "T", gen)
    assert cache.draft_many([q("r", gen)])[0].backoff
    for t, backoff in ((3, True), (4, False), (5, False)):
        gen.append(t)
        cache.extend("r", "s", "T", [t])
        assert cache.draft_many([q("r", gen)])[0].backoff is backoff


def test_eviction_voids_fallback_cursors() -> None:
    cache = TreeCache()
    cache.insert("old", "T", [1, 2, 3, 4, 5])
    gen = [60, 1, 2, 3]
    cache.extend("r", "s", "T", gen)
    assert cache.draft_many([q("r", gen)])[0].token_ids == (4, 5)
    assert cache.evict(1) == ["old"]  # least recently used (the stream's state was used since)
    assert cache.draft_many([q("r", gen)])[0].source == "none"
    cache.check_integrity()


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
    assert cache.draft("s", "T", [9], [1], 8).token_ids[:2] in ((2,), (5,), (2, 5), (5, 2))
    cache.finish("a")
    cache.finish("b")
    cache.check_integrity()
