"""The tree cache's core in Python: the reference the native core (``native/tree_core.cpp``) mirrors.

:class:`PythonCore` has the native core's interface (the one :class:`~srt_agent.tree_cache.TreeCache`
drives, under its lock): drafts and stream updates in batches, inserts, eviction, the byte estimate,
persistence as flat arrays and the integrity check. Given the same byte prices the two make the
same drafts, evict the same states and save the same files; ``tests/test_tree_cache_native.py``
compares them operation by operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from srt_agent.contracts.draft import DraftQuery, DraftSource, DraftTree, StreamUpdate
from srt_agent.tree_cache.integrity import cache_problems
from srt_agent.tree_cache.options import COUNTERS, STREAM_BYTES, STREAM_TOKEN_BYTES, TreeCacheConfig
from srt_agent.tree_cache.persistence import TreeArrays, arrays_to_nodes, tree_to_arrays
from srt_agent.tree_cache.prefix_tree import Node, child, select_draft
from srt_agent.tree_cache.store import State, TreeStore

__all__ = ["PythonCore", "check_budget"]

_NOTHING: tuple[list[Node], DraftSource, bool] = ([], "none", False)


def check_budget(budget: int) -> None:
    """Refuse a negative draft budget (0 asks for no draft)."""
    if budget < 0:
        raise ValueError(f"draft budget must be >= 0 (0 asks for no draft), got {budget}")


class PythonCore(TreeStore):
    """The tree cache's data and algorithms in Python (no lock; the cache holds one).

    Args:
        config: The cache's options.
    """

    def __init__(self, config: TreeCacheConfig) -> None:
        super().__init__(config)
        self._every_tick: list[tuple[int, Node, State]] = []

    # ------------------------------------------------------------------ drafts
    def draft_many(
        self, queries: Sequence[DraftQuery], tree_cls: type[DraftTree], empty: DraftTree
    ) -> list[DraftTree]:
        """Every query's draft; a query whose stream reported exactly its tokens starts at the cursor."""
        for q in queries:
            check_budget(q.budget)
        out: list[DraftTree] = []
        for q in queries:
            gen = q.generated if isinstance(q.generated, list) else list(q.generated)
            found = (
                self._draft_roots(q.state_key, q.task_id, gen, self._cursor(q, gen)) if q.budget else _NOTHING
            )
            out.append(self._select(found, q.budget, empty))
        return out

    def draft(
        self,
        state_key: str,
        task_id: str,
        generated: Sequence[int],
        budget: int,
        tree_cls: type[DraftTree],
        empty: DraftTree,
    ) -> DraftTree:
        """One draft, walking the state's tree from its root (no stream cursor)."""
        check_budget(budget)
        gen = generated if isinstance(generated, list) else list(generated)
        found = self._draft_roots(state_key, task_id, gen) if budget else _NOTHING
        return self._select(found, budget, empty)

    def _cursor(self, q: DraftQuery, gen: list[int]) -> Node | None:
        """Where ``q``'s stream stands in its state's tree, if it has reported exactly ``gen``."""
        stream = self._streams.get(q.stream_id)
        if stream is None or stream.node is None or stream.key != q.state_key:
            return None
        tokens = stream.tokens
        if len(tokens) != len(gen) or (gen and tokens[-1] != gen[-1]):
            return None
        return stream.node

    def _select(
        self, found: tuple[list[Node], DraftSource, bool], budget: int, empty: DraftTree
    ) -> DraftTree:
        """The best-first draft below the found roots (counted by source)."""
        roots, source, backoff = found
        if not roots:
            self._counts["drafts_none"] += 1
            return empty
        tokens, parents, probs, runahead = select_draft(roots, budget)
        self._counts["drafts_" + source] += 1
        self._counts["nodes_served"] += len(tokens)
        self._counts["runahead_nodes_served"] += sum(runahead)
        return DraftTree.trusted(
            tuple(tokens), tuple(parents), tuple(probs), source, tuple(runahead), backoff
        )

    # ------------------------------------------------------------------ inputs
    def extend_many(self, updates: Sequence[StreamUpdate]) -> list[str]:
        """Apply every valid update, then enforce the budget; returns the invalid ones' messages."""
        errors: list[str] = []
        for u in updates:
            try:
                self._extend(u.stream_id, u.state_key, u.task_id, u.new_tokens, u.kind)
            except ValueError as exc:
                errors.append(str(exc))
        self._enforce_budget()
        return errors

    def _extend(
        self, stream_id: str, state_key: str, task_id: str, new_tokens: Sequence[int], kind: str
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

    def insert(self, state_key: str, task_id: str, tokens: Sequence[int], live: bool) -> None:
        """Add one finished continuation, then enforce the budget."""
        if len(tokens) and min(tokens) < 0:
            raise ValueError(f"token ids must be >= 0, got {min(tokens)} (state {state_key!r})")
        state = self._state(state_key, task_id)
        lv = int(live)
        node = state.root
        node.count += 1
        node.live += lv
        for t in tokens:
            nxt = child(node, t)
            if nxt is None:
                nxt = self._grow(state, node, t)
            nxt.count += 1
            nxt.live += lv
            node = nxt
        node.ends += 1
        self._counts["tokens_added"] += len(tokens)
        self._enforce_budget()

    def finish(self, stream_id: str) -> bool:
        """Forget the stream's cursor; ``False`` if it is not in flight."""
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return False
        self._bytes -= STREAM_BYTES + STREAM_TOKEN_BYTES * len(stream.tokens)
        if stream.state is not None:
            del stream.state.streams[stream_id]
        return True

    # ------------------------------------------------------------------ size and counters
    def enforce_budget(self) -> None:
        """Evict least recently used states until the estimate is within the budget."""
        self._enforce_budget()

    def evict_lru(self) -> str:
        """Evict the least recently used state; returns its key."""
        return self._evict_lru()

    def state_keys(self) -> list[str]:
        """Keys of the states held, least recently used first."""
        return list(self._states)

    def has_state(self, state_key: str) -> bool:
        """Whether state ``state_key`` is held."""
        return state_key in self._states

    def sizes(self) -> tuple[int, int, int, int]:
        """States, nodes, streams in flight and estimated bytes."""
        return len(self._states), self._nodes, len(self._streams), self._bytes

    def counters(self) -> list[int]:
        """The counters, in :data:`~srt_agent.tree_cache.options.COUNTERS` order."""
        return [self._counts[k] for k in COUNTERS]

    def set_counters(self, values: Sequence[int]) -> None:
        """Restore the counters (a load)."""
        self._counts.update(zip(COUNTERS, (int(v) for v in values), strict=True))

    @property
    def next_tick(self) -> int:
        """The creation tick the next node gets."""
        return self._tick

    @next_tick.setter
    def next_tick(self, tick: int) -> None:
        self._tick = tick

    # ------------------------------------------------------------------ persistence and checks
    def export_trees(self) -> list[tuple[Any, ...]]:
        """Every state's tree as (key, task, parents, tokens, counts, ends, live, ticks), LRU order."""
        out: list[tuple[Any, ...]] = []
        for s in self._states.values():
            t = tree_to_arrays(s.key, s.task, s.root)
            out.append((t.state_key, t.task_id, t.parents, t.tokens, t.counts, t.ends, t.live, t.ticks))
        return out

    def import_tree(
        self,
        state_key: str,
        task_id: str,
        parents: npt.NDArray[np.int32],
        tokens: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        ends: npt.NDArray[np.int64],
        live: npt.NDArray[np.int64],
        ticks: npt.NDArray[np.int64],
    ) -> None:
        """Adopt a saved tree (indexed by :meth:`index_all` once every tree is in).

        Raises:
            ValueError: The state is already held.
        """
        if state_key in self._states:
            raise ValueError(f"state {state_key!r} is saved twice")
        nodes = arrays_to_nodes(TreeArrays(state_key, task_id, parents, tokens, counts, ends, live, ticks))
        state = self._adopt(state_key, task_id, nodes[0])
        self._every_tick.extend((n.tick, n, state) for n in nodes)

    def index_all(self) -> None:
        """Index every adopted node in creation order (newest last, as when built live)."""
        every = sorted(self._every_tick, key=lambda e: e[0])
        self._every_tick = []
        for _, node, state in every:
            self._index(state, node)
        self._tick = max(self._tick, every[-1][0] + 1 if every else 0)

    def problems(self) -> list[str]:
        """Every invariant recomputed from scratch; empty if consistent."""
        return cache_problems(self)
