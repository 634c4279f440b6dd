"""The tree cache behind SGLang's n-gram corpus interface: SRT's drafts inside SGLang.

SGLang's ``NGRAMWorker`` asks its corpus, before every verify forward, for each running request's
draft (``batch_get(req_ids, batch_tokens, total_lens)``: the last tokens of each request's context
and its full length) and tells it which requests left (``erase_match_state``). This adapter keeps
srt-agent's :class:`~srt_agent.tree_cache.TreeCache` there instead of SGLang's n-gram trie:

* the conversation state is the hash of the request's prompt (``state_key``, as in the in-process
  engine), bound per request by the worker (:meth:`TreeCacheCorpus.bind`);
* the tokens a request committed since its last call are reported to the cache as a stream, so a
  second sample of a GRPO group drafts from the first one while both run;
* drafts are laid out in SGLang's fixed width with distinct siblings and distinct pads
  (:func:`~srt_agent.integrations.sglang.layout.flat_tree`), the condition under which SGLang's
  sampling kernel is exact;
* the trees survive cache flushes (weight updates): the worker forgets its requests, not its trees.

It imports nothing from SGLang, so it is tested on any machine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from srt_agent.contracts.draft import DraftQuery, StreamKind, StreamUpdate
from srt_agent.contracts.generation import state_key
from srt_agent.integrations.sglang.layout import flat_tree
from srt_agent.tree_cache import TreeCache

__all__ = ["TreeCacheCorpus"]

log = logging.getLogger(__name__)


@dataclass
class _Request:
    key: str
    prompt_len: int
    kind: StreamKind
    generated: list[int] = field(default_factory=list)
    synced: bool = True  # False once a step's new tokens were not all in the tail it was given


class TreeCacheCorpus:
    """SGLang's n-gram corpus interface over a :class:`TreeCache`.

    The interface: ``batch_get``, ``batch_put``, ``synchronize``, ``erase_match_state``, ``reset``.

    Args:
        cache: The tree cache (kept across :meth:`forget_requests`).
        draft_token_num: SGLang's ``--speculative-num-draft-tokens``: slots per request, the root
            (the last context token) included.
        vocab_size: The model's vocabulary (pads are distinct token ids below it).
    """

    def __init__(self, cache: TreeCache, draft_token_num: int, vocab_size: int) -> None:
        if draft_token_num < 1:
            raise ValueError(f"draft_token_num must be >= 1, got {draft_token_num}")
        self.cache = cache
        self.width = draft_token_num
        self.vocab_size = vocab_size
        self._requests: dict[str, _Request] = {}
        self.lost_sync = 0  # requests whose committed tokens could not all be recovered (metric)

    # ------------------------------------------------------------------ srt-agent's additions
    def knows(self, rid: str) -> bool:
        """Whether request ``rid`` is bound (its prompt hashed already)."""
        return rid in self._requests

    def bind(self, rid: str, prompt_ids: Sequence[int], kind: StreamKind = "live") -> None:
        """Make a request known: its conversation state is the hash of its prompt."""
        if rid not in self._requests:
            self._requests[rid] = _Request(state_key(prompt_ids), len(prompt_ids), kind)

    def forget_requests(self) -> None:
        """Drop every request's stream (a cache flush); the trees and their counts stay."""
        for rid in list(self._requests):
            self._finish(rid)

    # ------------------------------------------------------------------ SGLang's corpus interface
    def synchronize(self) -> None:
        """Inserts are synchronous here: nothing to wait for."""

    def batch_put(self, batch_tokens: Sequence[Sequence[int]]) -> None:
        """Nothing to do: :meth:`batch_get` reports each request's committed tokens as they come."""

    def batch_get(
        self, req_ids: Sequence[str], batch_tokens: Sequence[Sequence[int]], total_lens: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each request's draft: ``width`` tokens (root first, breadth-first) and the ancestor mask.

        Args:
            req_ids: The requests, in batch order.
            batch_tokens: The last tokens of each request's context (prompt + output); the
                last one is the root of its tree.
            total_lens: Each context's full length.

        Returns:
            ``(tokens, mask)``: int64 arrays of ``len(req_ids) * width`` and
            ``len(req_ids) * width * width`` entries, as SGLang's corpus returns them.
        """
        updates: list[StreamUpdate] = []
        queries: list[DraftQuery] = []
        for rid, tail, total in zip(req_ids, batch_tokens, total_lens, strict=True):
            req = self._requests.get(rid)
            if req is None:  # not bound: draft from the tail's suffix, over every state
                req = self._requests[rid] = _Request(state_key(list(tail)), len(tail), "live", synced=False)
            new = total - req.prompt_len - len(req.generated)
            if req.synced and new > 0:
                if new <= len(tail):
                    fresh = [int(t) for t in tail[len(tail) - new :]]
                    req.generated.extend(fresh)
                    updates.append(StreamUpdate(rid, req.key, "", fresh, req.kind))
                else:  # more tokens than the tail holds: stop reporting rather than guess
                    req.synced = False
                    self.lost_sync += 1
            generated = req.generated if req.synced else [int(t) for t in tail]
            queries.append(DraftQuery(rid, req.key if req.synced else "", "", (), generated, self.width - 1))
        if updates:
            try:
                self.cache.extend_many(updates)
            except ValueError as exc:  # the valid ones were applied; drafting goes on
                log.warning("tree cache refused some tokens: %s", exc)
        n = len(req_ids)
        roots = [int(tail[-1]) if len(tail) else 0 for tail in batch_tokens]
        if self.width > 1 and self.cache.backend == "native":  # drafts and layout in one native call
            return native_flat(self.cache, queries, roots, self.width, self.vocab_size)
        drafts = self.cache.draft_many(queries) if self.width > 1 else []
        tokens = np.zeros(n * self.width, dtype=np.int64)
        mask = np.zeros(n * self.width * self.width, dtype=np.int64)
        for i, root in enumerate(roots):
            if drafts:
                tree = flat_tree(drafts[i], root, self.width, self.vocab_size)
                tokens[i * self.width : (i + 1) * self.width] = tree.tokens
                mask[i * self.width**2 : (i + 1) * self.width**2] = tree.mask().reshape(-1)
            else:
                tokens[i], mask[i] = root, 1
        return tokens, mask

    def erase_match_state(self, req_ids: Sequence[str]) -> None:
        """The requests left the batch: end their streams (their tokens stay in the trees)."""
        for rid in req_ids:
            self._finish(rid)

    def reset(self) -> None:
        """Forget everything, trees included (SGLang's meaning of a corpus reset)."""
        self.forget_requests()
        self.cache = TreeCache(self.cache.config)

    def _finish(self, rid: str) -> None:
        req = self._requests.pop(rid, None)
        if req is not None and req.generated and req.synced:
            try:
                self.cache.finish(rid)
            except ValueError:  # the cache never started it (evicted state, say)
                log.debug("tree cache had no stream %s", rid)


def native_flat(
    cache: TreeCache, queries: Sequence[DraftQuery], roots: Sequence[int], width: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every query's draft in SGLang's n-gram verification layout, in one call of the native core.

    Row ``i`` is ``width`` slots (``roots[i]``, then the draft breadth-first, then distinct pads
    under the root) and a ``width x width`` ancestor mask, exactly as :func:`.layout.flat_tree`
    lays out :meth:`TreeCache.draft_many`'s drafts, without building them.

    Returns:
        ``(tokens, mask)``: int64 arrays of ``len(queries) * width`` and
        ``len(queries) * width * width`` entries.

    Raises:
        RuntimeError: The cache runs on the Python core (use ``draft_many`` and ``flat_tree``).
        ValueError: A negative budget, or a vocabulary too small for distinct pads.
    """
    if cache.backend != "native":
        raise RuntimeError("the one-call layout needs the native core; with the Python core use draft_many")
    tokens = np.zeros(len(queries) * width, dtype=np.int64)
    mask = np.zeros(len(queries) * width * width, dtype=np.int64)
    with cache.locked_core() as core:
        core.draft_flat(queries, roots, width, vocab_size, tokens, mask)  # type: ignore[attr-defined]
    return tokens, mask
