"""Prefix trees of continuations: the nodes of the tree cache and best-first draft selection.

Every conversation state has one tree. Its root stands for the state's prompt (the sequence start,
token :data:`SENTINEL`); the path from the root to a node spells a continuation generated from that
state. Counts are per sequence (finished, or in flight up to its last committed token)::

    node.count == sum(child.count for child in children) + node.ends

so ``count - ends`` is how many sequences went on past the node, and the chance that the next
token is child ``c`` is estimated as ``c.count / (count - ends)``: conditional on the sequence going
on, which is the only case a draft is asked for (sequences that stopped here, or are in flight
and stand here, say nothing about what comes next).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

SENTINEL = -1
"""The token of a root: the start of a continuation. Real token ids are ``>= 0``."""

# Byte estimates (CPython 3.11, 64-bit; measured with tracemalloc, see tests/test_tree_cache_memory.py).
NODE_BYTES = 160
"""A node: the slotted object with its GC header (96), its creation tick (an int, 32) and its token
(an int, 32; ids < 257 are shared singletons, so this slightly overestimates small vocabularies)."""
SMALL_DICT_BYTES = 224
"""A dict of 2..5 entries: a node's children once it has two, or an index key's nodes."""
DICT_ENTRY_BYTES = 40
"""Amortised growth of such a dict per entry beyond five."""


def container_bytes(n: int) -> int:
    """Bytes of a one-or-dict container holding ``n`` items (one item is stored inline: 0)."""
    return 0 if n <= 1 else SMALL_DICT_BYTES + DICT_ENTRY_BYTES * max(0, n - 5)


class Node:
    """One token of a prefix tree of continuations.

    Attributes:
        token: The token id (:data:`SENTINEL` for a root).
        parent: The parent node (``None`` for a root).
        count: Sequences through this node (ending here or going on).
        ends: Sequences whose last token (so far, for in-flight ones) is this node.
        live: Of ``count``, sequences from live streams (the rest came from run-ahead work).
        tick: Cache-wide creation order; suffix matches prefer recent nodes.
        kids: ``None``, the only child, or a dict token -> child once there are two or more.
            Most nodes of sampled text have one child, and storing it inline saves a dict
            (~224 bytes) on each of them.
    """

    __slots__ = ("count", "ends", "kids", "live", "parent", "tick", "token")

    def __init__(self, token: int, parent: Node | None, tick: int) -> None:
        self.token = token
        self.parent = parent
        self.count = 0
        self.ends = 0
        self.live = 0
        self.tick = tick
        self.kids: Node | dict[int, Node] | None = None


def child(node: Node, token: int) -> Node | None:
    """The child of ``node`` with ``token``, if any."""
    kids = node.kids
    if kids is None:
        return None
    if type(kids) is Node:
        return kids if kids.token == token else None
    return kids.get(token)  # type: ignore[union-attr]


def children(node: Node) -> Sequence[Node]:
    """The children of ``node`` (in insertion order)."""
    kids = node.kids
    if kids is None:
        return ()
    if type(kids) is Node:
        return (kids,)
    return list(kids.values())  # type: ignore[union-attr]


def n_children(node: Node) -> int:
    """How many children ``node`` has."""
    kids = node.kids
    return 0 if kids is None else 1 if type(kids) is Node else len(kids)  # type: ignore[arg-type]


def add_child(node: Node, token: int, tick: int) -> tuple[Node, int]:
    """Create the child of ``node`` with ``token`` (which must not exist yet).

    Returns:
        The new child (counts zero) and the bytes the tree grew by.
    """
    new = Node(token, node, tick)
    kids = node.kids
    if kids is None:
        node.kids = new
        return new, NODE_BYTES
    if type(kids) is Node:
        node.kids = {kids.token: kids, token: new}
        return new, NODE_BYTES + SMALL_DICT_BYTES  # container_bytes(2)
    kids[token] = new  # type: ignore[index]
    # container_bytes(n) - container_bytes(n - 1), inlined: this runs for every new node.
    return new, NODE_BYTES + DICT_ENTRY_BYTES if len(kids) > 5 else NODE_BYTES  # type: ignore[arg-type]


def iter_nodes(root: Node) -> Iterator[Node]:
    """Every node of the tree under ``root`` (``root`` first, parents before children)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        kids = node.kids
        if kids is None:
            continue
        if type(kids) is Node:
            stack.append(kids)
        else:
            stack.extend(kids.values())  # type: ignore[union-attr]


def tree_bytes(root: Node) -> tuple[int, int]:
    """Nodes under ``root`` and their estimated bytes (recomputed from scratch)."""
    n = total = 0
    for node in iter_nodes(root):
        n += 1
        total += NODE_BYTES + container_bytes(n_children(node))
    return n, total


