"""OpenRLHF's rollout-engine surface on SGLangRolloutEngine, against ``srt-agent serve`` in a
subprocess (SGLang's API on CPU): generation equal to the in-process engine's, a per-parameter
weight sync over the learner's group, sleep/wake and pause/resume bookkeeping, and a server that
dies mid-rollout."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from chat_fixtures import save_tiny_llama

from srt_agent.contracts.generation import GenerationRequest, SamplingParams
from srt_agent.engine.hf_checkpoint import read_state_dict
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.integrations.openrlhf.server_process import free_port
from srt_agent.integrations.openrlhf.sglang_engine import SGLangRolloutEngine

PROMPT = [5, 6, 7, 8]

LEARNER = """
import sys
from datetime import timedelta
from srt_agent.engine.hf_checkpoint import read_state_dict
from srt_agent.serving.weight_sync import WeightSender

port, new_dir = int(sys.argv[1]), sys.argv[2]
sender = WeightSender.connect("127.0.0.1", port, 2, group_name="openrlhf", backend="gloo",
                              timeout=timedelta(seconds=60))
state = read_state_dict(new_dir)
for name in sorted(state):
    sys.stdin.readline()  # the engine's update_weight for this name was fired (as OpenRLHF does)
    sender.send([(name, state[name])])
sys.stdin.readline()
sender.close()
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangRolloutEngine]:
    log_dir = str(tmp_path_factory.mktemp("logs"))
    eng = SGLangRolloutEngine(
        str(model_dir), server="srt", max_model_len=512, log_dir=log_dir, start_timeout_s=180
    )
    yield eng
    eng.close()


def _greedy(max_tokens: int = 8) -> Any:
    return SimpleNamespace(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, logprobs=1, seed=None)


def _local(model_dir: Path, max_tokens: int = 8) -> tuple[list[int], list[float]]:
    with TorchEngine(model_dir, max_batch_size=2, seed=0) as local:
        eos = tuple(json.loads((model_dir / "config.json").read_text())["eos_token_id"] for _ in [0])
        params = SamplingParams(temperature=0.0, max_new_tokens=max_tokens, stop_token_ids=eos)
        (out,) = local.generate([GenerationRequest("local", tuple(PROMPT), params)])
    return list(out.token_ids), list(out.logprobs)


def _generate(engine: SGLangRolloutEngine) -> tuple[list[int], list[float]]:
    result = asyncio.run(engine.generate(list(PROMPT), _greedy()))
    out = result.outputs[0]
    assert isinstance(out.token_ids, list) and out.finish_reason in ("stop", "length")
    assert out.logprobs is not None
    return out.token_ids, [step[t].logprob for step, t in zip(out.logprobs, out.token_ids, strict=True)]


def test_generation_equals_the_in_process_engine(engine: SGLangRolloutEngine, model_dir: Path) -> None:
    tokens, logprobs = _generate(engine)
    want_tokens, want_logprobs = _local(model_dir)
    assert tokens == want_tokens
    assert logprobs == pytest.approx(want_logprobs, abs=1e-4)
    assert engine.get_num_unfinished_requests() == 0


