"""The exact acceptance rule: hand-computed cases and the distribution it produces."""

from __future__ import annotations

import math

import pytest
import torch

from srt_agent.contracts.generation import SamplingParams
from srt_agent.engine.sampling import RowParams, sample
from srt_agent.engine.speculation.verify import TreeWalk, Verdict, accept

pytestmark = pytest.mark.usefixtures("one_torch_thread")


CPU = torch.device("cpu")

# Tree:      root
#           /    \
#      0:"5"    1:"7"
#       |        |
#      2:"6"    3:"5"
#       |
#      4:"9"
TOKENS = (5, 7, 6, 5, 9)
PARENTS = (-1, -1, 0, 1, 2)


def test_first_child_rejected_emits_the_target_and_stops() -> None:
    # targets[t] is the token drawn at tree position t (0 = root, j + 1 = after node j).
    verdict = accept(TOKENS, PARENTS, [3, 0, 0, 0, 0, 0])
    assert verdict == Verdict(accepted=(), tokens=(3,), positions=(0,))


def test_second_child_accepted_then_its_child_rejected() -> None:
    # Root draws 7 (node 1); after node 1 the target is 4, not the drafted 5 (node 3).
    verdict = accept(TOKENS, PARENTS, [7, 1, 4, 2, 8, 8])
    assert verdict == Verdict(accepted=(1,), tokens=(7, 4), positions=(0, 2))


def test_whole_path_accepted_then_one_token_from_the_leaf() -> None:
    # 5 -> 6 -> 9 all accepted; the leaf (node 4, position 5) draws the bonus token 2.
    verdict = accept(TOKENS, PARENTS, [5, 6, 0, 9, 0, 2])
    assert verdict == Verdict(accepted=(0, 2, 4), tokens=(5, 6, 9, 2), positions=(0, 1, 3, 5))


def test_empty_draft_is_plain_sampling() -> None:
    assert accept((), (), [4]) == Verdict((), (4,), (0,))
    with pytest.raises(ValueError, match="one target per tree position"):
        accept((1,), (-1,), [4])


def test_draw_targets_inverse_cdf_by_hand() -> None:
    # p = softmax(log [0.5, 0.3, 0.2]) = [0.5, 0.3, 0.2]; cdf = [0.5, 0.8, 1.0].
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log().expand(1, 4, 3)  # (B=1, T=4, V=3)
    rows = RowParams.build([SamplingParams(temperature=1.0)], 3, CPU)
    uniforms = torch.tensor([[0.10, 0.55, 0.79, 0.95]])
    targets, logprobs = sample(logits, rows, uniforms)
    assert targets.tolist() == [[0, 1, 1, 2]]
    assert torch.allclose(logprobs, torch.tensor([[0.5, 0.3, 0.3, 0.2]]).log())


def test_draw_targets_temperature_top_p_and_greedy_rows() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(2, 2, 4)
    params = [SamplingParams(temperature=0.5, top_p=0.9), SamplingParams(temperature=0.0)]
    rows = RowParams.build(params, 4, CPU)
    # At temperature 0.5: p ~ exp([4, 2, 0, -2]) = [0.867, 0.117, 0.016, 0.002]; top-p 0.9 keeps the
    # first two (mass before the third is 0.984 >= 0.9), renormalised: [0.881, 0.119].
    uniforms = torch.tensor([[0.5, 0.99999], [0.99, 0.99]])
    targets, logprobs = sample(logits, rows, uniforms)
    assert targets.tolist() == [[0, 1], [0, 0]]  # greedy row: the argmax whatever its uniform
    e = torch.tensor([4.0, 2.0]).exp()
    assert math.isclose(logprobs[0, 1].item(), (e[1] / e.sum()).log().item(), rel_tol=1e-5)
    # Greedy logprobs are under the temperature-1 distribution (the engine's convention).
    assert math.isclose(logprobs[1, 0].item(), torch.log_softmax(logits[0, 0], -1)[0].item(), rel_tol=1e-5)


def test_greedy_accepts_exactly_the_argmax_child() -> None:
    logits = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 5.0]]])  # (1, 3, 3)
    rows = RowParams.build([SamplingParams(temperature=0.0)], 3, CPU)
    targets, _ = sample(logits, rows, None)
    # Root argmax 1 -> drafted node 0 (token 1) accepted; after it argmax 0 != drafted 2: stop.
    verdict = accept((1, 2), (-1, 0), targets[0].tolist())
    assert verdict.tokens == (1, 0) and verdict.accepted == (0,)


def test_rule_matches_sequential_acceptance_probabilities() -> None:
    """Per DESIGN.md: child c_j is accepted with probability p(c_j), and a rejection of all draws
    from p restricted to the other tokens. Drawn with 40k uniforms through the real functions."""
    p = torch.tensor([0.1, 0.25, 0.05, 0.4, 0.2])
    n = 40_000
    logits = p.log().expand(n, 1, 5)
    rows = RowParams.build([SamplingParams(temperature=1.0)] * n, 5, CPU)
    uniforms = torch.rand(n, 1, generator=torch.Generator().manual_seed(0))
    targets, _ = sample(logits, rows, uniforms)
    children = (3, 1)  # drafted children of the root, in this order
    first = torch.zeros(5)
    for (t,) in targets.tolist():
        first[accept(children, (-1, -1), [t, 0, 0]).tokens[0]] += 1
    freq = first / n
    assert (freq - p).abs().max().item() < 0.01  # the emitted token's distribution is p
    rejected = freq[[0, 2, 4]] / freq[[0, 2, 4]].sum()
    assert (rejected - p[[0, 2, 4]] / p[[0, 2, 4]].sum()).abs().max().item() < 0.015


@pytest.mark.parametrize("seed", range(5))
def test_lazy_walk_draws_only_where_it_goes_and_agrees_with_accept(seed: int) -> None:
    """The engine's TreeWalk draws at the positions it reaches; given the same draws per position,
    it must give accept()'s verdict, and it must ask only for positions on the emitted path."""
    rng = torch.Generator().manual_seed(seed)
    for _ in range(200):
        targets = torch.randint(4, 10, (len(TOKENS) + 1,), generator=rng).tolist()
        walk = TreeWalk(TOKENS, PARENTS)
        asked = []
        while True:
            asked.append(walk.position)
            if not walk.advance(targets[walk.position]):
                break
        verdict = accept(TOKENS, PARENTS, targets)
        assert walk.verdict() == verdict
        assert tuple(asked) == verdict.positions
