"""Suffix matching over cached trees (the fallback when a conversation state is new).

SuffixDecoding drafts, for a new request, what followed earlier occurrences of the request's last
few tokens. Here the earlier text lives in the prefix trees already, so the index maps a short
*window* of context to tree **nodes** rather than to positions in raw sequences: a node stands for
every cached sequence through it, its subtree is what followed, with counts, and drafting from
several matched nodes is the same best-first search as drafting from an exact state.

A node's context is ``[SENTINEL] + path`` (the path from its tree's root; the sentinel marks the
start of a continuation, so matches near the start only hit nodes at the same depth). A query's
context is ``[SENTINEL] + generated``. Each node is filed under a hash of the last ``window``
tokens of its context (the whole context when shorter), one entry per node and scope, so the
index costs one dict slot per node however long the match that is ranked later. The longest match
is then found by comparing backwards, up to ``max_match`` tokens, for the most recent candidates.
"""

from __future__ import annotations

from collections.abc import Sequence

from srt_agent.tree_cache.prefix_tree import (
    DICT_ENTRY_BYTES,
    SENTINEL,
    SMALL_DICT_BYTES,
    Node,
    container_bytes,
)

INDEX_KEY_BYTES = 56
"""One key of an index: its slot in a large dict (~48 amortised) and a share of the key (an int,
32, shared by the global and the task index). A key's second and later nodes cost what their
ordered-set dict grows by (:func:`container_bytes`)."""


def query_key(generated: Sequence[int], window: int) -> tuple[int, int]:
    """The index key of a query context ``[SENTINEL] + generated``, and the window's length."""
    n = len(generated)
    if n >= window:
        return hash(tuple(generated[n - window :])), window
    return hash((SENTINEL, *generated)), n + 1


def node_key(node: Node, window: int) -> int:
    """The index key of ``node``: the same hash as :func:`query_key` of its path."""
    return node_keys(node, (window,))[0]


def node_keys(node: Node, windows: Sequence[int]) -> list[int]:
    """:func:`node_key` for each of ``windows`` (longest first), from one walk up the tree."""
    toks: list[int] = []
    n = node
    longest = windows[0]
    while n.parent is not None and len(toks) < longest:
        toks.append(n.token)
        n = n.parent
    # Fewer tokens than a window means the walk reached the root: the whole context, sentinel first.
    return [
        hash(tuple(reversed(toks[:w]))) if len(toks) >= w else hash((SENTINEL, *reversed(toks)))
        for w in windows
    ]


def path_keys(path: Sequence[int], windows: Sequence[int]) -> list[int]:
    """:func:`node_keys` of the node reached by ``path`` from its tree's root, from the path itself.

    Equal to the walk up the tree (the same hashes), without the walk: the engine reports tokens
    with the stream's whole path at hand.
    """
    n = len(path)
    if len(windows) == 1:  # the default; this runs for every new node, so no comprehension
        w = windows[0]
        return [hash(tuple(path[n - w :])) if n >= w else hash((SENTINEL, *path))]
    return [hash(tuple(path[n - w :])) if n >= w else hash((SENTINEL, *path)) for w in windows]


def match_length(node: Node, generated: Sequence[int], limit: int) -> int:
    """Length of the common suffix of ``node``'s context and ``[SENTINEL] + generated``, up to ``limit``."""
    m = 0
    i = len(generated)
    n = node
    while m < limit:
        parent = n.parent
        if parent is None:  # the node's context starts here; a match needs the query's to as well
            return m + 1 if i == 0 else m
        i -= 1
        if i < 0 or n.token != generated[i]:
            return m
        m += 1
        n = parent
    return m


