"""A model, in plain Python, of the rule SGLang verifies n-gram drafts with.

SGLang's n-gram worker samples with ``sgl_kernel.tree_speculative_sampling_target_only``. Per
request, with ``u`` one uniform per tree slot: starting at the root, the candidates under the
current node are tried in slot order, accumulating their target probabilities; the first
candidate ``c`` with ``p(c) > 0`` and ``u < (p(c_1) + ... + p(c))/threshold_acc`` (or
``p(c) >= threshold_single``) is accepted and becomes the current node, with its own ``u``.
When none is, or after ``num_steps - 1`` acceptances, one more token is drawn from the target
with the rejected candidates' probabilities removed, renormalized, with a separate uniform.

With both thresholds 1.0 that is inverse-CDF sampling of the target over the candidates, then of
the rest: exact, *if the candidates under each node are distinct*. A repeated candidate has its
probability counted once per copy, so it comes out more often than the target says. (The slot
links are those of SGLang's ``reconstruct_indices_from_tree_mask``: a node's first child is its
lowest child slot, its next sibling the next slot with the same parent.)

:func:`sample` runs the rule on given uniforms (for Monte Carlo tests); :func:`emitted_distribution`
integrates over the uniforms exactly (for exhaustive tests on a small vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["emitted_distribution", "links", "sample"]

Target = Callable[[tuple[int, ...]], Sequence[float]]
"""The target distribution after the given emitted tokens (relative to the tree's root)."""


def links(parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """``(next_token, next_sibling)`` per slot: first child and next sibling (``-1``: none)."""
    n = len(parents)
    first = [-1] * n
    sibling = [-1] * n
    last_child: dict[int, int] = {}
    for i in range(1, n):
        p = parents[i]
        if p in last_child:
            sibling[last_child[p]] = i
        else:
            first[p] = i
        last_child[p] = i
    return first, sibling


def _try_children(
    node: int, u: float, p: Sequence[float], tokens: Sequence[int], first: list[int], sibling: list[int],
    threshold_single: float, threshold_acc: float,
) -> tuple[int, list[int]]:  # fmt: skip
    """The accepted child of ``node`` for coin ``u`` (``-1``: none) and the tokens rejected before it."""
    acc = 0.0
    rejected: list[int] = []
    child = first[node]
    while child != -1:
        q = p[tokens[child]]
        acc += q
        if q > 0 and (u < acc / threshold_acc or q >= threshold_single):
            return child, rejected
        rejected.append(tokens[child])
        child = sibling[child]
    return -1, rejected


def sample(
    tokens: Sequence[int],
    parents: Sequence[int],
    target: Target,
    uniforms: Sequence[float],
    final_uniform: float,
    num_steps: int,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> tuple[int, ...]:
    """The tokens one verification emits: the accepted candidates, then the drawn token.

    Args:
        tokens: Slot tokens (slot 0: the root, the last committed token).
        parents: Slot parents (``-1`` for the root).
        target: The target distribution after a tuple of emitted tokens.
        uniforms: One uniform per slot (the coin used at that node).
        final_uniform: The uniform of the last, drawn token.
        num_steps: SGLang's ``num_speculative_tokens``: at most ``num_steps - 1`` acceptances.
        threshold_single: ``--speculative-accept-threshold-single``.
        threshold_acc: ``--speculative-accept-threshold-acc``.
    """
    first, sibling = links(parents)
    node, emitted = 0, tuple[int, ...]()
    rejected: list[int] = []
    for _ in range(1, num_steps):
        p = target(emitted)
        child, rejected = _try_children(
            node, uniforms[node], p, tokens, first, sibling, threshold_single, threshold_acc
        )
        if child == -1:
            break
        node, emitted, rejected = child, (*emitted, tokens[child]), []
    last = np.asarray(target(emitted), dtype=np.float64).copy()
    last[rejected] = 0.0  # the residual: the target without the rejected candidates
    cdf = np.cumsum(last)
    draw = int(np.searchsorted(cdf, final_uniform * cdf[-1], side="left"))
    return (*emitted, min(draw, len(last) - 1))


def emitted_distribution(
    tokens: Sequence[int],
    parents: Sequence[int],
    target: Target,
    num_steps: int,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> dict[tuple[int, ...], float]:
    """The exact probability of each emitted token tuple, integrating over the uniforms.

    At a node the coin ``u`` is uniform on [0, 1]: candidate ``k`` accepts ``u <= acc_k /
    threshold_acc`` (every ``u`` past ``threshold_single``) that no earlier candidate took, and
    the coins no candidate takes reject them all.
    """
    first, sibling = links(parents)
    out: dict[tuple[int, ...], float] = {}

    def draw(emitted: tuple[int, ...], weight: float, removed: list[int]) -> None:
        p = np.asarray(target(emitted), dtype=np.float64).copy()
        p[removed] = 0.0
        total = p.sum()
        for t in np.flatnonzero(p):
            key = (*emitted, int(t))
            out[key] = out.get(key, 0.0) + weight * p[t] / total

    def walk(node: int, emitted: tuple[int, ...], weight: float, steps: int) -> None:
        if steps == 0:
            draw(emitted, weight, [])
            return
        p = target(emitted)
        # Child k takes the coins in [0, hi_k] that no earlier child took: the union of earlier
        # children's sets is [0, covered], as each set is a prefix of [0, 1].
        acc, covered, removed = 0.0, 0.0, []
        child = first[node]
        while child != -1:
            q = p[tokens[child]]
            acc += q
            hi = 1.0 if q >= threshold_single else min(1.0, acc / threshold_acc)
            if q > 0 and hi > covered:  # a candidate the target cannot sample is never accepted
                walk(child, (*emitted, tokens[child]), weight * (hi - covered), steps - 1)
                covered = hi
            removed.append(tokens[child])
            child = sibling[child]
        if covered < 1.0:  # every candidate was tried and rejected
            draw(emitted, weight * (1.0 - covered), removed)

    walk(0, (), 1.0, num_steps - 1)
    return out
