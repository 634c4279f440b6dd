"""The tree cache: SRT's draft source, continuations of earlier rollouts per conversation state.

It imports only the shared contracts (:mod:`srt_agent.contracts`); the engine speculates with any
draft source, this one included, through :class:`~srt_agent.contracts.draft.DraftSourceProtocol`.
"""

from srt_agent.tree_cache.cache import TreeCache
from srt_agent.tree_cache.options import CacheIntegrityError, TreeCacheConfig, TreeCacheStats
from srt_agent.tree_cache.persistence import FORMAT_VERSION as TREE_CACHE_FORMAT
from srt_agent.tree_cache.persistence import CacheFileError

__all__ = [
    "TREE_CACHE_FORMAT",
    "CacheFileError",
    "CacheIntegrityError",
    "TreeCache",
    "TreeCacheConfig",
    "TreeCacheStats",
]
