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

The work is done by a core (:mod:`srt_agent.tree_cache.core`): native C++ when it is built, else
the Python reference; this class holds the lock, checks arguments and reads and writes files.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from srt_agent.contracts.draft import (
    EMPTY_DRAFT,
    DraftQuery,
    DraftSourceBase,
    DraftTree,
    StreamKind,
    StreamUpdate,
)
from srt_agent.tree_cache.core import CacheCore, make_core
from srt_agent.tree_cache.options import (
    COUNTERS,
    CacheIntegrityError,
    TreeCacheConfig,
    TreeCacheStats,
)
from srt_agent.tree_cache.persistence import CacheFileError, TreeArrays, load_arrays, save_arrays

__all__ = ["CacheIntegrityError", "TreeCache", "TreeCacheConfig", "TreeCacheStats"]


class TreeCache(DraftSourceBase):
    """Draft source for speculative rollouts (a :class:`~srt_agent.contracts.draft.DraftSourceProtocol`).

    Thread-safe (one lock); the engine's worker calls :meth:`draft_many`, :meth:`extend_many` and
    :meth:`finish` once per step, a trainer may call :meth:`save` or :meth:`stats` from elsewhere.

    Args:
        config: Options; defaults to :class:`TreeCacheConfig` ().
        python_prices: Price the native core's bytes as the Python core does, so that both evict
            alike (for comparing the two; the native core's own prices are smaller).

    Raises:
        RuntimeError: ``config.backend`` is ``"native"`` and the native core is not built.
    """

    def __init__(self, config: TreeCacheConfig | None = None, *, python_prices: bool = False) -> None:
        self.config = config or TreeCacheConfig()
        self._core: CacheCore
        self._core, self.backend = make_core(self.config, python_prices)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return self._core.sizes()[0]

    def __contains__(self, state_key: object) -> bool:
        if not isinstance(state_key, str):
            return False
        with self._lock:
            return self._core.has_state(state_key)

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
        with self._lock:
            return self._core.draft(state_key, task_id, generated, budget, DraftTree, EMPTY_DRAFT)

    def draft_many(self, queries: Sequence[DraftQuery]) -> list[DraftTree]:
        """Every row's draft for a decode step, in one call under one lock (see :meth:`draft`).

        A query whose stream is in flight here and has reported exactly ``generated`` drafts from
        the stream's cursor (O(1) for the exact tree, however long the generation); any other
        query is served as :meth:`draft` serves it. Fallbacks are searched afresh: keeping each
        stream's last suffix match and advancing it with the committed tokens was measured on
        real traces (``benchmarks/draft_replay.py``) and dropped, as the match fell off within a
        few tokens of sampled text (77% of calls searched anyway) and the places it kept were
        weaker than a fresh search's longest matches (tokens per forward 3.05 vs 3.06 on
        Calculator, 1.50 vs 1.53 on Retail), for no saving per call.

        Raises:
            ValueError: A budget is negative (before any draft is made).
        """
        with self._lock:
            return self._core.draft_many(queries, DraftTree, EMPTY_DRAFT)

    @contextmanager
    def locked_core(self) -> Iterator[CacheCore]:
        """The cache's core, held under the cache's lock for the ``with`` block.

        For integrations that call a core entry point the cache does not wrap (SGLang's corpus
        lays drafts out in SGLang's arrays in one native call): the core's contract is the
        cache's, so the call must not change what the cache would draft or store.
        """
        with self._lock:
            yield self._core

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
        self.extend_many([StreamUpdate(stream_id, state_key, task_id, new_tokens, kind)])

    def extend_many(self, updates: Sequence[StreamUpdate]) -> None:
        """Every row's committed tokens of a step, in one call under one lock (see :meth:`extend`).

        Valid updates are applied even if others are not; the byte budget is enforced once, after
        all of them.

        Raises:
            ValueError: Some updates were invalid (the message names each).
        """
        with self._lock:
            errors = self._core.extend_many(updates)
        if errors:
            raise ValueError("; ".join(errors))

    def finish(self, stream_id: str) -> None:
        """The stream ended; forget its cursor (its tokens stay in the cache).

        Raises:
            ValueError: No such stream in flight (never extended, or already finished).
        """
        with self._lock:
            found = self._core.finish(stream_id)
        if not found:
            raise ValueError(
                f"stream {stream_id!r} is not in flight (never extended, already finished, or "
                "started before the cache was loaded); call finish once per extended stream"
            )

    # ------------------------------------------------------------------ other inputs
    def insert(self, state_key: str, task_id: str, tokens: Sequence[int], kind: StreamKind = "live") -> None:
        """Add one finished continuation ``tokens`` generated from state ``state_key``.

        Raises:
            ValueError: A token id is negative, or ``kind`` is unknown.
        """
        if kind not in ("live", "runahead"):
            raise ValueError(f"kind must be 'live' or 'runahead', got {kind!r}")
        with self._lock:
            self._core.insert(state_key, task_id, tokens, kind == "live")

    def evict(self, count: int = 1) -> list[str]:
        """Evict the ``count`` least recently used states; returns their keys (oldest first)."""
        if count < 0:
            raise ValueError(f"evict count must be >= 0, got {count}")
        with self._lock:
            return [self._core.evict_lru() for _ in range(min(count, self._core.sizes()[0]))]

    def state_keys(self) -> list[str]:
        """Keys of the states held, least recently used first."""
        with self._lock:
            return self._core.state_keys()

    def stats(self) -> TreeCacheStats:
        """The counters and current size."""
        with self._lock:
            states, nodes, streams, held = self._core.sizes()
            counts = dict(zip(COUNTERS, self._core.counters(), strict=True))
        return TreeCacheStats(
            **counts,
            states=states,
            nodes=nodes,
            streams=streams,
            bytes=held,
            byte_budget=self.config.byte_budget,
        )

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write the cache to ``path`` (``.npz``, format ``srt-tree-cache/1``; no pickle).

        Streams in flight are saved as far as they got, as if they had finished there. Both cores
        write and read the same files.
        """
        with self._lock:
            trees = [TreeArrays(*t) for t in self._core.export_trees()]
            meta: dict[str, Any] = {
                # Not the backend: either core reads the file, and the loading machine may lack one.
                "config": self.config.model_dump(exclude={"backend"}),
                "counters": dict(zip(COUNTERS, self._core.counters(), strict=True)),
                "next_tick": self._core.next_tick,
            }
        save_arrays(path, trees, meta)

    @classmethod
    def load(
        cls, path: str | Path, config: TreeCacheConfig | None = None, *, python_prices: bool = False
    ) -> TreeCache:
        """Read a cache written by :meth:`save` (and check its integrity).

        Args:
            path: The file.
            config: Options to use instead of the saved ones (a smaller budget evicts on load).
            python_prices: As for the constructor.

        Raises:
            CacheFileError: Missing, unreadable, another format version, or inconsistent content.
        """
        trees, meta = load_arrays(path)
        try:
            cache = cls(config or TreeCacheConfig(**meta.get("config", {})), python_prices=python_prices)
            core = cache._core
            counters = meta.get("counters", {})
            core.set_counters([int(counters.get(k, 0)) for k in COUNTERS])
            core.next_tick = int(meta.get("next_tick", 0))
            for t in trees:
                arrays = (t.parents, t.tokens, t.counts, t.ends, t.live, t.ticks)
                core.import_tree(t.state_key, t.task_id, *arrays)
            core.index_all()  # in creation order: newest last, as when built live
            core.enforce_budget()  # a smaller budget than the saved one
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
            problems = self._core.problems()
        if problems:
            shown = "\n  ".join(problems[:30])
            more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
            raise CacheIntegrityError(f"tree cache is inconsistent:\n  {shown}{more}")
