"""Speculation is exact: sampled continuations follow the model's distribution whatever the drafts.

A random model with an 8-token vocabulary; the exact joint distribution of the first three
generated tokens (512 cells) comes from teacher-forced HF forwards over every 3-token
continuation, processed like the engine's sampling (temperature, top-p). Thousands of requests
with distinct seeds, batched, generate with drafts sampled from the model itself (good), random
tokens (bad) or half of each (partial), and a chi-square test compares the counts with the exact
distribution (cells expecting fewer than 5 samples pooled). A sampled continuation of probability 0
(outside top-p) fails the test outright. Generation runs past the measured tokens, so the verified
trees are deeper than the window (every step verifies up to five draft tokens).

Seeded outputs do not depend on the drafts at all (the d-th token of a verify step uses the d-th
uniform of the request's stream, as plain decoding does; see srt_agent.engine.speculation.verify);
test_engine_spec.py checks that sample by sample. The slow tier therefore gives each draft kind its
own seeds, so that its three tests are independent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from spec_drafters import ModelDrafts
from stats_fixtures import chi_square_p
from transformers import AutoModelForCausalLM

from srt_agent.contracts.generation import GenerationRequest, SamplingParams
from srt_agent.engine.sampling import RowParams, processed_logprobs
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.speed.random_model import save_random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


V = 8
PROMPT = (3, 1, 4, 1)
WINDOW = 3  # tokens whose joint distribution is tested
MAX_NEW = 6  # generation runs on past the window, so verified trees reach deeper


def save_exact_model(path: Path) -> Path:
    """The small-vocabulary random model whose exact distribution the tests enumerate."""
    return save_random_model(
        path,
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        init_std=0.25,
        seed=4,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_exact_model(tmp_path_factory.mktemp("exact"))


def _conditionals(model_dir: Path, params: SamplingParams) -> dict[tuple[int, ...], torch.Tensor]:
    """Processed next-token distribution after every continuation of up to WINDOW tokens."""
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    grid = torch.cartesian_prod(*[torch.arange(V)] * WINDOW)  # (V^3, 3)
    ids = torch.cat([torch.tensor(PROMPT).expand(len(grid), -1), grid], dim=1)
    with torch.no_grad():
        logits = hf(ids).logits[:, len(PROMPT) - 1 :]  # (V^3, WINDOW + 1, V)
    rows = RowParams.build([params] * len(grid), V, torch.device("cpu"))
    probs = processed_logprobs(logits, rows).exp()
    table: dict[tuple[int, ...], torch.Tensor] = {}
    for i, cont in enumerate(grid.tolist()):
        for k in range(WINDOW + 1):
            table.setdefault(tuple(cont[:k]), probs[i, k])
    return table


def _joint(table: dict[tuple[int, ...], torch.Tensor]) -> dict[tuple[int, ...], float]:
    joint = {(): 1.0}
    for _ in range(WINDOW):
        joint = {(*c, t): p * float(table[c][t]) for c, p in joint.items() for t in range(V)}
    return joint


def _sample(
    model_dir: Path,
    params: SamplingParams,
    modes: Sequence[str],
    n: int,
    first_seed: int = 1000,
    device: str = "cpu",
    draws: str = "auto",
    **engine: Any,
) -> tuple[dict[str, Counter[tuple[int, ...]]], dict[tuple[int, ...], float], float]:
    table = _conditionals(model_dir, params)

    def dist(context: tuple[int, ...]) -> list[float] | None:
        probs = table.get(context)
        return probs.tolist() if probs is not None else None

    drafter = ModelDrafts(dist, V, seed=1)
    spec = SpecConfig(adaptive=False, max_draft_tokens=5, max_batch_tokens=512 * 6, draws=draws)
    requests = [
        GenerationRequest(
            f"r{i}",
            PROMPT,
            SamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                max_new_tokens=MAX_NEW,
                seed=first_seed + i,
            ),
            task_id=modes[i % len(modes)],
        )
        for i in range(n)
    ]
    with TorchEngine(
        model_dir, max_batch_size=512, draft_source=drafter, spec=spec, device=device, **engine
    ) as engine:
        outs = engine.generate(requests)
        stats = engine.spec_stats()
    counts: dict[str, Counter[tuple[int, ...]]] = {m: Counter() for m in modes}
    for req, out in zip(requests, outs, strict=True):
        assert len(out.token_ids) == MAX_NEW
        counts[req.task_id][tuple(out.token_ids[:WINDOW])] += 1
    return counts, _joint(table), stats.tokens_per_forward


CASES = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7-top_p0.9": SamplingParams(temperature=0.7, top_p=0.9),
}


FAST_SAMPLES = 4_000  # the default tier; the slow tier draws 10k per draft kind


@pytest.mark.parametrize("draws", ["walk", "all", "static"])
@pytest.mark.parametrize("case", CASES)
def test_speculative_samples_follow_the_exact_distribution(model_dir: Path, case: str, draws: str) -> None:
    # "static": the static-shape steps that CUDA graphs capture, run eagerly on this CPU.
    modes = ("good", "bad", "partial")
    kw: dict[str, Any] = {"cuda_graphs": True} if draws == "static" else {"draws": draws}
    counts, joint, tokens_per_forward = _sample(model_dir, CASES[case], modes, FAST_SAMPLES, **kw)
    total = sum(counts.values(), Counter())
    p_value = chi_square_p(total, joint, FAST_SAMPLES)
    print(f"{case} ({draws}): p = {p_value:.3f}, tokens/forward = {tokens_per_forward:.2f}")
    assert p_value > 0.01
    assert tokens_per_forward > 1.15  # the good drafts were verified and accepted


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["good", "bad", "partial"])
def test_speculative_samples_follow_the_exact_distribution_per_draft_kind(
    model_dir: Path, case: str, mode: str
) -> None:
    # Seeded outputs do not depend on the drafts (see srt_agent.engine.speculation.verify), so each draft kind
    # gets its own seeds: three independent samples, not one sample drafted three ways.
    first_seed = {"good": 10**6, "bad": 2 * 10**6, "partial": 3 * 10**6}[mode]
    counts, joint, _ = _sample(model_dir, CASES[case], (mode,), 10_000, first_seed)
    p_value = chi_square_p(counts[mode], joint, 10_000)
    print(f"{case}/{mode}: p = {p_value:.3f}")
    assert p_value > 0.01
