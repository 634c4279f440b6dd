"""The engine's exactness on a CUDA GPU (marked ``gpu``: run with ``pytest -m gpu`` on a GPU machine).

The CPU tests prove exactness on CPU kernels; these repeat the claims that depend on the device's
kernels: recorded logprobs equal a teacher-forced HF forward on the same GPU (float32, <= 1e-4; the
bfloat16 default within a stated tolerance), greedy decoding gives identical tokens with and without
speculation, and speculative samples follow the exact distribution (chi-square over 10k samples per
sampling setting, good/bad/partial drafts), on each verify path: the eager ones (draws by walk, or at
every position) and CUDA graph replays, which must survive weight updates.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from spec_drafters import NoisyReplay
from stats_fixtures import chi_square_p
from test_constrained_decoding import END, OPEN, check_masked_sampling
from test_engine_spec import ALWAYS, REQUESTS, VOCAB, _book, _spec_engine
from test_engine_spec_exact import CASES, _sample, save_exact_model
from transformers import AutoModelForCausalLM

from srt_agent.engine.hf_checkpoint import read_state_dict
from srt_agent.engine.sampling import RowParams, processed_logprobs
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.speed.random_model import char_tokenizer, save_random_model

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


MODES = {  # verify path -> engine options (float32: these tests compare with a float32 reference)
    "walk": {"cuda_graphs": False, "draws": "walk"},
    "all": {"cuda_graphs": False, "draws": "all"},
    "graphs": {"cuda_graphs": True, "draws": "auto"},
}


def _teacher_errors(hf: Any, requests: Any, outs: Any) -> list[float]:
    """|recorded - teacher-forced| logprob of every generated token (HF float32 on the GPU)."""
    errors: list[float] = []
    for req, out in zip(requests, outs, strict=True):
        ids = list(req.prompt_ids) + list(out.token_ids)
        with torch.no_grad():
            logits = hf(torch.tensor([ids], device=CUDA)).logits[0, len(req.prompt_ids) - 1 : -1]
        rows = RowParams.build([req.params] * len(out.token_ids), VOCAB, torch.device(CUDA))
        tokens = torch.tensor(out.token_ids, device=CUDA)[:, None]
        want = processed_logprobs(logits, rows).gather(-1, tokens)[:, 0].cpu()
        errors += (torch.tensor(out.logprobs) - want).abs().tolist()
    return errors


@pytest.mark.parametrize("mode", MODES)
def test_cuda_logprobs_equal_hf_teacher_forced_with_and_without_speculation(
    spec_model: Path, mode: str
) -> None:
    options = MODES[mode]
    hf = AutoModelForCausalLM.from_pretrained(str(spec_model), dtype=torch.float32).to(CUDA)
    with TorchEngine(
        spec_model,
        tokenizer=char_tokenizer(VOCAB),
        max_batch_size=8,
        device=CUDA,
        dtype=torch.float32,
        cuda_graphs=options["cuda_graphs"],
    ) as plain:
        ref = plain.generate(REQUESTS)
        plain_stats = plain.stats()
    source = NoisyReplay(_book(ref), VOCAB, seed=5, corrupt=0.3)
    spec = ALWAYS.model_copy(update={"draws": options["draws"]})
    with _spec_engine(
        spec_model, source, spec=spec, device=CUDA, dtype=torch.float32, cuda_graphs=options["cuda_graphs"]
    ) as eng:
        outs = eng.generate(REQUESTS)
        stats = eng.spec_stats()
        engine_stats = eng.stats()
    assert 0 < stats.nodes_accepted < stats.nodes_drafted
    if options["cuda_graphs"]:  # the steps really ran as graph replays
        for st in (plain_stats, engine_stats):
            assert st.graph_error is None and st.graph_shapes > 0
            assert st.graph_replays == st.decode_steps and st.static_eager_steps == 0
            assert st.static_prefills == st.prefill_forwards == st.static_prefill_replays  # graphs too
    for req, r, o in zip(REQUESTS, ref, outs, strict=True):
        if req.params.temperature == 0:
            assert o.token_ids == r.token_ids, req.request_id  # greedy: identical with speculation
    errors = _teacher_errors(hf, REQUESTS, ref) + _teacher_errors(hf, REQUESTS, outs)
    print(f"cuda {mode} float32: max |logprob - teacher| = {max(errors):.2e}")
    assert max(errors) <= 1e-4


def test_cuda_bf16_logprobs_within_the_stated_tolerance_of_a_float32_teacher(spec_model: Path) -> None:
    """The GPU default (bfloat16, CUDA graphs): recorded logprobs against HF float32, teacher-forced.

    Stated tolerance: mean |difference| <= 0.05 nats and max <= 0.5 over every generated token
    (bfloat16 keeps 8 bits of mantissa: logits of magnitude ~10 move by a few hundredths).
    """
    # Unfiltered requests only: under top-k/top-p a token near the cut can be kept by one
    # precision and dropped by the other, an infinite difference that says nothing of accuracy.
    requests = [r for r in REQUESTS if r.params.top_k == 0 and r.params.top_p == 1.0]
    hf = AutoModelForCausalLM.from_pretrained(str(spec_model), dtype=torch.float32).to(CUDA)
    with TorchEngine(spec_model, tokenizer=char_tokenizer(VOCAB), max_batch_size=8, device=CUDA) as plain:
        assert plain.model.dtype == torch.bfloat16 and plain.graphs is not None
        ref = plain.generate(requests)
    source = NoisyReplay(_book(ref), VOCAB, seed=5, corrupt=0.3)
    with _spec_engine(spec_model, source, device=CUDA) as eng:
        outs = eng.generate(requests)
    errors = _teacher_errors(hf, requests, ref) + _teacher_errors(hf, requests, outs)
    mean = sum(errors) / len(errors)
    print(f"cuda bf16 + graphs: mean |logprob - teacher| = {mean:.4f}, max = {max(errors):.4f}")
    assert mean <= 0.05
    assert max(errors) <= 0.5


def test_cuda_graphs_survive_weight_updates(spec_model: Path, tmp_path: Path) -> None:
    other = save_random_model(tmp_path / "other", seed=9, init_std=0.15)
    kw: dict[str, Any] = {"tokenizer": char_tokenizer(VOCAB), "max_batch_size": 8, "device": CUDA}
    with TorchEngine(other, dtype=torch.float32, **kw) as fresh:
        want = fresh.generate(REQUESTS)
    with TorchEngine(spec_model, dtype=torch.float32, **kw) as eng:
        eng.generate(REQUESTS)  # captures the shapes with the old weights
        eng.update_weights(read_state_dict(other))
        got = eng.generate(REQUESTS)
        assert eng.stats().graph_error is None
    for w, g in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids, w.request_id


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_cuda_speculative_samples_follow_the_exact_distribution(
    exact_model: Path, case: str, mode: str
) -> None:
    n = 10_000
    counts, joint, tokens_per_forward = _sample(
        exact_model,
        CASES[case],
        ("good", "bad", "partial"),
        n,
        device=CUDA,
        dtype=torch.float32,
        **MODES[mode],
    )
    p_value = chi_square_p(sum(counts.values(), Counter()), joint, n)
    print(f"cuda {case} ({mode}): p = {p_value:.3f}, tokens/forward = {tokens_per_forward:.2f}")
    assert p_value > 0.01
    assert tokens_per_forward > 1.15


@pytest.mark.parametrize("prompt", [(END, 5, 3), (END, OPEN)])
def test_constrained_tool_calls_are_exact_on_cuda(tmp_path: Path, prompt: tuple[int, ...]) -> None:
    # Static steps (CUDA graphs), masked ones inside blocks (captured when first met: no warm-up
    # here), float32 so that the recorded logprobs can be held to 1e-4.
    model_dir = save_exact_model(tmp_path)
    drafts = "masked" if prompt[-1] == OPEN else "raw"
    check_masked_sampling(
        model_dir, prompt, 1.0, device=CUDA, dtype=torch.float32, cuda_graphs=True, drafts=drafts
    )
