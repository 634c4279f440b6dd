"""Reuse of a finished sequence's keys and values by later requests that share its token prefix.

A multi-turn episode sends one request per turn, and each prompt is the previous prompt plus the
previous turn's tokens plus the observation. Without reuse every turn prefills the whole
conversation again; on a small model that is about half the engine's time in rollouts. So when a
sequence leaves its cache row (finished or preempted), the engine *parks* a copy of the row's
valid keys/values here, and a new request whose prompt shares a prefix with a parked entry copies
that prefix back into its row and prefills only the rest (the next turn: just the tool result and
the chat template's glue; a GRPO sibling: nothing but the last prompt token).

Keys and values of a causal model at position ``i`` depend only on tokens ``0 .. i``, so a shared
prefix gives the same entries as a fresh prefill (up to float rounding of different matmul
shapes, like any batched forward). They do depend on the weights: :meth:`PrefixStore.clear` is
called on every weight update.

Lookup: every entry is indexed by hashes of its first ``k * BLOCK`` tokens, so the longest shared
block-aligned prefix is a few dict lookups; the exact shared length is then checked and extended
token by token (hash collisions cannot produce a wrong match). Memory is bounded by a byte budget,
least recently used entries first out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from srt_agent.engine.kv_cache import KVCache

BLOCK = 32
"""Granularity of the prefix index (tokens); shorter shared prefixes are not reused."""


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    kv: torch.Tensor  # (layers, 2, Hkv, n, D): the parked row's first n positions
    keys: list[int] = field(default_factory=list)  # its block hashes, for unindexing

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


@dataclass(frozen=True)
class PrefixHit:
    """A reusable prefix for one prompt: copy ``length`` positions of ``kv`` into its row.

    Attributes:
        kv: ``(layers, 2, Hkv, n, D)`` parked keys and values, ``n >= length``.
        length: Positions to reuse (shared tokens, less than the prompt's length).
    """

    kv: torch.Tensor
    length: int


class PrefixStore:
    """Parked keys/values of finished sequences, looked up by shared token prefix.

    Args:
        budget_bytes: Most bytes of parked entries (0 disables the store).
    """

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"prefix cache budget must be >= 0 bytes (0 disables it), got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # id -> entry, least recent first
        self._index: dict[int, int] = {}  # block hash -> id of the newest entry with that prefix
        self._next_id = 0
        self.bytes = 0
        # Counters (monitoring and tests).
        self.hits = 0
        self.reused_tokens = 0
        self.parked = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry (their keys and values belong to the weights they were computed with)."""
        self._entries.clear()
        self._index.clear()
        self.bytes = 0

    def park(self, tokens: Sequence[int], cache: KVCache, row: int) -> None:
        """Copy the first ``len(tokens)`` positions of ``row`` (which hold ``tokens``) into the store.

        Args:
            tokens: The tokens whose keys/values the row holds at positions ``0 ..``.
            cache: The KV cache.
            row: The row (about to be freed).
        """
        n = len(tokens)
        if self.budget_bytes == 0 or n < BLOCK:
            return
        toks = tuple(tokens)
        best = self._longest(toks)
        if best is not None and best[1] >= n:  # an entry already covers these tokens: keep that one
            self._entries.move_to_end(best[0])
            return
        kv = cache.data[:, :, row, :, :n].clone()  # (layers, 2, Hkv, n, D)
        entry = _Entry(toks, kv)
        if entry.nbytes > self.budget_bytes:
            return
        if best is not None and best[1] == len(self._entries[best[0]].tokens):
            self._drop(best[0])  # the new entry extends it: the old one is redundant
        eid = self._next_id
        self._next_id += 1
        entry.keys = _block_hashes(toks)
        for key in entry.keys:
            self._index[key] = eid
        self._entries[eid] = entry
        self.bytes += entry.nbytes
        self.parked += 1
        while self.bytes > self.budget_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def lookup(self, prompt: Sequence[int]) -> PrefixHit | None:
        """The longest reusable prefix of ``prompt`` (at most ``len(prompt) - 1`` tokens), if any."""
        if not self._entries or len(prompt) <= BLOCK:
            return None
        toks = tuple(prompt)
        best = self._longest(toks)
        if best is None:
            return None
        eid, shared = best
        self._entries.move_to_end(eid)
        length = min(shared, len(toks) - 1)  # the last prompt token must run to give the logits
        self.hits += 1
        self.reused_tokens += length
        return PrefixHit(self._entries[eid].kv, length)

    def _longest(self, toks: tuple[int, ...]) -> tuple[int, int] | None:
        """``(entry id, shared length)`` of the entry sharing the longest prefix with ``toks``."""
        hashes = _block_hashes(toks)
        for blocks in range(len(hashes), 0, -1):
            eid = self._index.get(hashes[blocks - 1])
            if eid is None:
                continue
            tokens = self._entries[eid].tokens
            n = blocks * BLOCK
            if tokens[:n] != toks[:n]:  # a hash collision: ignore this block
                continue
            limit = min(len(tokens), len(toks))
            while n < limit and tokens[n] == toks[n]:
                n += 1
            return eid, n
        return None

    def _drop(self, eid: int) -> None:
        entry = self._entries.pop(eid)
        self.bytes -= entry.nbytes
        for key in entry.keys:
            if self._index.get(key) == eid:
                del self._index[key]


def _block_hashes(tokens: tuple[int, ...]) -> list[int]:
    """Keys of ``tokens[:BLOCK]``, ``tokens[:2 * BLOCK]``, ... (whole blocks only).

    Chained (each key hashes the previous key with one block), so a prompt costs one pass over its
    tokens; hashing every prefix afresh was quadratic in the conversation's length and took ~5% of
    the engine loop on long multi-turn episodes. Equal keys are only candidates: callers compare
    the tokens.
    """
    keys = []
    key = 0
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        key = hash((key, tokens[end - BLOCK : end]))
        keys.append(key)
    return keys
