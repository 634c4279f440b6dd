"""Vectorised per-row sampling: processing matches HF's warpers, draws follow the distribution."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from srt_agent.contracts.generation import SamplingParams
from srt_agent.engine.sampling import RowParams, processed_logprobs, sample

pytestmark = pytest.mark.usefixtures("one_torch_thread")


V = 50
CPU = torch.device("cpu")


def _hf_reference(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    x = logits[None].clone()
    temperature = p.temperature if p.temperature > 0 else 1.0
    x = TemperatureLogitsWarper(temperature)(None, x)
    if p.top_k:
        x = TopKLogitsWarper(p.top_k)(None, x)
    if p.top_p < 1.0:
        x = TopPLogitsWarper(p.top_p)(None, x)
    return x.log_softmax(-1)[0]


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.5, top_k=10, top_p=0.6),
    SamplingParams(temperature=0.0, top_k=3),
    SamplingParams(temperature=2.0, top_p=0.05),
]


def test_processing_matches_hf_warpers_per_row() -> None:
    logits = torch.randn(len(PARAMS), V, generator=torch.Generator().manual_seed(0)) * 3
    rows = RowParams.build(PARAMS, V, CPU)
    ours = processed_logprobs(logits, rows)
    for i, p in enumerate(PARAMS):
        ref = _hf_reference(logits[i], p)
        finite = torch.isfinite(ref)
        assert torch.equal(finite, torch.isfinite(ours[i])), p  # same support
        assert (ours[i][finite] - ref[finite]).abs().max().item() < 1e-5


def test_greedy_takes_argmax_and_reports_temperature_one_logprob() -> None:
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(1))
    rows = RowParams.build([SamplingParams(temperature=0.0)] * 2, V, CPU)
    tokens, logprobs = sample(logits, rows, None)
    assert torch.equal(tokens, logits.argmax(-1))
    expected = logits.log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
    assert torch.allclose(logprobs, expected)


def test_inverse_cdf_draw_follows_the_distribution() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, 0.5]])
    rows = RowParams.build([SamplingParams(temperature=1.0, top_k=3)], 5, CPU)
    probs = processed_logprobs(logits, rows).exp()[0]
    n = 20000
    counts = torch.zeros(5)
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(2))
    batch_rows = RowParams.build([SamplingParams(temperature=1.0, top_k=3)] * n, 5, CPU)
    tokens, token_lp = sample(logits.expand(n, 5), batch_rows, uniforms)
    counts.index_add_(0, tokens, torch.ones(n))
    assert counts[0].item() == 0 and counts[3].item() == 0  # outside the top 3: never drawn
    assert (counts / n - probs).abs().max().item() < 0.015
    assert torch.allclose(token_lp, probs.log()[tokens])


@pytest.mark.parametrize("u", [0.0, 0.999999940395])  # the smallest and largest float32 uniforms
def test_extreme_uniforms_never_pick_a_filtered_token(u: float) -> None:
    logits = torch.tensor([[5.0, 4.0, -3.0, 1.0]])
    rows = RowParams.build([SamplingParams(temperature=1.0, top_k=2)], 4, CPU)
    tokens, token_lp = sample(logits, rows, torch.tensor([u]))
    # The lowest uniform draws the likeliest kept token, the highest the last kept one (never the
    # filtered ones past it); their logprobs under the renormalised top 2 (logits 5 and 4).
    assert tokens.item() == (0 if u == 0.0 else 1)
    assert token_lp.item() == pytest.approx(-0.3133 if u == 0.0 else -1.3133, abs=1e-3)
    assert torch.isfinite(token_lp).all()


def test_mixed_greedy_and_sampled_rows() -> None:
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(3))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
    ]
    rows = RowParams.build(params, V, CPU)
    tokens, _ = sample(logits, rows, torch.tensor([0.5, 0.0, 0.5]))
    assert tokens[0].item() == logits[0].argmax().item()
    assert tokens[2].item() == logits[2].argmax().item()
    # u = 0 picks the first token of non-zero probability (every token here).
    assert tokens[1].item() == 0
