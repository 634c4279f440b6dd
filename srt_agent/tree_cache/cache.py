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
from collections import OrderedDict
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
    STATE_BYTES,
    STREAM_BYTES,
    STREAM_TOKEN_BYTES,
    TASK_BYTES,
    CacheIntegrityError,
    TreeCacheConfig,
    TreeCacheStats,
)
from srt_agent.tree_cache.prefix_tree import (
    NODE_BYTES,
    SENTINEL,
    Node,
    add_child,
    child,
    iter_nodes,
    select_draft,
    tree_bytes,
)
from srt_agent.tree_cache.suffix_index import SuffixIndex, node_keys, path_keys

__all__ = ["CacheIntegrityError", "TreeCache", "TreeCacheConfig", "TreeCacheStats"]

_NOTHING: tuple[list[Node], DraftSource, bool] = ([], "none", False)


def _check_budget(budget: int) -> None:
    if budget < 0:
        raise ValueError(f"draft budget must be >= 0 (0 asks for no draft), got {budget}")


class _State:
    __slots__ = ("bytes", "index", "key", "nodes", "root", "streams", "task")

    def __init__(self, key: str, task: str, root: Node, index: list[SuffixIndex] | None) -> None:
        self.key = key
        self.task = task
        self.index = index  # the task's suffix indexes (None without a task); they outlive the state
        self.root = root
        self.nodes = 1
        self.bytes = STATE_BYTES + NODE_BYTES  # the tree's nodes and child dicts; index bytes are apart
        self.streams: dict[str, _Stream] = {}


class _Stream:
    """An in-flight generation; ``node`` is its cursor, where its tokens lead in its state's tree.

    :meth:`TreeCache.extend` advances the cursor, so a draft for the stream starts there (O(1))
    instead of walking the tree from the root.
    """

    __slots__ = ("id", "key", "live", "node", "state", "tokens")

    def __init__(self, stream_id: str, key: str, state: _State, live: bool) -> None:
        self.id = stream_id
        self.key = key
        self.state: _State | None = state  # None once the state was evicted (detached)
        self.node: Node | None = state.root
        self.live = live
        self.tokens: list[int] = []


