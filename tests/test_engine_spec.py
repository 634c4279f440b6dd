"""TorchEngine with speculation: same outputs as plain decoding, correct logprobs, stops, batching."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from spec_drafters import NoisyReplay, RandomDrafts, Recorder, Replay
from transformers import AutoModelForCausalLM

from srt_agent.contracts.draft import DraftTree
from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams
from srt_agent.engine.llama import CausalLM
from srt_agent.engine.sampling import RowParams, processed_logprobs
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.speed.random_model import char_tokenizer, save_random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


VOCAB = 96
ALWAYS = SpecConfig(adaptive=False)  # verify every draft whole: exercise the verifier, not the cost model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_model(tmp_path_factory.mktemp("spec"), seed=2, init_std=0.15)


@pytest.fixture(scope="module")
def plain(model_dir: Path) -> Iterator[TorchEngine]:
    eng = TorchEngine(model_dir, tokenizer=char_tokenizer(VOCAB), max_batch_size=8, seed=0)
    yield eng
    eng.close()


def _prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


def _req(rid: str, prompt: tuple[int, ...], **params: Any) -> GenerationRequest:
    return GenerationRequest(rid, prompt, SamplingParams(**params), task_id=rid)


def _book(outs: Sequence[GenerationOutput]) -> dict[str, tuple[int, ...]]:
    return {o.request_id: o.token_ids for o in outs}


def _spec_engine(model_dir: Path, source: Any, spec: SpecConfig = ALWAYS, **kw: Any) -> TorchEngine:
    kw.setdefault("max_batch_size", 8)
    return TorchEngine(model_dir, tokenizer=char_tokenizer(VOCAB), draft_source=source, spec=spec, **kw)


REQUESTS = [
    _req("greedy-a", _prompt(1, 5), temperature=0.0, max_new_tokens=40),
    _req("greedy-b", _prompt(2, 17), temperature=0.0, top_k=5, max_new_tokens=33),
    _req("t1", _prompt(3, 9), temperature=1.0, seed=11, max_new_tokens=40),
    _req("t07-topp", _prompt(4, 3), temperature=0.7, top_p=0.9, seed=12, max_new_tokens=37),
    _req("t13-topk-topp", _prompt(5, 12), temperature=1.3, top_k=20, top_p=0.95, seed=13, max_new_tokens=40),
]


@pytest.mark.parametrize("draws", ["walk", "all"])
@pytest.mark.parametrize("drafts", ["replay", "noisy", "random"])
def test_outputs_identical_with_and_without_speculation(
    model_dir: Path, plain: TorchEngine, drafts: str, draws: str
) -> None:
    """Greedy rows give identical tokens; seeded sampled rows do too, because the d-th token of a
    verify step uses the d-th uniform, as plain decoding would (up to float rounding of logits),
    whether the verifier draws along the walk or at every tree position."""
    ref = plain.generate(REQUESTS)
    source = {
        "replay": Replay(_book(ref)),
        "noisy": NoisyReplay(_book(ref), VOCAB, seed=3),
        "random": RandomDrafts(VOCAB, seed=4),
    }[drafts]
    with _spec_engine(model_dir, source, spec=ALWAYS.model_copy(update={"draws": draws})) as eng:
        outs = eng.generate(REQUESTS)
        stats = eng.spec_stats()
    for r, o in zip(ref, outs, strict=True):
        assert o.token_ids == r.token_ids, o.request_id
        assert max(abs(a - b) for a, b in zip(o.logprobs, r.logprobs, strict=True)) < 1e-4
        assert o.finish_reason == r.finish_reason == "length"
    assert stats.nodes_drafted > 100  # drafts really were verified
    tokens = sum(len(o.token_ids) for o in outs)
    if drafts == "replay":  # perfect drafts: up to 9 tokens per forward
        assert stats.acceptance_rate == 1.0 and all(o.forward_passes <= 7 for o in outs)
    if drafts == "noisy":
        assert 0 < stats.nodes_accepted < stats.nodes_drafted and stats.tokens_per_forward > 1.5
    if drafts == "random":  # nothing gained, nothing lost
        assert stats.nodes_accepted < 10 and sum(o.forward_passes for o in outs) > tokens - 10


@pytest.mark.parametrize("draws", ["walk", "all"])
def test_logprobs_equal_teacher_forced_forward_with_speculation(
    model_dir: Path, plain: TorchEngine, draws: str
) -> None:
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    sampled = REQUESTS[2:]
    # Corrupted trees around the true continuation: paths are accepted at varied depths and
    # positions in tree order (the KV cache keeps non-contiguous entries).
    with _spec_engine(
        model_dir,
        NoisyReplay(_book(plain.generate(sampled)), VOCAB, seed=5, corrupt=0.3),
        spec=ALWAYS.model_copy(update={"draws": draws}),
    ) as eng:
        outs = eng.generate(sampled)
        stats = eng.spec_stats()
    assert 0 < stats.nodes_accepted < stats.nodes_drafted and len(stats.acceptance_histogram) > 4
    for req, out in zip(sampled, outs, strict=True):
        ids = list(req.prompt_ids) + list(out.token_ids)
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, len(req.prompt_ids) - 1 : -1]  # (n, V)
        rows = RowParams.build([req.params] * len(out.token_ids), VOCAB, torch.device("cpu"))
        ref = processed_logprobs(logits, rows).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
        assert (torch.tensor(out.logprobs) - ref).abs().max().item() <= 1e-4


def test_continuous_batching_with_speculation(model_dir: Path, plain: TorchEngine) -> None:
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
    solo = {r.request_id: plain.generate([r])[0] for r in reqs}
    source = NoisyReplay({k: v.token_ids for k, v in solo.items()}, VOCAB, seed=6)

    async def staggered(eng: TorchEngine) -> list[GenerationOutput]:
        tasks = []
        for i, r in enumerate(reqs):
            tasks.append(asyncio.create_task(eng.agenerate(r)))
            if i >= 5:
                await asyncio.sleep(0.002)  # later requests arrive while earlier ones decode
        return list(await asyncio.gather(*tasks))

    with _spec_engine(model_dir, source, max_batch_size=4) as eng:
        outs = asyncio.run(staggered(eng))
        stats, spec = eng.stats(), eng.spec_stats()
    for r, out in zip(reqs, outs, strict=True):
        assert out.token_ids == solo[r.request_id].token_ids
    assert stats.peak_batch == 4 and stats.joined_running >= 4
    assert spec.nodes_accepted > 0 and spec.tokens_per_forward > 1.2
    assert (stats.running, stats.waiting, stats.in_flight) == (0, 0, 0)
    # Every stream was reported whole and finished once.
    assert source.streams == {r.request_id: list(solo[r.request_id].token_ids) for r in reqs}
    assert source.finished == {r.request_id for r in reqs}


def test_stop_token_inside_an_accepted_path(model_dir: Path, plain: TorchEngine) -> None:
    req = _req("s", _prompt(3, 5), temperature=0.0, max_new_tokens=30)
    free = plain.generate([req])[0]
    stop_tok = free.token_ids[5]
    first = free.token_ids.index(stop_tok)
    source = Replay({"s": free.token_ids})
    with _spec_engine(model_dir, source) as eng:
        out = eng.generate(
            [_req("s", req.prompt_ids, temperature=0.0, max_new_tokens=30, stop_token_ids=(stop_tok,))]
        )[0]
    assert out.token_ids == free.token_ids[: first + 1]
    assert (out.finish_reason, out.stop) == ("stop", stop_tok)
    assert out.forward_passes == 2  # the prefill, then one verify step whose accepted path went past the stop
    assert source.streams["s"] == list(out.token_ids) and source.finished == {"s"}


def test_next_turn_reuses_the_kept_path_of_the_verify_step_that_ended_a_turn(
    model_dir: Path, plain: TorchEngine
) -> None:
    """A turn that ends inside an accepted path parks that path too (compacted, capped at the stop),
    so the next turn prefills only its new tokens; both turns still match plain decoding."""
    p1 = _prompt(7, 40)
    free = plain.generate([_req("t1", p1, temperature=0.0, max_new_tokens=30)])[0]
    stop_tok = free.token_ids[5]
    turn1 = _req("t1", p1, temperature=0.0, max_new_tokens=30, stop_token_ids=(stop_tok,))
    ref1 = plain.generate([turn1])[0]
    turn2 = _req("t2", p1 + ref1.token_ids + _prompt(8, 9), temperature=1.0, seed=5, max_new_tokens=20)
    ref2 = plain.generate([turn2])[0]
    with _spec_engine(model_dir, Replay({"t1": free.token_ids, "t2": ref2.token_ids})) as eng:
        out1 = eng.generate([turn1])[0]
        before = eng.stats().prefix_tokens_reused
        out2 = eng.generate([turn2])[0]
        reused = eng.stats().prefix_tokens_reused - before
    assert out1.forward_passes == 2  # the prefill, then one verify step that ended the turn
    for out, ref in ((out1, ref1), (out2, ref2)):
        assert out.token_ids == ref.token_ids
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref.logprobs, strict=True)) < 1e-4
    assert reused == len(p1) + len(out1.token_ids)  # the stop token's key/value included


def test_stop_string_inside_an_accepted_path(model_dir: Path, plain: TorchEngine) -> None:
    tok = plain.tokenizer
    assert tok is not None
    req = _req("s", _prompt(4, 5), temperature=1.0, seed=3, max_new_tokens=30)
    free = plain.generate([req])[0]
    text = str(tok.decode(list(free.token_ids[3:5])))
    cut = next(j for j in range(1, 31) if text in str(tok.decode(list(free.token_ids[:j]))))
    with _spec_engine(model_dir, Replay({"s": free.token_ids})) as eng:
        out = eng.generate(
            [
                _req(
                    "s",
                    req.prompt_ids,
                    temperature=1.0,
                    seed=3,
                    max_new_tokens=30,
                    stop_strings=("zz!", text),
                )
            ]
        )[0]
    assert out.token_ids == free.token_ids[:cut] and (out.finish_reason, out.stop) == ("stop", text)
    assert out.logprobs == pytest.approx(free.logprobs[:cut], abs=1e-4)
    assert out.forward_passes == 2


def test_max_new_tokens_and_context_limit_cap_the_drafts(model_dir: Path, plain: TorchEngine) -> None:
    req = _req("m", _prompt(6, 35), temperature=0.0, max_new_tokens=60)
    free = plain.generate([req])[0]
    source = Replay({"m": free.token_ids, "n": free.token_ids})
    with _spec_engine(model_dir, source, max_context=41) as eng:
        short = eng.generate([_req("m", req.prompt_ids, temperature=0.0, max_new_tokens=4)])[0]
        at_limit = eng.generate([_req("n", req.prompt_ids, temperature=0.0, max_new_tokens=60)])[0]
    assert short.token_ids == free.token_ids[:4] and short.finish_reason == "length"
    assert at_limit.token_ids == free.token_ids[:6] and at_limit.finish_reason == "length"  # 35 + 6 = 41
    assert short.forward_passes == at_limit.forward_passes == 2  # prefill + one fully accepted verify
    # After the first token, 3 (then 5) tokens were left: drafts of 2 (then 4), never past the limit.
    assert source.asked == [2, 4]


def test_draft_source_hears_every_token_also_with_speculation_disabled(
    model_dir: Path, plain: TorchEngine
) -> None:
    reqs = REQUESTS[:3]
    ref = plain.generate(reqs)
    source = Replay(_book(ref))
    with _spec_engine(model_dir, source, spec=SpecConfig(enabled=False)) as eng:
        outs = eng.generate(reqs)
        stats = eng.spec_stats()
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert source.asked == [] and stats.nodes_drafted == 0
    assert source.streams == {o.request_id: list(o.token_ids) for o in outs}
    assert source.kinds == {o.request_id: "live" for o in outs} and source.finished == {
        o.request_id for o in outs
    }
    assert stats.tokens == stats.row_steps == sum(len(o.token_ids) for o in outs)


class _Broken(Recorder):
    def make(self, task_id: str, prompt: list[int], generated: list[int], budget: int) -> DraftTree:
        if len(generated) % 3 == 0:
            raise RuntimeError("cache corrupted")
        if len(generated) % 5 == 0:
            return DraftTree((VOCAB + 1,), (-1,), (1.0,), "global")  # would crash the forward
        if len(generated) % 3 == 1:
            return DraftTree(
                tuple(range(budget + 3)), tuple(range(-1, budget + 2)), (1.0,) * (budget + 3), "global"
            )
        return DraftTree((1,), (-1,), (1.0,), "global")

    def extend(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk full")


def test_a_failing_draft_source_never_fails_requests(model_dir: Path, plain: TorchEngine) -> None:
    reqs = REQUESTS[:3]
    ref = plain.generate(reqs)
    with _spec_engine(model_dir, _Broken()) as eng:
        outs = eng.generate(reqs)
        stats = eng.spec_stats()
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert stats.draft_errors > 10 and stats.nodes_drafted > 0  # too-large drafts were truncated, not dropped


def test_live_requests_preempt_runahead_ones(model_dir: Path) -> None:
    source = Recorder()

    async def scenario(eng: TorchEngine) -> list[GenerationOutput]:
        ahead = [
            asyncio.create_task(
                eng.agenerate(
                    GenerationRequest(
                        f"ra{i}", (1, 2, i), SamplingParams(max_new_tokens=250, seed=i), priority="runahead"
                    )
                )
            )
            for i in range(3)
        ]
        while (eng.stats().running, eng.stats().waiting) != (2, 1):  # ra0 and ra1 run, ra2 waits
            await asyncio.sleep(0.001)
        live = asyncio.create_task(eng.agenerate(_req("live", (4, 5), max_new_tokens=5, seed=9)))
        return list(await asyncio.gather(*ahead, live))

    free_rows = SpecConfig(enabled=False, runahead_slowdown=10)  # run-ahead takes every free row
    with _spec_engine(model_dir, source, spec=free_rows, max_batch_size=2) as eng:
        outs = asyncio.run(scenario(eng))
        stats = eng.spec_stats()
    by_id = {o.request_id: o for o in outs}
    assert by_id["live"].finish_reason == "length" and len(by_id["live"].token_ids) == 5
    # The newest running run-ahead request (ra1) gave its row to the live one, keeping its tokens;
    # the waiting ra2 was admitted only after the live request.
    assert by_id["ra1"].finish_reason == "preempted" and 0 < len(by_id["ra1"].token_ids) < 250
    assert by_id["ra0"].finish_reason == by_id["ra2"].finish_reason == "length"
    assert stats.preempted == 1
    assert source.kinds == {"ra0": "runahead", "ra1": "runahead", "ra2": "runahead", "live": "live"}
    assert source.streams["ra1"] == list(by_id["ra1"].token_ids) and "ra1" in source.finished


def test_spec_stats_snapshot_and_reset(model_dir: Path, plain: TorchEngine) -> None:
    ref = plain.generate(REQUESTS)

    class Flagged(Replay):
        def make(self, task_id: str, prompt: list[int], generated: list[int], budget: int) -> DraftTree:
            d = super().make(task_id, prompt, generated, budget)
            return DraftTree(
                d.token_ids, d.parents, d.probs, "exact", tuple(i % 2 == 0 for i in range(len(d)))
            )

    with _spec_engine(model_dir, Flagged(_book(ref))) as eng:
        outs = eng.generate(REQUESTS)
        stats = eng.spec_stats(reset=True)
        after = eng.spec_stats()
    tokens = sum(len(o.token_ids) for o in outs)
    assert stats.tokens == tokens and stats.row_steps == sum(o.forward_passes for o in outs)
    assert (
        stats.tokens_per_forward == pytest.approx(tokens / stats.row_steps) and stats.tokens_per_forward > 4
    )
    assert stats.prefill_forwards == 1 and stats.target_forwards == stats.verify_forwards >= 4
    assert sum(stats.acceptance_histogram) == stats.drafted_row_steps == stats.drafts_by_source["exact"]
    assert sum(k * n for k, n in enumerate(stats.acceptance_histogram)) == stats.nodes_accepted
    assert stats.nodes_accepted == stats.nodes_drafted and stats.mean_accepted > 4
    assert 0 < stats.runahead_nodes_accepted < stats.nodes_accepted
    assert stats.forward_s > 0 and stats.verify_s > 0 and stats.draft_s > 0
    assert after.tokens == 0 and after.acceptance_histogram == () and after.drafts_by_source == {}


class _SimulatedClock:
    """What the cost model reads instead of the wall clock: time passes only in forwards, at a
    fixed cost per forward plus a cost per token (a verify forward of 9 positions per row costs
    more than a decode step, as on a real machine), so its choices do not depend on machine load."""

    PER_FORWARD, PER_TOKEN = 2e-3, 2e-5

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = CausalLM.forward

        def forward(model: CausalLM, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            self.now += self.PER_FORWARD + self.PER_TOKEN * input_ids.numel()
            return real(model, input_ids, *args, **kwargs)

        monkeypatch.setattr(CausalLM, "forward", forward)


def test_cost_model_stops_verifying_useless_drafts_and_keeps_good_ones(
    model_dir: Path, plain: TorchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    reqs = [_req(f"a{i}", _prompt(40 + i, 6), temperature=1.0, seed=i, max_new_tokens=120) for i in range(2)]
    ref = plain.generate(reqs)
    clock = _SimulatedClock()
    clock.patch(monkeypatch)
    with _spec_engine(model_dir, RandomDrafts(VOCAB, seed=1), spec=SpecConfig(), cost_clock=clock) as eng:
        outs = eng.generate(reqs)
        useless = eng.spec_stats()
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    # A few steps to learn, then only probes (spaced so that a verify step's fixed extra costs at
    # most 2% of decode time): most steps decode plainly.
    assert useless.verify_forwards < useless.target_forwards / 3 and useless.probes >= 1
    with _spec_engine(model_dir, Replay(_book(ref)), spec=SpecConfig(), cost_clock=clock) as eng:
        outs = eng.generate(reqs)
        good = eng.spec_stats()
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    # Nearly every step verifies: the last two may not (a token or two left: a verify step's fixed
    # extra cost can outweigh one draft token).
    assert good.verify_forwards >= 0.9 * good.target_forwards - 2 and good.tokens_per_forward > 3
