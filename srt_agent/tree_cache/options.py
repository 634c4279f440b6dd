"""The tree cache's data types: its options, its stats snapshot and its integrity error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from srt_agent.contracts.draft import DraftSource
from srt_agent.errors import SrtAgentError

STATE_BYTES = 480
"""A state: its object, root node, key string, LRU entry and stream table."""
STREAM_BYTES = 400
"""An in-flight stream: its object, id, token list and table entries."""
STREAM_TOKEN_BYTES = 9
"""A stream's token list per token (a pointer, with the list's over-allocation)."""
TASK_BYTES = 320
"""A task's suffix index (it has one per fallback window): its dict and table entry."""


class TreeCacheConfig(BaseModel):
    """Options of the tree cache (``spec.cache`` in a run config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["auto", "native", "python"] = Field(
        default="auto",
        description="The cache's core: 'native' (C++, built by pip install when a compiler is present), "
        "'python' (the reference implementation), 'auto' (native when built, else Python).",
    )
    byte_budget: int = Field(
        default=256 * 2**20,
        ge=0,
        description="Estimated bytes the cache may hold (of the backend's own structures; the native core's "
        "are ~3x smaller); over it, least recently used states are evicted.",
    )
    window: int = Field(
        default=3,
        ge=1,
        le=16,
        description="Fallback drafts need the last `window` tokens to match (fewer at a sequence's start).",
    )
    backoff_window: int = Field(
        default=1,
        ge=0,
        le=16,
        description="When no place in the task's trees (then in any) matches the last `window` tokens, "
        "match the last `backoff_window` instead (0: no back-off; ignored unless < window). On the "
        "quickstart model's traces 1 raises tokens per forward from 2.58 to 3.19 (Calculator) and 1.53 "
        "to 1.98 (Retail); the native core's second index costs ~0.1 µs per token.",
    )
    max_match: int = Field(
        default=16, ge=1, le=64, description="Longest suffix compared when ranking fallback matches."
    )
    scan_limit: int = Field(
        default=16, ge=1, description="Newest index entries examined per fallback lookup (bounds its cost)."
    )
    max_candidates: int = Field(
        default=8, ge=1, description="Matched places merged into one fallback draft (the newest win)."
    )

    @property
    def windows(self) -> tuple[int, ...]:
        """The suffix lengths fallback lookups match on, in the order they are tried."""
        return (self.window, self.backoff_window) if 0 < self.backoff_window < self.window else (self.window,)

    @model_validator(mode="after")
    def _match_covers_window(self) -> TreeCacheConfig:
        if self.max_match < self.window:
            raise ValueError(f"max_match ({self.max_match}) must be >= window ({self.window})")
        return self


@dataclass(frozen=True)
class TreeCacheStats:
    """A snapshot of the cache's counters and size.

    Attributes:
        drafts_exact: Drafts served from the exact state's tree.
        drafts_task: Drafts served by suffix matching within the task.
        drafts_global: Drafts served by suffix matching over all tasks.
        drafts_none: Draft calls that returned nothing.
        nodes_served: Draft nodes returned.
        runahead_nodes_served: Of those, nodes whose counts came only from run-ahead streams.
        tokens_added: Tokens added (extensions and insertions), before evictions.
        evictions: States evicted.
        states: States held.
        nodes: Tree nodes held (roots included).
        streams: Streams in flight.
        bytes: Estimated bytes held.
        byte_budget: The budget ``bytes`` is kept under.
    """

    drafts_exact: int = 0
    drafts_task: int = 0
    drafts_global: int = 0
    drafts_none: int = 0
    nodes_served: int = 0
    runahead_nodes_served: int = 0
    tokens_added: int = 0
    evictions: int = 0
    states: int = 0
    nodes: int = 0
    streams: int = 0
    bytes: int = 0
    byte_budget: int = 0

    @property
    def drafts_by_source(self) -> dict[DraftSource, int]:
        """Draft calls by :attr:`DraftTree.source`."""
        return {
            "exact": self.drafts_exact,
            "task": self.drafts_task,
            "global": self.drafts_global,
            "none": self.drafts_none,
        }


COUNTERS = (
    "drafts_exact",
    "drafts_task",
    "drafts_global",
    "drafts_none",
    "nodes_served",
    "runahead_nodes_served",
    "tokens_added",
    "evictions",
)


class CacheIntegrityError(SrtAgentError, RuntimeError):
    """The cache's structures disagree with each other (a bug); the message lists what."""
