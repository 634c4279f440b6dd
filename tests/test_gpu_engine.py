"""The engine's exactness on a CUDA GPU (marked ``gpu``: run with ``pytest -m gpu`` on a GPU machine).

The CPU tests prove exactness on CPU kernels; these repeat the claims that depend on the device's
kernels: recorded logprobs equal a teacher-forced HF forward on the same GPU (float32, <= 1e-4),
greedy decoding gives identical tokens with and without speculation, and speculative samples follow
the exact distribution (chi-square over 10k samples per sampling setting, good/bad/partial drafts).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from spec_drafters import NoisyReplay
from stats_fixtures import chi_square_p
from test_engine_spec import ALWAYS, REQUESTS, VOCAB, _book, _spec_engine
from test_engine_spec_exact import CASES, _sample, save_exact_model
from transformers import AutoModelForCausalLM

from srt_agent.bench.random_model import char_tokenizer, save_random_model
from srt_agent.engine.sampling import RowParams, processed_logprobs
from srt_agent.engine.torch_engine import TorchEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = "cuda"


@pytest.fixture(scope="module")
def spec_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_model(tmp_path_factory.mktemp("gpu-spec"), seed=2, init_std=0.15)


@pytest.fixture(scope="module")
def exact_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_exact_model(tmp_path_factory.mktemp("gpu-exact"))


@pytest.mark.parametrize("draws", ["walk", "all"])
def test_cuda_logprobs_equal_hf_teacher_forced_with_and_without_speculation(
    spec_model: Path, draws: str
) -> None:
    hf = AutoModelForCausalLM.from_pretrained(str(spec_model), dtype=torch.float32).to(CUDA)
    with TorchEngine(spec_model, tokenizer=char_tokenizer(VOCAB), max_batch_size=8, device=CUDA) as plain:
        ref = plain.generate(REQUESTS)
    source = NoisyReplay(_book(ref), VOCAB, seed=5, corrupt=0.3)
    spec = ALWAYS.model_copy(update={"draws": draws})
    with _spec_engine(spec_model, source, spec=spec, device=CUDA) as eng:
        outs = eng.generate(REQUESTS)
        stats = eng.spec_stats()
    assert 0 < stats.nodes_accepted < stats.nodes_drafted
    for req, r, o in zip(REQUESTS, ref, outs, strict=True):
        if req.params.temperature == 0:
            assert o.token_ids == r.token_ids, req.request_id  # greedy: identical with speculation
        for out in (r, o):
            ids = list(req.prompt_ids) + list(out.token_ids)
            with torch.no_grad():
                logits = hf(torch.tensor([ids], device=CUDA)).logits[0, len(req.prompt_ids) - 1 : -1]
            rows = RowParams.build([req.params] * len(out.token_ids), VOCAB, torch.device(CUDA))
            tokens = torch.tensor(out.token_ids, device=CUDA)[:, None]
            want = processed_logprobs(logits, rows).gather(-1, tokens)[:, 0].cpu()
            assert (torch.tensor(out.logprobs) - want).abs().max().item() <= 1e-4, req.request_id


@pytest.mark.parametrize("draws", ["walk", "all"])
@pytest.mark.parametrize("case", CASES)
def test_cuda_speculative_samples_follow_the_exact_distribution(
    exact_model: Path, case: str, draws: str
) -> None:
    n = 10_000
    counts, joint, tokens_per_forward = _sample(
        exact_model, CASES[case], ("good", "bad", "partial"), n, device=CUDA, draws=draws
    )
    p_value = chi_square_p(sum(counts.values(), Counter()), joint, n)
    print(f"cuda {case} ({draws}): p = {p_value:.3f}, tokens/forward = {tokens_per_forward:.2f}")
    assert p_value > 0.01
    assert tokens_per_forward > 1.15
