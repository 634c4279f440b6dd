"""Prefix reuse: parked keys/values of ended sequences give the same outputs as a full prefill."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams
from srt_agent.engine.prefix_cache import BLOCK, PrefixStore
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.speed.random_model import save_random_model

VOCAB = 96


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_model(tmp_path_factory.mktemp("prefix"), seed=3, init_std=0.15)


def _prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


def _conversation(engine: TorchEngine) -> list[GenerationOutput]:
    """Three turns: each prompt is the last prompt, its output and a new 'observation'."""
    prompt, outs = _prompt(0, 70), []
    for turn in range(3):
        params = SamplingParams(temperature=0.0 if turn != 1 else 1.0, max_new_tokens=12, seed=turn)
        [out] = engine.generate([GenerationRequest(f"turn{turn}", prompt, params)])
        outs.append(out)
        prompt = prompt + out.token_ids + _prompt(10 + turn, 9)
    return outs


def test_next_turns_reuse_the_previous_turn_and_match_a_full_prefill(model_dir: Path) -> None:
    with TorchEngine(model_dir, prefix_cache_bytes=0) as plain, TorchEngine(model_dir) as reuse:
        ref, got = _conversation(plain), _conversation(reuse)
        stats = reuse.stats()
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    for a, b in zip(got, ref, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # Turns 1 and 2 copied the previous turn's prompt and tokens instead of recomputing them.
    assert stats.prefix_hits == 2 and stats.prefix_tokens_reused >= 70 + 11 + 81 + 11


def test_samples_admitted_together_prefill_their_shared_prompt_once(model_dir: Path) -> None:
    prompt = _prompt(1, 50)
    reqs = [
        GenerationRequest(f"s{i}", prompt, SamplingParams(temperature=1.0, max_new_tokens=10, seed=i))
        for i in range(4)
    ]
    with TorchEngine(model_dir, prefix_cache_bytes=0) as plain, TorchEngine(model_dir) as reuse:
        ref, got = plain.generate(reqs), reuse.generate(reqs)
        stats = reuse.stats()
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert stats.prefix_hits == 3 and stats.prefix_tokens_reused == 3 * 49


def test_weight_updates_drop_parked_prefixes(model_dir: Path) -> None:
    with TorchEngine(model_dir) as engine:
        first = _conversation(engine)
        assert engine.stats().prefix_hits == 2
        engine.update_weights({"model.norm.weight": torch.full((64,), 1.5)})
        hits = engine.stats().prefix_hits
        [out] = engine.generate(
            [
                GenerationRequest(
                    "after", _prompt(0, 70) + first[0].token_ids + _prompt(10, 9), SamplingParams()
                )
            ]
        )
        assert engine.stats().prefix_hits == hits and out.finish_reason == "length"


def test_store_lookup_budget_and_collisions() -> None:
    from srt_agent.engine.kv_cache import KVCache

    cache = KVCache(1, 1, 2, 2, 256, initial_rows=2, initial_positions=256)
    cache.data.normal_()
    store = PrefixStore(budget_bytes=cache.data[:, :, 0, :, :100].numel() * 4 * 2 + 1)  # two entries of 100
    a = _prompt(2, 100)
    store.park(a, cache, 0)
    assert len(store) == 1 and store.lookup(a[:BLOCK]) is None  # too short to reuse
    hit = store.lookup((*a[:60], (a[60] + 1) % VOCAB, 2, 3))
    assert hit is not None and hit.length == 60
    assert torch.equal(hit.kv[:, :, :, :60], cache.data[:, :, 0, :, :60])
    full = store.lookup(a)
    assert full is not None and full.length == 99  # the last prompt token is always computed
    store.park(a + _prompt(3, 20), cache, 1)  # extends the first entry: replaces it
    assert len(store) == 1
    store.park(_prompt(4, 100), cache, 0)
    store.park(_prompt(5, 100), cache, 1)  # over budget: the least recently used goes
    assert len(store) == 2 and store.bytes <= store.budget_bytes
    assert store.lookup(_prompt(6, 100)) is None
    store.clear()
    assert len(store) == 0 and store.bytes == 0
    with pytest.raises(ValueError, match="budget"):
        PrefixStore(-1)


@pytest.mark.parametrize("static", [False, True])
def test_a_long_reused_prefix_and_a_long_new_prompt_prefill_apart(model_dir: Path, static: bool) -> None:
    # Admitted together, a next turn (long reused prefix, short new part) and a fresh long prompt
    # would pad to reused + new > the context: they must prefill in separate forwards, not abort.
    first = _prompt(4, 180)
    with TorchEngine(model_dir, max_context=256, cuda_graphs=static) as eng:
        [out] = eng.generate(
            [GenerationRequest("t0", first, SamplingParams(temperature=0.0, max_new_tokens=8))]
        )
        params = SamplingParams(temperature=0.0, max_new_tokens=8)
        reqs = [
            GenerationRequest("next", first + out.token_ids + _prompt(5, 4), params),
            GenerationRequest("fresh", _prompt(6, 200), params),
        ]
        got = eng.generate(reqs)
        assert eng.stats().prefix_hits == 1
    assert [o.finish_reason for o in got] == ["length", "length"], [o.error for o in got]
    with TorchEngine(model_dir, max_context=256, prefix_cache_bytes=0) as plain:
        assert [o.token_ids for o in plain.generate(reqs)] == [o.token_ids for o in got]
