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
tokens with or without speculation (up to float rounding of the logits), and the draws of all
nodes can be made up front in one vectorised op (:func:`draw_targets`): node ``j`` at depth
``d(j)`` (the root, i.e. the last committed token, at depth 0) gets the uniform ``u[d(j)]``. The
tree walk (:func:`accept`) then only compares token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from srt_agent.engine.sampling import RowParams, draw, processed_logprobs


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


def accept(token_ids: Sequence[int], parents: Sequence[int], targets: Sequence[int]) -> Verdict:
    """Walk a draft tree with the target tokens drawn at every position (the acceptance rule).

    Args:
        token_ids: Token of each draft node.
        parents: Parent of each draft node (``-1``: a child of the root); siblings are distinct.
        targets: ``len(token_ids) + 1`` tokens: ``targets[0]`` drawn from the target distribution
            at the root, ``targets[j + 1]`` from the one after node ``j`` (see :func:`draw_targets`).

    Returns:
        The accepted path and the emitted tokens.

    Raises:
        ValueError: ``targets`` has the wrong length.
    """
    if len(targets) != len(token_ids) + 1:
        raise ValueError(f"need one target per tree position: {len(token_ids) + 1}, got {len(targets)}")
    child = {(parent, tok): j for j, (tok, parent) in enumerate(zip(token_ids, parents, strict=True))}
    accepted: list[int] = []
    tokens: list[int] = []
    positions: list[int] = []
    node = -1
    while True:
        position = node + 1
        y = targets[position]
        tokens.append(y)
        positions.append(position)
        nxt = child.get((node, y))
        if nxt is None:  # y is not drafted here (or a leaf was reached): y is the last token
            return Verdict(tuple(accepted), tuple(tokens), tuple(positions))
        accepted.append(nxt)
        node = nxt


def draw_targets(
    logits: torch.Tensor, rows: RowParams, uniforms: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw the target token at every tree position of every row, in one vectorised pass.

    Args:
        logits: ``(B, T, V)`` raw logits of the verify forward (position 0 is the root).
        rows: Sampling parameters of the ``B`` rows.
        uniforms: ``(B, T)``: the uniform of each position (the request's uniform for the
            position's depth); ``None`` when every row is greedy.

    Returns:
        ``(targets (B, T) int64, logprobs (B, T) float32)``: the drawn token at each position and
        its logprob under the processed target distribution (the logprob to record if emitted).
    """
    logprobs = processed_logprobs(logits, rows)  # (B, T, V)
    targets = draw(logprobs, logits, rows, uniforms)  # (B, T)
    return targets, logprobs.gather(-1, targets[..., None])[..., 0]
