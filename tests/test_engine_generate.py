"""TorchEngine generation: HF parity, logprobs, seeds, stops, limits, failures, weight updates."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from srt_agent.engine import Engine, GenerationRequest, PromptTooLongError, SamplingParams
from srt_agent.engine.hf_checkpoint import CheckpointError
from srt_agent.engine.sampling import RowParams, processed_logprobs
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.speed.random_model import char_tokenizer, save_random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


VOCAB = 96


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_model(tmp_path_factory.mktemp("gen"), seed=2, init_std=0.15)


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[TorchEngine]:
    eng = TorchEngine(model_dir, tokenizer=char_tokenizer(VOCAB), max_batch_size=4, seed=0)
    yield eng
    eng.close()


def _prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


def _req(rid: str, prompt: tuple[int, ...], **params: Any) -> GenerationRequest:
    return GenerationRequest(rid, prompt, SamplingParams(**params))


def test_engine_satisfies_protocol(engine: TorchEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.max_context == 256


def test_greedy_equals_hf_generate(engine: TorchEngine, hf: Any) -> None:
    prompts = [_prompt(i, n) for i, n in enumerate((3, 12, 7, 20, 5))]  # 5 requests > 4 rows
    outs = engine.generate(
        [_req(f"g{i}", p, temperature=0.0, max_new_tokens=24) for i, p in enumerate(prompts)]
    )
    for p, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([p])
        ref = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),  # else HF infers padding from pad_token_id in the prompt
            max_new_tokens=24,
            min_new_tokens=24,
            do_sample=False,
            pad_token_id=0,
        )[0, len(p) :].tolist()
        assert list(out.token_ids) == ref
        assert out.finish_reason == "length"
        assert out.forward_passes == 24  # the prefill forward (first token) plus 23 decode forwards


def test_sampled_logprobs_equal_teacher_forced(engine: TorchEngine, hf: Any) -> None:
    cases = [
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=30, seed=1),
        SamplingParams(temperature=1.0, max_new_tokens=30, seed=2),
        SamplingParams(temperature=0.0, top_p=0.5, max_new_tokens=30),
    ]
    prompt = _prompt(7, 9)
    outs = engine.generate([GenerationRequest(f"t{i}", prompt, p) for i, p in enumerate(cases)])
    for params, out in zip(cases, outs, strict=True):
        ids = list(prompt) + list(out.token_ids)
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, len(prompt) - 1 : -1]  # (n, V)
        rows = RowParams.build([params] * len(out.token_ids), VOCAB, torch.device("cpu"))
        ref = processed_logprobs(logits, rows).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
        assert (torch.tensor(out.logprobs) - ref).abs().max().item() <= 1e-4
        assert len(out.logprobs) == len(out.token_ids) == 30


def test_seed_result_independent_of_batch_composition(engine: TorchEngine) -> None:
    target = _req("x", _prompt(1, 6), temperature=1.0, top_p=0.95, seed=42, max_new_tokens=25)
    solo = engine.generate([target])[0]
    others = [
        _req(f"o{i}", _prompt(10 + i, 4 + 3 * i), temperature=0.9, seed=i, max_new_tokens=5 + 7 * i)
        for i in range(5)
    ]
    mixed = engine.generate([*others[:2], target, *others[2:]])[2]
    assert mixed.token_ids == solo.token_ids
    assert max(abs(a - b) for a, b in zip(mixed.logprobs, solo.logprobs, strict=True)) < 1e-4
    different_seed = engine.generate(
        [_req("x", target.prompt_ids, temperature=1.0, top_p=0.95, seed=43, max_new_tokens=25)]
    )
    assert different_seed[0].token_ids != solo.token_ids


def test_continuous_batching_many_concurrent_agenerate(engine: TorchEngine, model_dir: Path) -> None:
    import asyncio

    reqs = [
        _req(
            f"c{i}",
            _prompt(100 + i, 2 + (5 * i) % 17),
            temperature=1.0,
            seed=i,
            max_new_tokens=3 + (7 * i) % 29,
        )
        for i in range(12)
    ]
    solo = {r.request_id: engine.generate([r])[0] for r in reqs}

    async def staggered(eng: TorchEngine) -> list[Any]:
        tasks = []
        for i, r in enumerate(reqs):
            tasks.append(asyncio.create_task(eng.agenerate(r)))
            if i >= 5:
                await asyncio.sleep(0.002)  # later requests arrive while earlier ones decode
        return list(await asyncio.gather(*tasks))

    with TorchEngine(model_dir, max_batch_size=4) as eng:
        outs = asyncio.run(staggered(eng))
        stats = eng.stats()
    for r, out in zip(reqs, outs, strict=True):
        assert out.request_id == r.request_id
        assert out.token_ids == solo[r.request_id].token_ids  # same seed: same tokens as alone
        assert len(out.token_ids) == r.params.max_new_tokens
    # 12 requests through 4 rows: the batch was full, sequences joined it while others decoded,
    # and rows were shared (far fewer decode steps than tokens).
    assert stats.peak_batch == 4
    assert stats.joined_running >= 6
    assert stats.decode_steps < sum(len(o.token_ids) for o in outs) / 2
    assert (stats.running, stats.waiting, stats.in_flight) == (0, 0, 0)


def test_idle_worker_does_not_spin(engine: TorchEngine) -> None:
    engine.generate([_req("warm", (1, 2), max_new_tokens=2)])  # the worker exists and is idle
    start = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - start < 0.05


def test_stop_token_and_max_new_tokens(engine: TorchEngine) -> None:
    prompt = _prompt(3, 5)
    free = engine.generate([_req("f", prompt, temperature=0.0, max_new_tokens=20)])[0]
    stop_tok = free.token_ids[6]
    first = free.token_ids.index(stop_tok)
    out = engine.generate(
        [_req("s", prompt, temperature=0.0, max_new_tokens=20, stop_token_ids=(stop_tok,))]
    )[0]
    assert out.token_ids == free.token_ids[: first + 1]
    assert (out.finish_reason, out.stop) == ("stop", stop_tok)
    short = engine.generate([_req("m", prompt, temperature=0.0, max_new_tokens=4)])[0]
    assert short.token_ids == free.token_ids[:4] and short.finish_reason == "length" and short.stop is None


def test_stop_strings(engine: TorchEngine) -> None:
    tok = engine.tokenizer
    assert tok is not None
    prompt = _prompt(4, 5)
    free = engine.generate([_req("f", prompt, temperature=0.0, max_new_tokens=30)])[0]
    text = tok.decode(list(free.token_ids[5:8]))
    assert isinstance(text, str)
    cut = next(j for j in range(1, 31) if text in str(tok.decode(list(free.token_ids[:j]))))
    out = engine.generate(
        [_req("s", prompt, temperature=0.0, max_new_tokens=30, stop_strings=("never-there", text))]
    )[0]
    assert out.token_ids == free.token_ids[:cut]
    assert (out.finish_reason, out.stop) == ("stop", text)


def test_stop_strings_without_tokenizer_abort(model_dir: Path) -> None:
    with TorchEngine(model_dir) as eng:  # the dir has no tokenizer files
        assert eng.tokenizer is None
        out = eng.generate([_req("s", (1, 2), stop_strings=("x",))])[0]
    assert out.finish_reason == "abort" and out.error is not None and "tokenizer" in out.error


def test_context_limit_and_prompt_too_long(model_dir: Path) -> None:
    with TorchEngine(model_dir, max_context=40) as eng:
        out = eng.generate([_req("a", _prompt(5, 35), temperature=0.0, max_new_tokens=100)])[0]
        assert len(out.token_ids) == 5 and out.finish_reason == "length"
        one = eng.generate([_req("b", _prompt(5, 39), max_new_tokens=100)])[0]
        assert len(one.token_ids) == 1 and one.finish_reason == "length"
        with pytest.raises(PromptTooLongError, match="max_context=40"):
            eng.generate([_req("c", _prompt(5, 40))])
        import asyncio

        with pytest.raises(PromptTooLongError, match="'d'"):
            asyncio.run(eng.agenerate(_req("d", _prompt(5, 41))))


def test_bad_request_aborts_alone(engine: TorchEngine) -> None:
    good = [_req(f"ok{i}", _prompt(20 + i, 6), temperature=0.0, max_new_tokens=8) for i in range(2)]
    bad = _req("bad", (1, VOCAB + 5, 2), max_new_tokens=8)
    outs = engine.generate([good[0], bad, good[1]])
    assert outs[1].finish_reason == "abort"
    assert outs[1].error is not None and str(VOCAB + 5) in outs[1].error and outs[1].token_ids == ()
    for g, out in zip(good, (outs[0], outs[2]), strict=True):
        assert out.finish_reason == "length" and out.token_ids == engine.generate([g])[0].token_ids


def test_runtime_failure_in_one_request_is_isolated(model_dir: Path) -> None:
    class FlakyTokenizer:
        def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
            if len(token_ids) >= 3:
                raise RuntimeError("boom")
            return "ab"

    with TorchEngine(model_dir, tokenizer=FlakyTokenizer()) as eng:
        outs = eng.generate(
            [
                _req("a", (1, 2, 3), temperature=0.0, max_new_tokens=10),
                _req("b", (4, 5), temperature=0.0, max_new_tokens=10, stop_strings=("zz",)),
                _req("c", (6,), temperature=0.0, max_new_tokens=10),
            ]
        )
    assert [o.finish_reason for o in outs] == ["length", "abort", "length"]
    assert outs[1].error is not None and "boom" in outs[1].error and len(outs[1].token_ids) == 3
    assert len(outs[0].token_ids) == len(outs[2].token_ids) == 10


def test_duplicate_ids_rejected(engine: TorchEngine) -> None:
    with pytest.raises(ValueError, match="unique"):
        engine.generate([_req("same", (1,)), _req("same", (2,))])


def test_update_weights(model_dir: Path, tmp_path: Path) -> None:
    other = save_random_model(tmp_path / "other", seed=9, init_std=0.15)
    new_state = AutoModelForCausalLM.from_pretrained(str(other), dtype=torch.float32).state_dict()
    req = _req("u", _prompt(8, 6), temperature=0.0, max_new_tokens=12)
    with TorchEngine(model_dir) as eng, TorchEngine(other) as ref:
        before = eng.generate([req])[0]
        eng.update_weights(new_state)
        after = eng.generate([req])[0]
        expected = ref.generate([req])[0]
        assert after.token_ids == expected.token_ids != before.token_ids
        with pytest.raises(CheckpointError, match="unknown parameter names"):
            eng.update_weights({"model.layers.0.attn.q.weight": torch.zeros(1)})
        with pytest.raises(CheckpointError, match="has shape"):
            eng.update_weights({"model.norm.weight": torch.zeros(3)})
        assert eng.generate([req])[0].token_ids == expected.token_ids  # a rejected update changes nothing


def test_closed_engine_refuses_work(model_dir: Path) -> None:
    eng = TorchEngine(model_dir)
    eng.close()
    with pytest.raises(RuntimeError, match="closed"):
        eng.generate([_req("z", (1,))])


def test_cancelled_agenerate_frees_its_row(model_dir: Path) -> None:
    import asyncio

    async def scenario(eng: TorchEngine) -> tuple[bool, Any]:
        long = asyncio.create_task(eng.agenerate(_req("long", (1, 2, 3), max_new_tokens=200, seed=1)))
        await asyncio.sleep(0.05)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        # The only row is free again: a new request still runs to completion.
        return long.cancelled(), await eng.agenerate(_req("next", (4, 5), max_new_tokens=3, seed=2))

    with TorchEngine(model_dir, max_batch_size=1) as eng:
        cancelled, out = asyncio.run(scenario(eng))
        assert cancelled and len(out.token_ids) == 3
        stats = eng.stats()
        assert (stats.running, stats.waiting, stats.in_flight) == (0, 0, 0)


def test_tokenizer_loaded_from_model_dir(tmp_path: Path) -> None:
    path = save_random_model(tmp_path / "with-tok", seed=2, init_std=0.15)
    char_tokenizer(VOCAB).save_pretrained(str(path))
    with TorchEngine(path) as eng:
        assert eng.tokenizer is not None
        free = eng.generate([_req("f", (1, 2, 3), temperature=0.0, max_new_tokens=10)])[0]
        text = str(eng.tokenizer.decode(list(free.token_ids[2:4])))
        out = eng.generate([_req("s", (1, 2, 3), temperature=0.0, max_new_tokens=10, stop_strings=(text,))])[
            0
        ]
        assert out.finish_reason == "stop" and len(out.token_ids) <= 4


def test_close_aborts_requests_in_flight(model_dir: Path) -> None:
    import asyncio

    from srt_agent.engine import TorchEngine as LazyTorchEngine  # the package's lazy export

    async def scenario() -> list[Any]:
        eng = LazyTorchEngine(model_dir, max_batch_size=2)
        tasks = [
            asyncio.create_task(eng.agenerate(_req(f"r{i}", (1, 2), max_new_tokens=250))) for i in range(4)
        ]
        await asyncio.sleep(0.05)
        await asyncio.to_thread(eng.close)
        return list(await asyncio.gather(*tasks))

    outs = asyncio.run(scenario())
    assert all(o.finish_reason in ("abort", "length") for o in outs)
    aborted = [o for o in outs if o.finish_reason == "abort"]
    assert aborted and all(o.error == "engine closed" for o in aborted)