class TreeCache(DraftSourceBase):
    """Draft source for speculative rollouts (a :class:`~srt_agent.contracts.draft.DraftSourceProtocol`).

    Thread-safe (one lock); the engine's worker calls :meth:`draft`, :meth:`extend` and
    :meth:`finish`, a trainer may call :meth:`save` or :meth:`stats` from elsewhere.

    Args:
        config: Options; defaults to :class:`TreeCacheConfig` ().
    """

    def __init__(self, config: TreeCacheConfig | None = None) -> None:
        self.config = config or TreeCacheConfig()
        self._lock = threading.Lock()
        self._states: OrderedDict[str, _State] = OrderedDict()  # LRU order: least recent first
        self._streams: dict[str, _Stream] = {}
        self._windows = self.config.windows
        # One suffix index per fallback window, over all tasks and per task.
        self._global = [SuffixIndex() for _ in self._windows]
        self._tasks: dict[str, list[SuffixIndex]] = {}
        self._bytes = 0
        self._nodes = 0
        self._tick = 0
        self._counts = dict.fromkeys(COUNTERS, 0)

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
            every: list[tuple[int, Node, _State]] = []
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

    # ------------------------------------------------------------------ internals
    def _draft_roots(
        self, key: str, task_id: str, gen: list[int], cursor: Node | None = None
    ) -> tuple[list[Node], DraftSource, bool]:
        """The nodes to draft from, their source, and whether they matched only the back-off suffix.

        ``cursor``: the node ``gen`` leads to in the state's tree, when the caller knows it (a
        stream's cursor); otherwise the tree is walked from its root.
        """
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
            node = cursor if cursor is not None else self._locate(state, gen)
            if node is not None and node.kids is not None:
                return [node], "exact", False
        return self._suffix_roots(task_id, gen)

    def _suffix_roots(self, task_id: str, gen: list[int]) -> tuple[list[Node], DraftSource, bool]:
        """Suffix matches of ``gen``: the task's trees, then all; the full window, then the back-off."""
        cfg = self.config
        task = self._tasks.get(task_id) if task_id else None
        # The task's own text first (its numbers and names recur; measured on Calculator and
        # Retail it drafts better than a longer match in another task), the longer suffix first.
        scopes: tuple[tuple[list[SuffixIndex] | None, DraftSource], ...] = (
            (task, "task"),
            (self._global, "global"),
        )
        for scope, source in scopes:
            for i, (index, window) in enumerate(zip(scope or (), self._windows, strict=False)):
                found = index.matches(gen, window, cfg.max_match, cfg.scan_limit, cfg.max_candidates)
                if found:
                    return found, source, i > 0
        return [], "none", False

    def _locate(self, state: _State, gen: list[int]) -> Node | None:
        """The node reached by walking ``gen`` from the state's root (``None``: off the tree).

        A stream of this state whose tokens are a prefix of ``gen`` (usually the very sequence
        being drafted for) gives a head start: comparing token lists runs in C, walking the tree
        runs in Python, so long generations stay cheap.
        """
        n = len(gen)
        node, done = state.root, 0
        for s in state.streams.values():
            m = len(s.tokens)
            if done < m <= n and s.tokens[-1] == gen[m - 1] and s.tokens == (gen if m == n else gen[:m]):
                assert s.node is not None
                node, done = s.node, m
                if m == n:
                    return node
        for t in gen[done:] if done else gen:
            kids = node.kids  # child() inlined: this loop is the walk's whole cost
            if type(kids) is Node:
                if kids.token != t:
                    return None
                node = kids
            elif kids is None:
                return None
            else:
                nxt = kids.get(t)  # type: ignore[union-attr]
                if nxt is None:
                    return None
                node = nxt
        return node

    def _state(self, key: str, task: str) -> _State:
        """The state ``key`` (created, and indexed, if new), marked most recently used."""
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
            return state
        root = Node(SENTINEL, None, self._tick)
        self._tick += 1
        state = self._adopt(key, task, root)
        self._index(state, root)
        return state

    def _adopt(self, key: str, task: str, root: Node) -> _State:
        """Hold a new state with the tree under ``root`` (not indexed yet) as most recently used."""
        if task and task not in self._tasks:
            self._tasks[task] = [SuffixIndex() for _ in self._windows]
            self._bytes += TASK_BYTES * len(self._windows)
        state = _State(key, task, root, self._tasks[task] if task else None)
        state.nodes, tree = tree_bytes(root)
        state.bytes = STATE_BYTES + tree
        self._states[key] = state
        self._bytes += state.bytes
        self._nodes += state.nodes
        return state

    def _start_stream(self, stream_id: str, key: str, task: str, live: bool) -> _Stream:
        state = self._state(key, task)
        stream = _Stream(stream_id, key, state, live)
        state.root.count += 1
        state.root.ends += 1
        state.root.live += int(live)
        state.streams[stream_id] = stream
        self._streams[stream_id] = stream
        self._bytes += STREAM_BYTES
        return stream

    def _grow(self, state: _State, parent: Node, token: int, path: list[int] | None = None) -> Node:
        """Add the child ``token`` of ``parent`` and index it.

        ``path``: the tokens from the state's root to the new node, when the caller has them (a
        stream's tokens): its index keys are then hashed from them, not from a walk up the tree.
        """
        node, grown = add_child(parent, token, self._tick)
        self._tick += 1
        state.nodes += 1
        state.bytes += grown
        self._nodes += 1
        self._bytes += grown
        self._index(state, node, None if path is None else path_keys(path, self._windows))
        return node

    def _index(self, state: _State, node: Node, keys: list[int] | None = None) -> None:
        # Index bytes are the indexes' own (a key's container is shared by nodes of many states).
        # This runs for every new node (most sampled tokens are new): no enumerate, no lookups.
        if keys is None:
            keys = node_keys(node, self._windows)
        grown = 0
        task = state.index
        for i in range(len(keys)):
            key = keys[i]
            grown += self._global[i].add(key, node)
            if task is not None:
                grown += task[i].add(key, node)
        self._bytes += grown

    def _enforce_budget(self) -> None:
        while self._bytes > self.config.byte_budget and self._states:
            self._evict_lru()

    def _evict_lru(self) -> str:
        key, state = self._states.popitem(last=False)
        task = self._tasks.get(state.task) if state.task else None
        nodes = list(iter_nodes(state.root))
        for node in nodes:
            for i, k in enumerate(node_keys(node, self._windows)):
                self._bytes -= self._global[i].remove(k, node)
                if task is not None:
                    self._bytes -= task[i].remove(k, node)
        # Break the parent <-> child cycles: reference counting frees the tree now, not at the
        # next full collection of the cyclic GC (which may be far off in a big heap).
        for node in nodes:
            node.parent = None
        if task is not None and task[0].nodes == 0:
            del self._tasks[state.task]
            self._bytes -= TASK_BYTES * len(self._windows)
        for stream in state.streams.values():  # they stop feeding the cache; their tokens go
            self._bytes -= STREAM_TOKEN_BYTES * len(stream.tokens)
            stream.state, stream.node, stream.tokens = None, None, []
        self._bytes -= state.bytes
        self._nodes -= state.nodes
        self._counts["evictions"] += 1
        return key
