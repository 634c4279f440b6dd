"""Speculative rollouts (SRT): a tree cache of earlier continuations and exact tree verification."""

from srt_agent.spec.cache_io import FORMAT_VERSION as TREE_CACHE_FORMAT
from srt_agent.spec.cache_io import CacheFileError
from srt_agent.spec.cache_types import CacheIntegrityError, TreeCacheConfig, TreeCacheStats
from srt_agent.spec.draft import EMPTY_DRAFT, DraftSource, DraftSourceProtocol, DraftTree, StreamKind
from srt_agent.spec.tree_cache import TreeCache

__all__ = [
    "EMPTY_DRAFT",
    "TREE_CACHE_FORMAT",
    "CacheFileError",
    "CacheIntegrityError",
    "DraftSource",
    "DraftSourceProtocol",
    "DraftTree",
    "StreamKind",
    "TreeCache",
    "TreeCacheConfig",
    "TreeCacheStats",
]
