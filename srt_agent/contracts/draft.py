"""Draft trees and the interface between a draft source (the tree cache) and the engine.

A draft is a small tree of token ids that continues a sequence's committed tokens. Node ``i`` has
token ``token_ids[i]`` and parent ``parents[i]`` (``-1``: a child of the last committed token).
Nodes are in topological order (a parent comes before its children) and siblings carry distinct
tokens, which the exact verification rule needs (see ``srt_agent.engine.speculation.verify``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, runtime_checkable

DraftSource = Literal["exact", "task", "global", "none"]
"""Where a draft came from: the exact conversation state's tree, the same task's trees matched on the
recent tokens' suffix, the global tree, or nowhere (an empty draft)."""

StreamKind = Literal["live", "runahead"]
"""Live sequences feed trajectories; run-ahead sequences only feed the cache."""


@dataclass(frozen=True)
class DraftTree:
    """A token tree to verify in one forward pass.

    Attributes:
        token_ids: Token of each node.
        parents: Parent index of each node (``-1`` for children of the root, else ``< i``).
        probs: Estimated probability of reaching each node from the root (path probability from
            the cache's counts), used to rank nodes and by the engine's cost model.
        source: Where the draft came from.
        runahead: Per node, whether its counts come only from run-ahead content (a metric: drafts
            served by run-ahead work).
        backoff: A fallback draft matched only on the short back-off suffix; such drafts are less
            reliable than their counts say, so the engine's cost model calibrates them apart.
    """

    token_ids: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    source: DraftSource = "none"
    runahead: tuple[bool, ...] = field(default=())
    backoff: bool = False

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.parents) != n or len(self.probs) != n:
            raise ValueError(
                f"draft tree: {n} tokens, {len(self.parents)} parents, {len(self.probs)} probs (must match)"
            )
        if self.runahead and len(self.runahead) != n:
            raise ValueError(f"draft tree: {n} tokens but {len(self.runahead)} run-ahead flags")
        seen: set[tuple[int, int]] = set()
        for i, (tok, parent) in enumerate(zip(self.token_ids, self.parents, strict=True)):
            if not -1 <= parent < i:
                raise ValueError(f"draft tree: node {i} has parent {parent}; parents must be -1 or < {i}")
            if (parent, tok) in seen:
                raise ValueError(f"draft tree: node {i} repeats token {tok} under parent {parent}")
            seen.add((parent, tok))

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def calibration(self) -> str:
        """The cost model's acceptance class: the source, with back-off drafts apart."""
        return f"{self.source}-backoff" if self.backoff else self.source

    def head(self, k: int) -> DraftTree:
        """The draft's first ``k`` nodes (itself if it has no more).

        Always a valid tree: a node's parent precedes it.
        """
        if k >= len(self.token_ids):
            return self
        return DraftTree.trusted(
            self.token_ids[:k],
            self.parents[:k],
            self.probs[:k],
            self.source,
            self.runahead[:k],
            self.backoff,
        )

    def children(self, node: int) -> list[int]:
        """Indices of the children of ``node`` (``-1``: the root), in index order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def depth(self, node: int) -> int:
        """Number of nodes on the path from the root to ``node`` (1 for a root child)."""
        d = 0
        while node >= 0:
            node = self.parents[node]
            d += 1
        return d

    @classmethod
    def trusted(
        cls,
        token_ids: tuple[int, ...],
        parents: tuple[int, ...],
        probs: tuple[float, ...],
        source: DraftSource,
        runahead: tuple[bool, ...] = (),
        backoff: bool = False,
    ) -> DraftTree:
        """A draft built without the structural checks (for sources valid by construction).

        The tree cache's best-first selection always yields a valid tree; checking it again would
        cost as much as building it.
        """
        tree = object.__new__(cls)
        for name, value in (
            ("token_ids", token_ids),
            ("parents", parents),
            ("probs", probs),
            ("source", source),
            ("runahead", runahead),
            ("backoff", backoff),
        ):
            object.__setattr__(tree, name, value)
        return tree

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node``."""
        out: list[int] = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


EMPTY_DRAFT = DraftTree()


