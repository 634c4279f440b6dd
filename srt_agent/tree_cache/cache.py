"""The tree cache (SRT's draft source): continuations of earlier rollouts, per conversation state.

Per state key (the hash of the exact token prefix a generation starts from) the cache keeps a
prefix tree of every continuation generated from that state, with counts (:mod:`prefix_tree`).
Sequences enter token by token while they are generated (:meth:`TreeCache.extend`, one cursor per
stream, so the second sample of a GRPO group already drafts from the first), or whole
(:meth:`TreeCache.insert`; :func:`srt_agent.rollout.trace.ingest_trace` for a whole trace).

A draft for ``(state, generated)`` comes from, in order:

1. ``exact``: the state's tree, at the node reached by walking ``generated`` from its root;
2. ``task``: when the state is new, the walk falls off its tree, or nothing followed there, the
   same task's trees matched on the suffix of the recent tokens (:mod:`suffix_index`): on the last
   ``window`` tokens, else (with ``backoff_window`` set, e.g. 1; off by default) on the last
   ``backoff_window``, so that after a token no cached sequence had in this context (a new
   number, say) drafting resumes at once instead of only once ``window`` tokens match again;
3. ``global``: the same suffix matches over every task;
4. ``none``: an empty draft.

Memory is bounded by an estimated byte budget; over it, whole states are evicted, least recently
used first (a draft from a state, an extension or an insertion counts as a use). Streams whose
state is evicted stop feeding the cache until they finish.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from srt_agent.contracts.draft import (
    EMPTY_DRAFT,
    DraftQuery,
    DraftSource,
    DraftSourceBase,
    DraftTree,
    StreamKind,
    StreamUpdate,
)
from srt_agent.tree_cache.cache_checks import cache_problems
from srt_agent.tree_cache.cache_io import (
    CacheFileError,
    arrays_to_nodes,
    load_arrays,
    save_arrays,
    tree_to_arrays,
)
from srt_agent.tree_cache.cache_types import (
    COUNTERS,
    STREAM_BYTES,
    STREAM_TOKEN_BYTES,
    CacheIntegrityError,
    TreeCacheConfig,
    TreeCacheStats,
)
from srt_agent.tree_cache.prefix_tree import (
    Node,
    child,
    select_draft,
)
from srt_agent.tree_cache.store import State, TreeStore

__all__ = ["CacheIntegrityError", "TreeCache", "TreeCacheConfig", "TreeCacheStats"]

_NOTHING: tuple[list[Node], DraftSource, bool] = ([], "none", False)


def _check_budget(budget: int) -> None:
    if budget < 0:
        raise ValueError(f"draft budget must be >= 0 (0 asks for no draft), got {budget}")


class TreeCache(TreeStore, DraftSourceBase):
    """Draft source for speculative rollouts (a :class:`~srt_agent.contracts.draft.DraftSourceProtocol`).

    Thread-safe (one lock); the engine's worker calls :meth:`draft`, :meth:`extend` and
    :meth:`finish`, a trainer may call :meth:`save` or :meth:`stats` from elsewhere.

    Args:
        config: Options; defaults to :class:`TreeCacheConfig` ().
    """

    def __init__(self, config: TreeCacheConfig | None = None) -> None:
        super().__init__(config)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, state_key: object) -> bool:
        return state_key in self._states

    # ------------------------------------------------------------------ the draft-source protocol
    def draft(
        self, state_key: str, task_id: str, prompt_ids: Sequence[int], generated: Sequence[int], budget: int
    ) -> DraftTree:
        """A draft of at most ``budget`` nodes continuing ``prompt_ids + generated``.

        Args:
            state_key: Hash of ``prompt_ids`` (:func:`srt_agent.engine.state_key`).
            task_id: The env task (enables same-task fallback; ``""``: none).
            prompt_ids: The prompt (not read: the key stands for it, and continuations are matched
                on ``generated``, which starts at the prompt's end).
            generated: Tokens committed since the prompt.
            budget: Most draft nodes.

        Returns:
            Nodes chosen best-first by count-based path probability, distinct siblings.

        Raises:
            ValueError: ``budget`` is negative.
        """
        _check_budget(budget)
        gen = generated if isinstance(generated, list) else list(generated)
        with self._lock:
            found = self._draft_roots(state_key, task_id, gen) if budget else _NOTHING
            return self._select(found, budget)

    def draft_many(self, queries: Sequence[DraftQuery]) -> list[DraftTree]:
        """Every row's draft for a decode step, under one lock (see :meth:`draft`).

        A query whose stream is in flight here and has reported exactly ``generated`` drafts from
        the stream's cursor (O(1) for the exact tree, however long the generation); any other
        query is served as :meth:`draft` serves it. Fallbacks are searched afresh: keeping each
        stream's last suffix match and advancing it with the committed tokens was measured on
        real traces (``benchmarks/draft_replay.py``) and dropped, as the match fell off within a
        few tokens of sampled text (77% of calls searched anyway) and the places it kept were
        weaker than a fresh search's longest matches (tokens per forward 3.05 vs 3.06 on
        Calculator, 1.50 vs 1.53 on Retail), for no saving per call.

        Raises:
            ValueError: A budget is negative.
        """
        for q in queries:
            _check_budget(q.budget)
        out: list[DraftTree] = []
        with self._lock:
            for q in queries:
                gen = q.generated if isinstance(q.generated, list) else list(q.generated)
                found = (
                    self._draft_roots(q.state_key, q.task_id, gen, self._cursor(q, gen))
                    if q.budget
                    else _NOTHING
                )
                out.append(self._select(found, q.budget))
        return out

    def _cursor(self, q: DraftQuery, gen: list[int]) -> Node | None:
        """Where ``q``'s stream stands in its state's tree, if it has reported exactly ``gen``."""
        stream = self._streams.get(q.stream_id)
        if stream is None or stream.node is None or stream.key != q.state_key:
            return None
        tokens = stream.tokens
        if len(tokens) != len(gen) or (gen and tokens[-1] != gen[-1]):
            return None
        return stream.node

    def _select(self, found: tuple[list[Node], DraftSource, bool], budget: int) -> DraftTree:
        """The best-first draft below the found roots (counted by source)."""
        roots, source, backoff = found
        if not roots:
            self._counts["drafts_none"] += 1
            return EMPTY_DRAFT
        tokens, parents, probs, runahead = select_draft(roots, budget)
        self._counts["drafts_" + source] += 1
        self._counts["nodes_served"] += len(tokens)
        self._counts["runahead_nodes_served"] += sum(runahead)
        return DraftTree.trusted(
            tuple(tokens), tuple(parents), tuple(probs), source, tuple(runahead), backoff
        )

    def extend(
        self,
        stream_id: str,
        state_key: str,
        task_id: str,
        new_tokens: Sequence[int],
        kind: StreamKind = "live",
    ) -> None:
        """Append ``new_tokens`` to stream ``stream_id``, a generation from state ``state_key``.

        The first call starts the stream (and the state, if new). Cost: O(len(new_tokens)).

        Raises:
            ValueError: The stream exists with another state or kind, or a token id is negative.
        """
        with self._lock:
            self._extend(stream_id, state_key, task_id, new_tokens, kind)
            self._enforce_budget()

    def extend_many(self, updates: Sequence[StreamUpdate]) -> None:
        """Every row's committed tokens of a step, under one lock (see :meth:`extend`).

        Valid updates are applied even if others are not; the byte budget is enforced once, after
        all of them.

        Raises:
            ValueError: Some updates were invalid (the message names each).
        """
        errors: list[str] = []
        with self._lock:
            for u in updates:
                try:
                    self._extend(u.stream_id, u.state_key, u.task_id, u.new_tokens, u.kind)
                except ValueError as exc:
                    errors.append(str(exc))
            self._enforce_budget()
        if errors:
            raise ValueError("; ".join(errors))

    def _extend(
        self, stream_id: str, state_key: str, task_id: str, new_tokens: Sequence[int], kind: StreamKind
    ) -> None:
        if kind not in ("live", "runahead"):
            raise ValueError(f"stream {stream_id!r}: kind must be 'live' or 'runahead', got {kind!r}")
        if len(new_tokens) and min(new_tokens) < 0:
            raise ValueError(f"stream {stream_id!r}: token ids must be >= 0, got {min(new_tokens)}")
        stream = self._streams.get(stream_id)
        if stream is None:
            stream = self._start_stream(stream_id, state_key, task_id, kind == "live")
        elif stream.key != state_key or stream.live != (kind == "live"):
            was = "live" if stream.live else "runahead"
            raise ValueError(
                f"stream {stream_id!r} is a {was} stream from state {stream.key!r}, not a {kind} one "
                f"from {state_key!r}; use a new stream id per generation"
            )
        state, node = stream.state, stream.node
        if state is None or node is None:  # detached: its state was evicted
            return
        self._states.move_to_end(state.key)
        live = int(stream.live)
        path = stream.tokens  # the stream's tokens are the path from the root to its cursor
        for t in new_tokens:
            node.ends -= 1
            path.append(t)
            kids = node.kids  # child() inlined (hot loop)
            if type(kids) is Node:
                nxt = kids if kids.token == t else None
            else:
                nxt = None if kids is None else kids.get(t)  # type: ignore[union-attr]
            if nxt is None:
                nxt = self._grow(state, node, t, path)
            nxt.count += 1
            nxt.ends += 1
            nxt.live += live
            node = nxt
        stream.node = node
        n = len(new_tokens)
        self._counts["tokens_added"] += n
        self._bytes += STREAM_TOKEN_BYTES * n

    def finish(self, stream_id: str) -> None:
        """The stream ended; forget its cursor (its tokens stay in the cache).

        Raises:
            ValueError: No such stream in flight (never extended, or already finished).
        """
        with self._lock:
            stream = self._streams.pop(stream_id, None)
            if stream is None:
                raise ValueError(
                    f"stream {stream_id!r} is not in flight (never extended, already finished, or "
                    "started before the cache was loaded); call finish once per extended stream"
                )
            self._bytes -= STREAM_BYTES + STREAM_TOKEN_BYTES * len(stream.tokens)
            if stream.state is not None:
                del stream.state.streams[stream_id]

    # ------------------------------------------------------------------ other inputs
    def insert(self, state_key: str, task_id: str, tokens: Sequence[int], kind: StreamKind = "live") -> None:
        """Add one finished continuation ``tokens`` generated from state ``state_key``.

        Raises:
            ValueError: A token id is negative, or ``kind`` is unknown.
        """
        if kind not in ("live", "runahead"):
            raise ValueError(f"kind must be 'live' or 'runahead', got {kind!r}")
        if len(tokens) and min(tokens) < 0:
            raise ValueError(f"token ids must be >= 0, got {min(tokens)} (state {state_key!r})")
        with self._lock:
            state = self._state(state_key, task_id)
            live = int(kind == "live")
            node = state.root
            node.count += 1
            node.live += live
            for t in tokens:
                nxt = child(node, t)
                if nxt is None:
                    nxt = self._grow(state, node, t)
                nxt.count += 1
                nxt.live += live
                node = nxt
            node.ends += 1
            self._counts["tokens_added"] += len(tokens)
            self._enforce_budget()

    def evict(self, count: int = 1) -> list[str]:
        """Evict the ``count`` least recently used states; returns their keys (oldest first)."""
        if count < 0:
            raise ValueError(f"evict count must be >= 0, got {count}")
        with self._lock:
            return [self._evict_lru() for _ in range(min(count, len(self._states)))]

    def state_keys(self) -> list[str]:
        """Keys of the states held, least recently used first."""
        with self._lock:
            return list(self._states)

    def stats(self) -> TreeCacheStats:
        """The counters and current size."""
        with self._lock:
            return TreeCacheStats(
                **self._counts,
                states=len(self._states),
                nodes=self._nodes,
                streams=len(self._streams),
                bytes=self._bytes,
                byte_budget=self.config.byte_budget,
            )

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write the cache to ``path`` (``.npz``, format ``srt-tree-cache/1``; no pickle).

        Streams in flight are saved as far as they got, as if they had finished there.
        """
        with self._lock:
            trees = [tree_to_arrays(s.key, s.task, s.root) for s in self._states.values()]
            meta: dict[str, Any] = {
                "config": self.config.model_dump(),
                "counters": dict(self._counts),
                "next_tick": self._tick,
            }
        save_arrays(path, trees, meta)

    @classmethod
    def load(cls, path: str | Path, config: TreeCacheConfig | None = None) -> TreeCache:
        """Read a cache written by :meth:`save` (and check its integrity).

        Args:
            path: The file.
            config: Options to use instead of the saved ones (a smaller budget evicts on load).

        Raises:
            CacheFileError: Missing, unreadable, another format version, or inconsistent content.
        """
        trees, meta = load_arrays(path)
        try:
            cache = cls(config or TreeCacheConfig(**meta.get("config", {})))
            counters = meta.get("counters", {})
            cache._counts.update({k: int(counters.get(k, 0)) for k in COUNTERS})
            cache._tick = int(meta.get("next_tick", 0))
            every: list[tuple[int, Node, State]] = []
            for tree in trees:
                if tree.state_key in cache._states:
                    raise ValueError(f"state {tree.state_key!r} is saved twice")
                nodes = arrays_to_nodes(tree)
                state = cache._adopt(tree.state_key, tree.task_id, nodes[0])
                every.extend((n.tick, n, state) for n in nodes)
            every.sort(key=lambda e: e[0])  # index in creation order: newest last, as when built live
            for _, node, state in every:
                cache._index(state, node)
            cache._tick = max(cache._tick, every[-1][0] + 1 if every else 0)
            cache._enforce_budget()  # a smaller budget than the saved one
            cache.check_integrity()
        except (CacheIntegrityError, ValueError, TypeError, KeyError) as exc:
            raise CacheFileError(f"{path}: inconsistent tree cache content: {exc}") from None
        return cache

    # ------------------------------------------------------------------ integrity
    def check_integrity(self) -> None:
        """Check every invariant; raise :class:`CacheIntegrityError` listing what is inconsistent.

        Checked: per-node counts (``count == children's counts + ends``, live counts, parent links,
        ticks), node and byte totals per state and overall, the LRU table, streams' cursors (their
        tokens walk to their node), both suffix indexes (every node filed under its key, nothing
        else), and the byte budget.
        """
        with self._lock:
            problems = cache_problems(self)
        if problems:
            shown = "\n  ".join(problems[:30])
            more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
            raise CacheIntegrityError(f"tree cache is inconsistent:\n  {shown}{more}")
