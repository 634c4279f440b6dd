"""SGLangEngine against a real HTTP server (srt-agent serve's EngineServer) on CPU.

The same requests through the client and through the in-process engine give the same tokens
and logprobs (per-request seeds), so the client is tested end to end without a GPU.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from train_fixtures import save_tiny_policy, tiny_config

from srt_agent.contracts.generation import GenerationRequest, PromptTooLongError, SamplingParams
from srt_agent.engine.hf_checkpoint import read_state_dict
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.evaluation import run_eval
from srt_agent.runtime import build_engine
from srt_agent.serving import EngineConfig, EngineConnectionError, EngineServer, SGLangEngine
from srt_agent.train.trainer import Trainer
from srt_agent.tree_cache import TreeCache


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[EngineServer]:
    engine = build_engine(model_dir, max_batch_size=8, draft_source=TreeCache(), seed=0)
    with EngineServer(engine, model_dir, port=0, speculative=True).start() as srv:
        yield srv


@pytest.fixture()
def client(server: EngineServer, model_dir: Path) -> Iterator[SGLangEngine]:
    with SGLangEngine(server.url, max_context=2048, model_dir=model_dir) as c:
        yield c


def _requests(n: int = 4, **params: object) -> list[GenerationRequest]:
    sp = {"temperature": 1.0, "max_new_tokens": 12, **params}
    return [
        GenerationRequest(f"r{i}", (5, 6, 7 + i), SamplingParams(seed=100 + i, **sp))  # type: ignore[arg-type]
        for i in range(n)
    ]


def test_client_outputs_equal_the_in_process_engine(client: SGLangEngine, model_dir: Path) -> None:
    with build_engine(model_dir, max_batch_size=8, seed=0) as local:
        want = local.generate(_requests())
    got = client.generate(_requests())
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for g, w in zip(got, want, strict=True):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
        assert g.finish_reason == w.finish_reason == "length" and len(g.token_ids) == 12
    stats = client.spec_stats(reset=True)
    assert stats.tokens == 48 and stats.row_steps == sum(o.forward_passes for o in got)


def test_serve_with_srt_accepts_drafts_on_a_repeated_prompt(model_dir: Path) -> None:
    """The second time a prompt is sent, the server's tree cache drafts what the policy generated
    the first time: accepted, so the request takes fewer forwards than it has tokens."""
    engine = build_engine(
        model_dir, max_batch_size=4, draft_source=TreeCache(), spec=SpecConfig(adaptive=False), seed=0
    )
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    with (
        EngineServer(engine, model_dir, port=0, speculative=True).start() as srv,
        SGLangEngine(srv.url, max_context=2048, model_dir=model_dir) as c,
    ):
        first = c.generate([GenerationRequest("p0", (5, 6, 9), params)])[0]
        again = c.generate([GenerationRequest("p1", (5, 6, 9), params)])[0]
        info = httpx.get(f"{srv.url}/server_info").json()
    assert again.token_ids == first.token_ids and len(again.token_ids) == 12
    assert first.forward_passes == 12  # nothing to draft from yet: one forward per token
    assert again.forward_passes < len(again.token_ids)  # drafted tokens accepted
    assert info["nodes_accepted"] >= len(again.token_ids) - again.forward_passes > 0
    assert info["row_steps"] < info["tokens"]


def test_stop_tokens_greedy_and_concurrent_agenerate(client: SGLangEngine) -> None:
    first = client.generate(_requests(1, temperature=0.0))[0]
    stop = first.token_ids[3]
    out = client.generate(_requests(1, temperature=0.0, stop_token_ids=(stop,)))[0]
    assert out.finish_reason == "stop" and out.stop == stop and out.token_ids[-1] == stop

    async def many() -> list[int]:
        reqs = [GenerationRequest(f"a{i}", (3, 4, i + 1), SamplingParams(max_new_tokens=5)) for i in range(6)]
        outs = await asyncio.gather(*(client.agenerate(r) for r in reqs))
        return [len(o.token_ids) for o in outs]

    assert asyncio.run(many()) == [5] * 6


def test_weight_updates_go_through_disk_and_match_the_in_process_engine(
    client: SGLangEngine, model_dir: Path, tmp_path: Path
) -> None:
    new = read_state_dict(save_tiny_policy(tmp_path / "other", seed=1))
    client.update_weights(new)
    got = client.generate(_requests(2))
    with build_engine(model_dir, max_batch_size=8, seed=0) as local:
        local.update_weights(new)
        want = local.generate(_requests(2))
    client.update_weights(read_state_dict(model_dir))  # back, for the other tests
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    client.flush_cache()


def test_bad_requests_and_missing_servers_fail_clearly(client: SGLangEngine, server: EngineServer) -> None:
    with pytest.raises(PromptTooLongError):
        client.generate([GenerationRequest("long", tuple(range(1, 2049)))])
    bad = httpx.post(f"{server.url}/generate", json={"text": "hi"})
    assert bad.status_code == 400 and "send token ids" in bad.json()["error"]["message"]
    bad = httpx.post(f"{server.url}/generate", json={"input_ids": [1], "sampling_params": {"min_p": 0.1}})
    assert bad.status_code == 400 and "min_p" in bad.json()["error"]["message"]
    # Nothing is released: resuming is refused (SGLang's scheduler would die of a KeyError).
    assert httpx.post(f"{server.url}/resume_memory_occupation", json={}).status_code == 400
    assert httpx.get(f"{server.url}/nope").status_code == 404
    with pytest.raises(ValueError, match="not released"):
        client.resume_memory_occupation()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EngineConnectionError, match="is the server up"):
        SGLangEngine(f"http://127.0.0.1:{port}", max_context=64, retries=1, backoff_s=0.01)


def test_batch_and_streamed_answers_have_sglang_shape(server: EngineServer) -> None:
    body = {"input_ids": [[1, 2], [3, 4]], "sampling_params": {"max_new_tokens": 3}, "return_logprob": True}
    answers = httpx.post(f"{server.url}/generate", json=body).json()
    assert len(answers) == 2
    for a in answers:
        meta = a["meta_info"]
        assert len(a["output_ids"]) == meta["completion_tokens"] == 3 and meta["prompt_tokens"] == 2
        assert meta["finish_reason"] == {"type": "length", "length": 3}
        assert [t for _, t, _ in meta["output_token_logprobs"]] == a["output_ids"]
    streamed = httpx.post(f"{server.url}/generate", json={"input_ids": [1, 2], "stream": True}).text
    assert streamed.startswith("data: {") and streamed.endswith("data: [DONE]\n\n")
    info = httpx.get(f"{server.url}/server_info").json()
    assert info["speculative_algorithm"] == "SRT" and info["context_length"] == 2048


def test_eval_through_the_server_equals_the_in_process_eval(server: EngineServer, model_dir: Path) -> None:
    def evaluate(engine: EngineConfig | None) -> list[tuple[int, ...]]:
        report = run_eval(
            "srt/GuessNumber-v0", model_dir, episodes=2, k=2, max_new_tokens=6, seed=5,
            env_options={"max_turns": 2}, max_concurrent=4, engine=engine,
        )  # fmt: skip
        assert report.failed == 0
        return [tuple(t.token_ids) for t in report.trajectories]

    assert evaluate(EngineConfig(kind="sglang", url=server.url)) == evaluate(None)


def test_spec_options_given_to_a_server_engine_are_said_to_be_unused(
    server: EngineServer, model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from srt_agent.engine.speculation.spec_config import SpecConfig
    from srt_agent.rollout.config import RolloutConfig
    from srt_agent.runtime import build_runtime

    sglang = EngineConfig(kind="sglang", url=server.url)
    with build_runtime(model_dir, RolloutConfig(), spec=SpecConfig(), engine=sglang):
        pass
    assert "not used with engine.kind=sglang" not in caplog.text  # the defaults say nothing
    with build_runtime(model_dir, RolloutConfig(), spec=SpecConfig(max_draft_tokens=4), engine=sglang):
        pass
    assert "spec options are not used with engine.kind=sglang" in caplog.text


def test_engine_config_checks_the_url() -> None:
    assert EngineConfig.model_validate("torch").kind == "torch"
    with pytest.raises(ValueError, match=r"needs engine\.url"):
        EngineConfig.model_validate("sglang")
    with pytest.raises(ValueError, match="http://"):
        EngineConfig(kind="sglang", url="localhost:30000")


def test_training_through_the_server_equals_training_in_process(
    server: EngineServer, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def train(**engine: str) -> list[float]:
        cfg = tiny_config(model_dir, tmp_path / ("remote" if engine else "local"), engine=engine)
        trainer = Trainer(cfg)
        try:
            steps = [r for r in trainer.run() if r["kind"] == "step"]
        finally:
            trainer.close()
        return [float(s[k]) for s in steps for k in ("reward_mean", "gen_tokens", "pg_loss")]

    loads: list[int] = []
    load = server.engine.update_weights
    monkeypatch.setattr(server.engine, "update_weights", lambda sd: (loads.append(len(sd)), load(sd)))
    try:
        remote = train(kind="sglang", url=server.url)  # weights reach the server through disk
    finally:
        load(read_state_dict(model_dir))  # as the other tests expect
    assert len(loads) == 2  # after each of the two steps
    assert remote == pytest.approx(train(), abs=1e-5)


def test_bench_rollout_runs_a_server_configuration(server: EngineServer, model_dir: Path) -> None:
    from srt_agent.speed.rollout_report import headline
    from srt_agent.speed.rollout_speed import RolloutBenchConfig, run_rollout_bench

    config = RolloutBenchConfig(
        model_dir, envs=("srt/GuessNumber-v0",), prompts=2, samples=2, rounds=2, max_new_tokens=6,
        max_turns=2, max_batch_size=4, configs=("off",), server_url=server.url,
    )  # fmt: skip
    try:
        results = run_rollout_bench(config)
    finally:
        server.engine.update_weights(read_state_dict(model_dir))
    record = headline(config, results)
    # The same seeds and the same drifted weights: the server generates what the engine does.
    assert record["server_tokens"] == record["off_tokens"] > 0 and record["server_ratio"] > 0
    assert {r.config for r in results} == {"off", "server"}


def test_tensor_weight_updates_follow_sglangs_session_protocol() -> None:
    """/begin_weight_update, /update_weights_from_tensor (ForkingPickler, base64, one per rank), /end."""
    import base64
    import json
    import pickle

    import torch

    calls: list[tuple[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        calls.append((request.url.path, body))
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, json={"success": True, "message": "ok"})

    weights = {"model.norm.weight": torch.arange(4, dtype=torch.float32)}
    with SGLangEngine(
        "http://sglang",
        max_context=64,
        weight_sync="tensor",
        tp_size=2,
        transport=httpx.MockTransport(answer),
    ) as client:
        client.update_weights(weights)
    paths = [p for p, _ in calls]
    assert paths == ["/health", "/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"]
    body = calls[2][1]
    assert body["flush_cache"] is True and len(body["serialized_named_tensors"]) == 2
    ((name, tensor),) = pickle.loads(base64.b64decode(body["serialized_named_tensors"][0]))
    assert name == "model.norm.weight" and torch.equal(tensor, weights[name])


def test_connection_failures_and_overloaded_servers_are_retried() -> None:
    tries: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        tries.append(request.url.path)
        if request.url.path == "/health":
            return httpx.Response(200)
        if len(tries) < 4:  # a dropped connection, then an overloaded server, then an answer
            if len(tries) == 2:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(503, json={"error": {"message": "busy"}})
        meta = {
            "id": "r",
            "finish_reason": {"type": "length", "length": 1},
            "output_token_logprobs": [[-0.5, 9, None]],
        }
        return httpx.Response(200, json={"output_ids": [9], "meta_info": meta})

    with SGLangEngine(
        "http://sglang", max_context=64, backoff_s=0.001, transport=httpx.MockTransport(flaky)
    ) as c:
        (out,) = c.generate([GenerationRequest("r", (1, 2))])
    assert out.token_ids == (9,) and out.logprobs == (-0.5,) and out.forward_passes == 1
    assert tries == ["/health", "/generate", "/generate", "/generate"]