def check_tree(root: Node, name: str) -> list[str]:
    """Invariant violations of the tree under ``root`` (empty if consistent).

    Checks per node: ``count == sum(children's counts) + ends``, ``0 <= ends``, ``count >= 1``
    below the root, the live count between the children's live sum and ``count``, parent links,
    token keys, creation ticks increasing downwards, and one child stored inline (never a dict of
    one).
    """
    problems: list[str] = []
    if root.parent is not None or root.token != SENTINEL:
        problems.append(f"{name}: the root has token {root.token} and a parent (expected {SENTINEL}, none)")
    for node in iter_nodes(root):
        kids = children(node)
        if isinstance(node.kids, dict) and len(node.kids) < 2:
            problems.append(
                f"{_where(name, node)} stores {len(node.kids)} child(ren) in a dict (expected inline)"
            )
        if isinstance(node.kids, dict) and any(t != c.token for t, c in node.kids.items()):
            problems.append(f"{_where(name, node)} has a child filed under the wrong token")
        below = sum(c.count for c in kids)
        if node.count != below + node.ends or node.ends < 0:
            problems.append(
                f"{_where(name, node)}: count {node.count} != children's {below} + ends {node.ends}"
            )
        if node is not root and node.count < 1:
            problems.append(f"{_where(name, node)}: count {node.count} < 1")
        live_below = sum(c.live for c in kids)
        if not live_below <= node.live <= node.count or node.live - live_below > node.ends:
            problems.append(
                f"{_where(name, node)}: live {node.live} outside [children's {live_below}, "
                f"count {node.count}] or more live ends than ends {node.ends}"
            )
        for c in kids:
            if c.parent is not node:
                problems.append(f"{_where(name, node)}: child {c.token} does not point back to it")
            if c.tick <= node.tick:
                problems.append(
                    f"{_where(name, node)}: child {c.token} has tick {c.tick} <= the parent's {node.tick}"
                )
        if len(problems) > 20:
            break
    return problems


def _where(name: str, node: Node) -> str:
    # Built only for a problem: the path walk costs as much as the checks of a node.
    return f"{name}: node {_path(node)}"


def _path(node: Node) -> list[int]:
    out: list[int] = []
    n: Node | None = node
    while n is not None and n.parent is not None:
        out.append(n.token)
        n = n.parent
    return out[::-1]


# A frontier entry of the best-first search: (-path probability, depth, parent's index in the draft,
# token, the tree nodes merged at this place, their live count). (parent, token) is unique, so tuple
# comparison never reaches the node lists. Ties in probability go to the shallower node, then to
# the node whose parent was chosen first, then to the smaller token: drafts are deterministic.
_Entry = tuple[float, int, int, int, Sequence[Node], int]


def select_draft(roots: Sequence[Node], budget: int) -> tuple[list[int], list[int], list[float], list[bool]]:
    """Pick up to ``budget`` nodes below ``roots``, best-first by estimated path probability.

    ``roots`` are merged: their children with the same token form one draft node whose count is
    the sum (suffix matches draft from several places at once; the exact state has one root). The
    probability of a draft node is its parent's times ``count / (sum of the parent's children's
    counts)``, so it never exceeds its parent's and the chosen nodes always form a tree: the draft
    is the first ``budget`` nodes in the order (higher probability, shallower, parent chosen
    earlier, smaller token).

    Returns:
        Token ids, parent indices (``-1``: a child of the roots), path probabilities, and per node
        whether its counts came only from run-ahead streams; nodes in the order chosen (a parent
        always before its children).
    """
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    runahead: list[bool] = []
    heap: list[_Entry] = []
    _push_children(heap, roots, 1.0, 0, -1, budget)
    while heap and len(tokens) < budget:
        neg_p, depth, parent, token, group, live = heapq.heappop(heap)
        while True:
            index = len(tokens)
            tokens.append(token)
            parents.append(parent)
            probs.append(-neg_p)
            runahead.append(live == 0)
            if index + 1 == budget:
                break
            node = group[0]
            kids = node.kids
            if len(group) > 1 or type(kids) is not Node:
                if kids is not None or len(group) > 1:
                    _push_children(heap, group, -neg_p, depth, index, budget - index - 1)
                break
            # A chain (most of sampled text): the only child is chosen next unless the frontier
            # holds something better, so skip the heap round trip. Frontier entries all have
            # parents chosen before this node, so they win ties of probability and depth.
            next_p = neg_p * (kids.count / (node.count - node.ends))
            if heap:
                top = heap[0]
                if next_p > top[0] or (next_p == top[0] and depth + 1 >= top[1]):
                    heapq.heappush(heap, (next_p, depth + 1, index, kids.token, (kids,), kids.live))
                    break
            neg_p, depth, parent, token = next_p, depth + 1, index, kids.token
            group, live = (kids,), kids.live
    return tokens, parents, probs, runahead


def _push_children(
    heap: list[_Entry], group: Sequence[Node], prob: float, depth: int, index: int, limit: int
) -> None:
    """Push the (merged) children of ``group`` onto the frontier; at most the ``limit`` best.

    Siblings ranked below the ``limit`` best can never be chosen: the better ones come first and
    would use up the remaining budget. Pruning them keeps wide nodes cheap.
    """
    items: list[_Entry]
    if len(group) == 1:  # one place (an exact state, or a single match): nothing to merge
        node = group[0]
        kids = node.kids
        if kids is None:
            return
        total = node.count - node.ends
        items = [
            (-(prob * (c.count / total)), depth + 1, index, c.token, (c,), c.live)
            for c in ((kids,) if type(kids) is Node else kids.values())  # type: ignore[union-attr]
        ]
    else:
        merged: dict[int, list[Node]] = {}
        total = 0
        for node in group:
            kids = node.kids
            if kids is None:
                continue
            total += node.count - node.ends
            for c in (kids,) if type(kids) is Node else kids.values():  # type: ignore[union-attr]
                nodes = merged.get(c.token)
                if nodes is None:
                    merged[c.token] = [c]
                else:
                    nodes.append(c)
        items = []
        for t, nodes in merged.items():
            count = sum(c.count for c in nodes)
            live = sum(c.live for c in nodes)
            items.append((-(prob * (count / total)), depth + 1, index, t, nodes, live))
    if len(items) > limit:
        items = heapq.nsmallest(limit, items)
    for item in items:
        heapq.heappush(heap, item)