def test_a_per_parameter_sync_over_the_group_loads_the_learners_weights(
    engine: SGLangRolloutEngine, tmp_path: Path
) -> None:
    new_dir = save_tiny_llama(tmp_path / "new", seed=1)
    port = free_port()
    learner = subprocess.Popen(
        [sys.executable, "-c", LEARNER, str(port), str(new_dir)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert learner.stdin is not None

    async def sync() -> None:
        await engine.init_process_group("127.0.0.1", port, 1, 2, "openrlhf", backend="gloo")
        names = sorted(read_state_dict(new_dir).items())
        for i, (name, tensor) in enumerate(names):
            update = asyncio.ensure_future(
                engine.update_weight(name, tensor.dtype, tensor.shape, empty_cache=i == len(names) - 1)
            )
            await asyncio.sleep(0)
            learner.stdin.write(b"next\n")  # type: ignore[union-attr]
            learner.stdin.flush()  # type: ignore[union-attr]
            await update
        assert not engine.session_open  # the last parameter closed SGLang's update session

    try:
        asyncio.run(sync())
    finally:
        _, err = learner.communicate(b"done\n", timeout=60)
        engine.client.destroy_weights_update_group("openrlhf")  # the server may join it again later
    assert learner.returncode == 0, err.decode()[-2000:]
    assert _generate(engine)[0] == _local(new_dir)[0]  # the server now generates with the new weights


def test_sleep_and_wake_keep_sglangs_tag_bookkeeping(engine: SGLangRolloutEngine) -> None:
    asyncio.run(engine.sleep())
    assert engine.released == {"weights", "kv_cache", "cuda_graph"}
    asyncio.run(engine.wake_up(tags=["weights"]))  # OpenRLHF wakes the weights for a sync first
    assert engine.released == {"kv_cache", "cuda_graph"}
    asyncio.run(engine.wake_up())  # then everything: weights again must not be resumed twice
    asyncio.run(engine.wake_up())
    assert engine.released == set()
    assert _generate(engine)[0]


def test_a_pause_holds_generation_until_resume(engine: SGLangRolloutEngine) -> None:
    async def run() -> None:
        await engine.pause_generation()
        held = asyncio.ensure_future(engine.generate(list(PROMPT), _greedy()))
        await asyncio.sleep(1.0)
        assert not held.done()
        await engine.resume_generation()
        assert (await held).outputs[0].token_ids

    asyncio.run(run())


def test_generate_responses_runs_the_agent_executor_and_survives_a_server_death(
    engine: SGLangRolloutEngine, tmp_path: Path
) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(
        textwrap.dedent(
            """
            class AgentExecutor:
                async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine,
                                  images=None):
                    out = (await llm_engine.generate([5, 6, 7, 8], sampling_params)).outputs[0]
                    return {"prompt": prompt, "label": label, "observation_tokens": out.token_ids}
            """
        )
    )
    engine.agent_func_path, engine._executor = str(agent), None
    first = asyncio.run(engine.generate_responses("p", "l", _greedy(), 512, None, num_samples=3))
    assert len(first) == 3 and all(s["observation_tokens"] for s in first)
    assert engine.process is not None and engine.process.proc is not None
    engine.process.proc.kill()  # the server dies between rollouts
    engine.process.proc.wait()
    again = asyncio.run(engine.generate_responses("p", "l", _greedy(), 512, None, num_samples=3))
    assert [s["observation_tokens"] for s in again] == [s["observation_tokens"] for s in first]
    assert engine.process.alive()


def test_the_patched_learner_group_syncs_the_engine(
    engine: SGLangRolloutEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenRLHF's learner with the patch: its sync-group set-up (``sglang_sync_group``, what
    ``ActorPPOTrainer._init_vllm_sync_group`` becomes) meets the engine's, and its per-parameter
    loop (``self._model_update_group.broadcast(param.data, src=0, stream=...)`` while the engines'
    ``update_weight`` calls wait) loads the learner's weights into the server."""
    import threading
    from concurrent.futures import Future

    import ray

    from srt_agent.integrations.openrlhf.learner_patch import sglang_sync_group

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    class Remote:  # engine.<method>.remote(...) as a future on the engine's own loop (a Ray actor's)
        def __init__(self, method: Any) -> None:
            self.method = method

        def remote(self, *args: Any, **kwargs: Any) -> Future[Any]:
            return asyncio.run_coroutine_threadsafe(self.method(*args, **kwargs), loop)

    handle = SimpleNamespace(
        init_process_group=Remote(engine.init_process_group), update_weight=Remote(engine.update_weight)
    )
    vllm_args = SimpleNamespace(sync_with_ray=False, tensor_parallel_size=1, num_engines=1)
    trainer = SimpleNamespace(
        strategy=SimpleNamespace(args=SimpleNamespace(vllm=vllm_args)), vllm_engines=[handle]
    )
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    monkeypatch.setattr(ray, "get", lambda refs: [r.result(timeout=60) for r in refs])
    try:
        sglang_sync_group(trainer, "gloo")
        new_dir = save_tiny_llama(tmp_path / "learner", seed=2)
        state = sorted(read_state_dict(new_dir).items())
        for count, (name, param) in enumerate(state, 1):  # OpenRLHF's _broadcast_param, rank 0
            refs = [
                e.update_weight.remote(
                    name, dtype=param.dtype, shape=param.shape, empty_cache=count == len(state)
                )
                for e in trainer.vllm_engines
            ]
            trainer._model_update_group.broadcast(param.data, src=0, stream=None)
            ray.get(refs)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        group = getattr(trainer, "_model_update_group", None)
        if group is not None:  # a process may be in one group of a name: leave it for other tests
            group.sender.close()
            engine.client.destroy_weights_update_group("openrlhf")
    assert _generate(engine)[0] == _local(new_dir)[0]


def test_engine_placements_give_each_engine_its_tensor_parallel_gpus() -> None:
    """Each engine's actor holds its ``tensor_parallel_size`` GPUs, so Ray's ``CUDA_VISIBLE_DEVICES``
    (which the server inherits) names exactly them; a shared (colocated) group takes TP 1 only.
    Ray hands out declared GPUs without hardware, so the layout is checked on a CPU."""
    import ray

    from srt_agent.integrations.openrlhf.sglang_engine import engine_placements

    ray.init(num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:

        @ray.remote
        class Probe:
            def gpus(self) -> str:
                return os.environ.get("CUDA_VISIBLE_DEVICES", "")

        probes = [Probe.options(**o).remote() for o in engine_placements(2, 2)]  # type: ignore[attr-defined]
        seen = [ray.get(p.gpus.remote()).split(",") for p in probes]
        assert [len(s) for s in seen] == [2, 2] and len({g for s in seen for g in s}) == 4
        assert engine_placements(3, 1, num_gpus_per_engine=0) == [{"num_cpus": 0, "num_gpus": 0}] * 3
        with pytest.raises(ValueError, match="tensor_parallel_size is 2"):
            engine_placements(1, 2, shared_pg=object())
    finally:
        ray.shutdown()
