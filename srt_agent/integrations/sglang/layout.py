"""srt-agent's draft trees in the layout SGLang's n-gram verification reads.

SGLang's n-gram worker verifies, per request, a fixed number ``width`` of tree slots
(``--speculative-num-draft-tokens``): slot 0 is the last committed token (the root), slots
``1 .. width - 1`` the draft, in breadth-first order, and a ``width x width`` mask in which row
``i`` marks ``i`` and its ancestors. SGLang's tree sampling kernel is exact only when the
candidates under each node are distinct (:mod:`.rule`), and its own corpus pads unused slots with
token 0 under the root, so a short draft repeats token 0 among the root's children. Here every
unused slot becomes a root child with a token no sibling has, so every sibling set is distinct.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from srt_agent.contracts.draft import DraftTree

__all__ = ["FlatTree", "flat_tree"]


@dataclass(frozen=True)
class FlatTree:
    """One request's verification tree in SGLang's layout.

    Attributes:
        tokens: ``width`` tokens: the root (last committed token), then the draft, breadth-first.
        parents: Parent slot of each slot (``-1`` for the root).
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    @property
    def width(self) -> int:
        """Slots, the root included."""
        return len(self.tokens)

    def mask(self) -> np.ndarray:
        """``[width, width]`` bool: ``mask[i, j]`` when slot ``j`` is ``i`` or one of its ancestors."""
        n = self.width
        out = np.zeros((n, n), dtype=bool)
        for i in range(n):
            j = i
            while j >= 0:
                out[i, j] = True
                j = self.parents[j]
        return out

    def depth(self) -> int:
        """Most draft tokens on one root-to-leaf path."""
        best = 0
        for i in range(self.width):
            d, j = 0, i
            while self.parents[j] >= 0:
                d, j = d + 1, self.parents[j]
            best = max(best, d)
        return best


def flat_tree(draft: DraftTree, root_token: int, width: int, vocab_size: int) -> FlatTree:
    """``draft`` (continuing ``root_token``) as ``width`` slots with distinct siblings everywhere.

    The draft's first ``width - 1`` nodes are kept (the tree cache ranks them best-first, and a
    parent always precedes its children, so any prefix is a tree); they are reordered
    breadth-first, and the slots left over become root children with the smallest token ids
    the root's children do not have yet (distinct pads: they are verified like any candidate).

    Raises:
        ValueError: ``width < 1``, or a vocabulary too small for distinct pads.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1 (the root), got {width}")
    keep = min(len(draft), width - 1)
    depth = [0] * keep
    for i in range(keep):
        p = draft.parents[i]
        depth[i] = 1 if p < 0 else depth[p] + 1
    order = sorted(range(keep), key=lambda i: (depth[i], i))  # breadth-first, stable
    slot = {node: k + 1 for k, node in enumerate(order)}
    tokens = [root_token] + [draft.token_ids[i] for i in order]
    parents = [-1] + [0 if draft.parents[i] < 0 else slot[draft.parents[i]] for i in order]
    pads = width - 1 - keep
    if pads:
        used = {t for t, p in zip(tokens[1:], parents[1:], strict=True) if p == 0}
        if vocab_size - len(used) < pads:
            raise ValueError(f"vocabulary of {vocab_size} has too few tokens for {pads} distinct pads")
        fresh = (t for t in range(vocab_size) if t not in used)
        first_deeper = next((k for k in range(1, len(tokens)) if parents[k] != 0), len(tokens))
        # Pads go after the real root children (still breadth-first); deeper slots shift by ``pads``.
        pad_tokens = [next(fresh) for _ in range(pads)]
        shift = {k: k + pads if k >= first_deeper else k for k in range(len(tokens))}
        shifted = [-1] + [shift[p] if p >= 0 else -1 for p in parents[1:]]
        tokens = tokens[:first_deeper] + pad_tokens + tokens[first_deeper:]
        parents = shifted[:first_deeper] + [0] * pads + shifted[first_deeper:]
    return FlatTree(tuple(tokens), tuple(parents))
