"""The tree cache's two cores behind one interface: native (C++) when built, Python as the reference.

:class:`CacheCore` is what :class:`~srt_agent.tree_cache.TreeCache` drives under its lock. The
native core (``srt_agent._native.TreeCore``, from ``native/tree_core.cpp``) keeps nodes in arrays
and takes a whole engine step's drafts or updates in one call; the Python core
(:class:`~srt_agent.tree_cache.python_core.PythonCore`) is the readable reference it is tested
against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from srt_agent import native
from srt_agent.contracts.draft import DraftQuery, DraftTree, StreamUpdate
from srt_agent.tree_cache.options import (
    STATE_BYTES,
    STREAM_BYTES,
    STREAM_TOKEN_BYTES,
    TASK_BYTES,
    TreeCacheConfig,
)
from srt_agent.tree_cache.prefix_tree import DICT_ENTRY_BYTES, NODE_BYTES, SMALL_DICT_BYTES
from srt_agent.tree_cache.python_core import PythonCore
from srt_agent.tree_cache.suffix_index import INDEX_KEY_BYTES

__all__ = ["PYTHON_PRICES", "CacheCore", "make_core"]

PYTHON_PRICES = (
    NODE_BYTES,
    SMALL_DICT_BYTES,
    DICT_ENTRY_BYTES,
    INDEX_KEY_BYTES,
    STATE_BYTES,
    STREAM_BYTES,
    STREAM_TOKEN_BYTES,
    TASK_BYTES,
)
"""The Python core's byte prices (node, child dict, dict entry, index key, state, stream, stream
token, task), in the order the native core takes them. The native core prices its own, smaller,
structures; given these it evicts exactly as the Python core does (the parity tests use that)."""


class CacheCore(Protocol):
    """The operations both cores implement (:class:`PythonCore` is the reference for each)."""

    next_tick: int

    def draft_many(
        self, queries: Sequence[DraftQuery], tree_cls: type[DraftTree], empty: DraftTree
    ) -> list[DraftTree]:
        """Every query's draft (budgets checked first; ``empty`` for no draft)."""

    def draft(
        self,
        state_key: str,
        task_id: str,
        generated: Sequence[int],
        budget: int,
        tree_cls: type[DraftTree],
        empty: DraftTree,
    ) -> DraftTree:
        """One draft, walking the state's tree from its root."""

    def extend_many(self, updates: Sequence[StreamUpdate]) -> list[str]:
        """Apply the valid updates, enforce the budget; the invalid ones' messages."""

    def insert(self, state_key: str, task_id: str, tokens: Sequence[int], live: bool) -> None:
        """Add one finished continuation, then enforce the budget."""

    def finish(self, stream_id: str) -> bool:
        """Forget a stream's cursor; ``False`` if it is not in flight."""

    def enforce_budget(self) -> None:
        """Evict least recently used states until within the budget."""

    def evict_lru(self) -> str:
        """Evict the least recently used state; its key."""

    def state_keys(self) -> list[str]:
        """Keys held, least recently used first."""

    def has_state(self, state_key: str) -> bool:
        """Whether a state is held."""

    def sizes(self) -> tuple[int, int, int, int]:
        """States, nodes, streams in flight, estimated bytes."""

    def counters(self) -> list[int]:
        """The counters in ``COUNTERS`` order."""

    def set_counters(self, values: Sequence[int]) -> None:
        """Restore the counters."""

    def export_trees(self) -> list[tuple[Any, ...]]:
        """Every tree as (key, task, parents, tokens, counts, ends, live, ticks), LRU order."""

    def import_tree(
        self,
        state_key: str,
        task_id: str,
        parents: Any,
        tokens: Any,
        counts: Any,
        ends: Any,
        live: Any,
        ticks: Any,
    ) -> None:
        """Adopt a saved tree (indexed by :meth:`index_all`)."""

    def index_all(self) -> None:
        """Index every adopted node in creation order."""

    def problems(self) -> list[str]:
        """Every inconsistency found, recomputed from scratch."""


def make_core(config: TreeCacheConfig, python_prices: bool = False) -> tuple[CacheCore, str]:
    """The core ``config.backend`` asks for, and its name (``"native"`` or ``"python"``).

    Args:
        config: The cache's options.
        python_prices: Price the native core's bytes as the Python core does (to compare the two).

    Raises:
        RuntimeError: ``backend="native"`` but the native core is not built (or ``SRT_NATIVE=0``).
    """
    if config.backend == "python" or (config.backend == "auto" and native.core is None):
        return PythonCore(config), "python"
    if native.core is None:
        raise RuntimeError(
            "spec.cache.backend='native' but srt-agent's native core is not available (not built: "
            "install a C++17 compiler and reinstall with pip install -e .; or disabled by SRT_NATIVE=0); "
            "use backend 'auto' to fall back to the Python cache"
        )
    prices = PYTHON_PRICES if python_prices else native.core.native_byte_model(len(config.windows))
    core: CacheCore = native.core.TreeCore(
        list(config.windows),
        config.max_match,
        config.scan_limit,
        config.max_candidates,
        config.byte_budget,
        list(prices),
    )
    return core, "native"
