"""Exact verification of a draft tree: which drafted tokens a sequence accepts, and what it emits.

The rule (DESIGN.md, "Exact verification"): at a tree node with distinct drafted children and
target distribution ``p`` (after temperature, top-k, top-p), draw ``y ~ p``; if ``y`` is one of the
children, accept it and descend into that child; otherwise emit ``y`` and stop. When the whole
drafted path is accepted, the token after it is drawn from ``p`` at the leaf, which is the same
step (a leaf has no children). Every emitted token is thus a draw from the target distribution
given everything before it, so the output distribution is exactly that of plain sampling, whatever
the drafts; drafts only change how many tokens one forward yields. Greedy decoding is the point
mass on the argmax: a child is accepted iff it is the argmax.

The ``d``-th token a verify step emits (``d = 0, 1, ...``) is drawn from the distribution at depth
``d`` of the accepted path with the ``d``-th next uniform of the request's private stream, exactly
the uniform plain decoding would have used for that token. So a seeded request emits the same
tokens with or without speculation (up to float rounding of the logits). The draw at node ``j``
(depth ``d(j)``, the root, i.e. the last committed token, at depth 0) depends only on the node's
distribution and the uniform ``u[d(j)]``, so it does not matter when it is made: :func:`accept`
takes draws made up front at every node, while the engine's verifier (:class:`TreeWalk`) draws
only at the nodes the walk reaches, depth by depth, so the LM head and the sampling run once per
emitted token rather than once per drafted one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one draft tree.

    Attributes:
        accepted: Indices of the accepted draft nodes, from the root's child down (a path).
        tokens: Emitted tokens: the accepted drafted tokens, then one more drawn from the target
            distribution (``len(tokens) == len(accepted) + 1``).
        positions: For each emitted token, the tree position whose distribution it was drawn
            from (``0``: the root, ``j + 1``: after draft node ``j``); index the verify forward's
            logprobs with it.
    """

    accepted: tuple[int, ...]
    tokens: tuple[int, ...]
    positions: tuple[int, ...]


class TreeWalk:
    """The acceptance rule applied one draw at a time, for a verifier that draws lazily.

    Start at the root (position 0); :meth:`advance` with the token drawn from the target
    distribution at :attr:`position`. The walk descends while the token is a drafted child and
    ends at the first token that is not (that token is still emitted).

    Args:
        token_ids: Token of each draft node.
        parents: Parent of each draft node (``-1``: a child of the root); siblings are distinct.
    """

    def __init__(self, token_ids: Sequence[int], parents: Sequence[int]) -> None:
        self._child = {
            (parent, tok): j for j, (tok, parent) in enumerate(zip(token_ids, parents, strict=True))
        }
        self._node = -1
        self.accepted: list[int] = []
        self.tokens: list[int] = []
        self.positions: list[int] = []

    @property
    def position(self) -> int:
        """The tree position whose distribution the next token is drawn from."""
        return self._node + 1

    def advance(self, token: int) -> bool:
        """Emit ``token`` (drawn at :attr:`position`); whether the walk goes on (it was drafted)."""
        self.tokens.append(token)
        self.positions.append(self._node + 1)
        nxt = self._child.get((self._node, token))
        if nxt is None:  # not drafted here (or a leaf was reached): the token is the last one
            return False
        self.accepted.append(nxt)
        self._node = nxt
        return True

    def verdict(self) -> Verdict:
        """The accepted path and emitted tokens so far."""
        return Verdict(tuple(self.accepted), tuple(self.tokens), tuple(self.positions))


def accept(token_ids: Sequence[int], parents: Sequence[int], targets: Sequence[int]) -> Verdict:
    """Walk a draft tree with the target tokens drawn at every position (the acceptance rule).

    Args:
        token_ids: Token of each draft node.
        parents: Parent of each draft node (``-1``: a child of the root); siblings are distinct.
        targets: ``len(token_ids) + 1`` tokens: ``targets[0]`` drawn from the target distribution
            at the root, ``targets[j + 1]`` from the one after node ``j``.

    Returns:
        The accepted path and the emitted tokens.

    Raises:
        ValueError: ``targets`` has the wrong length.
    """
    if len(targets) != len(token_ids) + 1:
        raise ValueError(f"need one target per tree position: {len(token_ids) + 1}, got {len(targets)}")
    walk = TreeWalk(token_ids, parents)
    while walk.advance(targets[walk.position]):
        pass
    return walk.verdict()
