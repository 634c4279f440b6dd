"""srt-agent's trees under SGLang's n-gram verification rule (modelled in plain Python).

Exhaustive: every emitted token tuple's probability, integrated exactly over the kernel's
uniforms, continued with the target to a fixed length, equals the target's own probability of
that sequence. Monte Carlo: the sampled first tokens pass a chi-square test. And the stock
corpus's padding (token 0 repeated under the root) is shown to bias token 0.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import numpy as np
import pytest
from stats_fixtures import chi_square_p

from srt_agent.contracts.draft import DraftTree
from srt_agent.integrations.sglang.layout import flat_tree
from srt_agent.integrations.sglang.rule import emitted_distribution, links, sample
from srt_agent.tree_cache import TreeCache

VOCAB = 4
STEPS = 3  # num_speculative_tokens: up to two acceptances, then a drawn token


def _target(seed: int):  # type: ignore[no-untyped-def]
    """A context-dependent target over VOCAB tokens, with some zero-probability tokens."""

    def p(emitted: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([seed, len(emitted), *emitted])
        q = rng.dirichlet(np.full(VOCAB, 0.7))
        q[rng.random(VOCAB) < 0.2] = 0.0
        if q.sum() == 0:
            q[0] = 1.0
        return q / q.sum()

    return p


def _random_draft(rng: random.Random, n: int) -> DraftTree:
    tokens: list[int] = []
    parents: list[int] = []
    for i in range(n):
        parent = rng.randrange(-1, i)
        taken = {t for t, p in zip(tokens, parents, strict=True) if p == parent}
        free = [t for t in range(VOCAB) if t not in taken]
        if not free:
            continue
        tokens.append(rng.choice(free))
        parents.append(parent)
    return DraftTree(tuple(tokens), tuple(parents), (1.0,) * len(tokens), "exact")


def _sequence_law(dist: dict[tuple[int, ...], float], target, length: int) -> dict[tuple[int, ...], float]:  # type: ignore[no-untyped-def]
    """Each emitted tuple continued with the target up to ``length`` tokens."""
    out: dict[tuple[int, ...], float] = {}
    for emitted, w in dist.items():
        rest = length - len(emitted)
        for tail in itertools.product(range(VOCAB), repeat=rest):
            prob, seq = w, emitted
            for t in tail:
                prob *= target(seq)[t]
                seq = (*seq, t)
            if prob > 0:
                out[seq] = out.get(seq, 0.0) + prob
    return out


def _target_law(target, length: int) -> dict[tuple[int, ...], float]:  # type: ignore[no-untyped-def]
    return _sequence_law({(): 1.0}, target, length)


@pytest.mark.parametrize("seed", range(40))
def test_flat_trees_yield_exactly_the_target_distribution(seed: int) -> None:
    rng = random.Random(seed)
    draft = _random_draft(rng, rng.randrange(0, 7))
    tree = flat_tree(draft, root_token=rng.randrange(VOCAB), width=rng.randrange(1, 6), vocab_size=VOCAB)
    target = _target(seed)
    dist = emitted_distribution(tree.tokens, tree.parents, target, STEPS)
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-12)
    got, want = _sequence_law(dist, target, STEPS), _target_law(target, STEPS)
    assert set(got) == set(want)
    for seq, p in want.items():
        assert got[seq] == pytest.approx(p, abs=1e-12), seq


def test_the_model_of_the_rule_matches_its_own_sampler() -> None:
    """``emitted_distribution`` (integrated) against ``sample`` (driven by uniforms), chi-square."""
    draft = DraftTree((1, 2, 3, 0, 2), (-1, -1, 0, 0, 1), (1.0,) * 5, "exact")
    tree = flat_tree(draft, root_token=3, width=6, vocab_size=VOCAB)
    target = _target(7)
    rng = np.random.default_rng(0)
    n = 20_000
    counts = Counter(
        sample(tree.tokens, tree.parents, target, rng.random(tree.width), rng.random(), STEPS)
        for _ in range(n)
    )
    dist = emitted_distribution(tree.tokens, tree.parents, target, STEPS)
    assert chi_square_p(counts, dist, n) > 0.01


def test_tree_cache_drafts_become_width_slots_with_distinct_siblings() -> None:
    cache = TreeCache()
    for seq in ([5, 6, 7], [5, 6, 8], [5, 9], [4]):
        cache.insert("state", "task", seq)
    draft = cache.draft("state", "task", (1, 2), (), budget=8)
    for width in (1, 3, 6, 10):
        tree = flat_tree(draft, root_token=2, width=width, vocab_size=16)
        assert tree.width == width and tree.tokens[0] == 2 and tree.parents[0] == -1
        siblings = Counter((p, t) for t, p in zip(tree.tokens[1:], tree.parents[1:], strict=True))
        assert max(siblings.values(), default=1) == 1
        depths = [tree.mask()[i].sum() - 1 for i in range(width)]
        assert depths == sorted(depths)  # breadth-first
        assert all(p < i for i, p in enumerate(tree.parents))
    full = flat_tree(draft, root_token=2, width=10, vocab_size=16)
    assert set(full.tokens[1:]) >= {5, 4, 6, 9} and full.depth() == 3
    first, _ = links(full.parents)
    assert full.tokens[first[0]] in (4, 5)  # the best root child comes first


def test_stock_padding_with_token_zero_biases_token_zero() -> None:
    """SGLang's corpus fills unused slots with token 0 under the root: duplicate candidates."""
    target = _target(3)
    p0 = target(())[0]
    assert p0 > 0.05
    stock_tokens, stock_parents = (2, 1, 0, 0, 0), (-1, 0, 0, 0, 0)  # one real child, three pads
    dist = emitted_distribution(stock_tokens, stock_parents, target, 2)
    first = Counter[int]()
    for seq, w in dist.items():
        first[seq[0]] += w  # type: ignore[assignment]
    assert first[0] > p0 + 0.05  # token 0 counted three times
    ours = flat_tree(DraftTree((1,), (-1,), (1.0,), "exact"), 2, 5, VOCAB)
    ours_dist = emitted_distribution(ours.tokens, ours.parents, target, 2)
    assert sum(w for s, w in ours_dist.items() if s[0] == 0) == pytest.approx(p0, abs=1e-12)