class DraftQuery(NamedTuple):
    """One row's draft request in a decode step (see :meth:`DraftSourceProtocol.draft_many`).

    Attributes:
        stream_id: The generation's stream (its request id): the one its tokens are reported on,
            so a source can draft from where the stream already stands instead of searching.
        state_key: Hash of ``prompt_ids``.
        task_id: The env task (``""``: none).
        prompt_ids: The prompt.
        generated: Tokens committed since the prompt.
        budget: Most draft nodes (``> 0``).
    """

    stream_id: str
    state_key: str
    task_id: str
    prompt_ids: Sequence[int]
    generated: Sequence[int]
    budget: int


class StreamUpdate(NamedTuple):
    """Tokens one row committed in a step (see :meth:`DraftSourceProtocol.extend_many`)."""

    stream_id: str
    state_key: str
    task_id: str
    new_tokens: Sequence[int]
    kind: StreamKind = "live"


@runtime_checkable
class DraftSourceProtocol(Protocol):
    """What the engine needs from a draft source (the TreeCache implements it).

    The engine calls ``draft`` before each verification forward of a sequence, and ``extend`` with
    every token it commits (so in-flight sequences feed the cache as they generate), then
    ``finish`` when the sequence ends. Calls come from the engine's worker thread.
    """

    def draft(
        self, state_key: str, task_id: str, prompt_ids: Sequence[int], generated: Sequence[int], budget: int
    ) -> DraftTree:
        """A draft of at most ``budget`` nodes continuing ``prompt_ids + generated``.

        ``state_key`` is the hash of ``prompt_ids`` (the state the generation started from);
        ``generated`` are the tokens committed since.
        """
        ...

    def extend(
        self,
        stream_id: str,
        state_key: str,
        task_id: str,
        new_tokens: Sequence[int],
        kind: StreamKind = "live",
    ) -> None:
        """Append ``new_tokens`` to stream ``stream_id`` (a generation from state ``state_key``)."""
        ...

    def finish(self, stream_id: str) -> None:
        """The stream ended; forget its cursor (its tokens stay in the cache)."""
        ...

    def draft_many(self, queries: Sequence[DraftQuery]) -> list[DraftTree]:
        """Every row's draft for one decode step, in one call (one draft per query, in order)."""
        ...

    def extend_many(self, updates: Sequence[StreamUpdate]) -> None:
        """Every row's committed tokens of one step, in one call.

        Each update is applied even if another one is invalid; invalid ones raise afterwards.
        """
        ...


class DraftSourceBase:
    """Batched calls of :class:`DraftSourceProtocol` made of its per-row ones.

    Subclasses implement ``draft``, ``extend`` and ``finish``; a source with a cheaper batched path
    (the tree cache: one lock and per-stream cursors) overrides :meth:`draft_many` and
    :meth:`extend_many` as well.
    """

    def draft(
        self, state_key: str, task_id: str, prompt_ids: Sequence[int], generated: Sequence[int], budget: int
    ) -> DraftTree:
        """A draft of at most ``budget`` tokens for the stream (see :class:`DraftSourceProtocol`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement draft()")

    def extend(
        self,
        stream_id: str,
        state_key: str,
        task_id: str,
        new_tokens: Sequence[int],
        kind: StreamKind = "live",
    ) -> None:
        """Append committed tokens to a stream (see :class:`DraftSourceProtocol`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement extend()")

    def draft_many(self, queries: Sequence[DraftQuery]) -> list[DraftTree]:
        """One :meth:`draft` per query."""
        return [self.draft(q.state_key, q.task_id, q.prompt_ids, q.generated, q.budget) for q in queries]

    def extend_many(self, updates: Sequence[StreamUpdate]) -> None:
        """One :meth:`extend` per update; the first error is raised after all were tried."""
        error: Exception | None = None
        for u in updates:
            try:
                self.extend(u.stream_id, u.state_key, u.task_id, u.new_tokens, u.kind)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the other updates
                error = error or exc
        if error is not None:
            raise error


class StaticDraftSource(DraftSourceBase):
    """Base of draft sources that learn nothing from generation (benchmark stand-ins, disabled caches).

    Subclasses implement :meth:`draft`; committed tokens and ended streams are ignored.
    """

    def extend(
        self,
        stream_id: str,
        state_key: str,
        task_id: str,
        new_tokens: Sequence[int],
        kind: StreamKind = "live",
    ) -> None:
        """Ignored: the drafts do not depend on what was generated."""

    def extend_many(self, updates: Sequence[StreamUpdate]) -> None:
        """Ignored."""

    def finish(self, stream_id: str) -> None:
        """Ignored."""
