"""The tree cache's store: per-state prefix trees, in-flight streams, suffix indexes, eviction.

:class:`TreeStore` is the data structure behind :class:`~srt_agent.tree_cache.cache.TreeCache`
and holds no lock: every method here runs under the cache's lock. It keeps the byte estimate
exact at every step (:mod:`options` prices each part) and evicts whole states, least recently
used first, when the estimate passes the budget.
"""

from __future__ import annotations

from collections import OrderedDict

from srt_agent.contracts.draft import DraftSource
from srt_agent.tree_cache.options import (
    COUNTERS,
    STATE_BYTES,
    STREAM_BYTES,
    STREAM_TOKEN_BYTES,
    TASK_BYTES,
    TreeCacheConfig,
)
from srt_agent.tree_cache.prefix_tree import NODE_BYTES, SENTINEL, Node, add_child, iter_nodes, tree_bytes
from srt_agent.tree_cache.suffix_index import SuffixIndex, node_keys, path_keys

__all__ = ["State", "Stream", "TreeStore"]


class State:
    """One conversation state: its prefix tree, size, the task's indexes and the streams in it."""

    __slots__ = ("bytes", "index", "key", "nodes", "root", "streams", "task")

    def __init__(self, key: str, task: str, root: Node, index: list[SuffixIndex] | None) -> None:
        self.key = key
        self.task = task
        self.index = index  # the task's suffix indexes (None without a task); they outlive the state
        self.root = root
        self.nodes = 1
        self.bytes = STATE_BYTES + NODE_BYTES  # the tree's nodes and child dicts; index bytes are apart
        self.streams: dict[str, Stream] = {}


class Stream:
    """An in-flight generation; ``node`` is its cursor, where its tokens lead in its state's tree.

    :meth:`TreeCache.extend` advances the cursor, so a draft for the stream starts there (O(1))
    instead of walking the tree from the root.
    """

    __slots__ = ("id", "key", "live", "node", "state", "tokens")

    def __init__(self, stream_id: str, key: str, state: State, live: bool) -> None:
        self.id = stream_id
        self.key = key
        self.state: State | None = state  # None once the state was evicted (detached)
        self.node: Node | None = state.root
        self.live = live
        self.tokens: list[int] = []


class TreeStore:
    """States (prefix trees), streams (cursors), suffix indexes and the byte estimate; no lock."""

    def __init__(self, config: TreeCacheConfig | None) -> None:
        self.config = config or TreeCacheConfig()
        self._states: OrderedDict[str, State] = OrderedDict()  # LRU order: least recent first
        self._streams: dict[str, Stream] = {}
        self._windows = self.config.windows
        # One suffix index per fallback window, over all tasks and per task.
        self._global = [SuffixIndex() for _ in self._windows]
        self._tasks: dict[str, list[SuffixIndex]] = {}
        self._bytes = 0
        self._nodes = 0
        self._tick = 0
        self._counts = dict.fromkeys(COUNTERS, 0)

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

    def _locate(self, state: State, gen: list[int]) -> Node | None:
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

    def _state(self, key: str, task: str) -> State:
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

    def _adopt(self, key: str, task: str, root: Node) -> State:
        """Hold a new state with the tree under ``root`` (not indexed yet) as most recently used."""
        if task and task not in self._tasks:
            self._tasks[task] = [SuffixIndex() for _ in self._windows]
            self._bytes += TASK_BYTES * len(self._windows)
        state = State(key, task, root, self._tasks[task] if task else None)
        state.nodes, tree = tree_bytes(root)
        state.bytes = STATE_BYTES + tree
        self._states[key] = state
        self._bytes += state.bytes
        self._nodes += state.nodes
        return state

    def _start_stream(self, stream_id: str, key: str, task: str, live: bool) -> Stream:
        state = self._state(key, task)
        stream = Stream(stream_id, key, state, live)
        state.root.count += 1
        state.root.ends += 1
        state.root.live += int(live)
        state.streams[stream_id] = stream
        self._streams[stream_id] = stream
        self._bytes += STREAM_BYTES
        return stream

    def _grow(self, state: State, parent: Node, token: int, path: list[int] | None = None) -> Node:
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

    def _index(self, state: State, node: Node, keys: list[int] | None = None) -> None:
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