class SuffixIndex:
    """Nodes of one scope (a task, or all tasks) by :func:`node_key`, oldest first per key.

    A key's nodes are stored inline when there is one, else in an insertion-ordered dict used as
    an ordered set (creation order is recency order: removal is O(1), the newest are at the end).

    Attributes:
        nodes: Nodes indexed.
        bytes: Estimated bytes held (see :data:`INDEX_KEY_BYTES`, :func:`container_bytes`).
    """

    __slots__ = ("_entries", "bytes", "nodes")

    def __init__(self) -> None:
        self._entries: dict[int, Node | dict[Node, None]] = {}
        self.nodes = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self.nodes

    def add(self, key: int, node: Node) -> int:
        """File ``node`` (created after every node filed so far) under ``key``; returns bytes added."""
        # Called for every new node of every stream (the cache's upkeep): branches, not helpers.
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            entries[key] = node
            grown = INDEX_KEY_BYTES
        elif type(entry) is Node:
            entries[key] = {entry: None, node: None}
            grown = SMALL_DICT_BYTES  # container_bytes(2)
        else:
            # container_bytes(n) - container_bytes(n - 1), with n the entry's size after the add
            entry[node] = None  # type: ignore[index]
            grown = DICT_ENTRY_BYTES if len(entry) > 5 else 0  # type: ignore[arg-type]
        self.nodes += 1
        self.bytes += grown
        return grown

    def remove(self, key: int, node: Node) -> int:
        """Drop ``node`` from ``key``; returns bytes freed.

        Raises:
            KeyError: ``node`` is not filed under ``key``.
        """
        entry = self._entries[key]
        if isinstance(entry, Node):
            if entry is not node:
                raise KeyError(key)
            del self._entries[key]
            freed = INDEX_KEY_BYTES
        else:
            del entry[node]
            freed = container_bytes(len(entry) + 1) - container_bytes(len(entry))
            if len(entry) == 1:
                self._entries[key] = next(iter(entry))
        self.nodes -= 1
        self.bytes -= freed
        return freed

    def recent(self, key: int, limit: int) -> list[Node]:
        """Up to ``limit`` nodes filed under ``key``, newest first."""
        entry = self._entries.get(key)
        if entry is None:
            return []
        if isinstance(entry, Node):
            return [entry]
        out: list[Node] = []
        for node in reversed(entry):
            out.append(node)
            if len(out) == limit:
                break
        return out

    def matches(
        self, generated: Sequence[int], window: int, max_match: int, scan_limit: int, max_candidates: int
    ) -> list[Node]:
        """The nodes to draft from for a query context ``[SENTINEL] + generated``.

        Among the ``scan_limit`` newest nodes filed under the query's window, those with children
        (something followed them) are ranked by how far their context matches the query's (up to
        ``max_match`` tokens); the longest-matching ones win, newest first, at most
        ``max_candidates``. A candidate that fails to match its whole window (a hash collision)
        is skipped.
        """
        key, need = query_key(generated, window)
        longest = min(max_match, len(generated) + 1)
        best = 0
        chosen: list[Node] = []
        for node in self.recent(key, scan_limit):
            if node.kids is None:
                continue
            m = match_length(node, generated, max_match)
            if m < need or m < best:
                continue
            if m > best:
                best = m
                chosen = [node]
            elif len(chosen) < max_candidates:
                chosen.append(node)
            if best == longest and len(chosen) == max_candidates:
                break  # older nodes can neither match longer nor displace newer ones
        return chosen

    def check(self, expected: dict[Node, int], name: str) -> list[str]:
        """Differences between the index and ``expected`` (node -> key); empty if they agree."""
        problems: list[str] = []
        seen = 0
        for key, entry in self._entries.items():
            nodes = [entry] if isinstance(entry, Node) else list(entry)
            if isinstance(entry, dict) and len(entry) < 2:
                problems.append(f"{name}: key {key} stores {len(entry)} node(s) in a dict (expected inline)")
            ticks = [n.tick for n in nodes]
            if ticks != sorted(ticks):
                problems.append(f"{name}: key {key} lists nodes out of creation order {ticks}")
            for n in nodes:
                seen += 1
                if expected.get(n) != key:
                    problems.append(
                        f"{name}: a node (tick {n.tick}) is filed under key {key} but should not be"
                    )
        if seen != len(expected) or self.nodes != len(expected):
            problems.append(
                f"{name}: holds {seen} nodes (counter says {self.nodes}), expected {len(expected)}"
            )
        want = INDEX_KEY_BYTES * len(self._entries) + sum(
            container_bytes(1 if isinstance(e, Node) else len(e)) for e in self._entries.values()
        )
        if want != self.bytes:
            problems.append(f"{name}: byte counter {self.bytes} != recomputed {want}")
        return problems[:20]
