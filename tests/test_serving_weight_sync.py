"""SGLang's RL weight-sync API on srt-agent serve, on CPU: a learner broadcasts over gloo.

The learner is a separate process (a process can be in one group of a name only), built with
``WeightSender``; the server joins with ``/init_weights_update_group`` and receives with
``/update_weights_from_distributed`` inside a ``/begin_weight_update`` ... ``/end_weight_update``
session. Pause, continue, memory release and resume keep SGLang's rules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from chat_fixtures import save_tiny_llama

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams
from srt_agent.engine.hf_checkpoint import read_state_dict
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.integrations.openrlhf.server_process import free_port
from srt_agent.serving import EngineServer, SGLangEngine
from srt_agent.serving.weight_sync import dtype_from_name, dtype_name, tcp_init_method, update_request

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GROUP = "openrlhf"

# The learner's rank 0: host the group, then broadcast each round's checkpoint in name order
# (one broadcast per tensor, or one flattened bucket), then wait to be told to leave.
LEARNER = """
import json, sys
from datetime import timedelta
from srt_agent.engine.hf_checkpoint import read_state_dict
from srt_agent.serving.weight_sync import WeightSender

port, rounds = int(sys.argv[1]), json.loads(sys.argv[2])
sender = WeightSender.connect(
    "127.0.0.1", port, 2, group_name=sys.argv[3], backend="gloo", timeout=timedelta(seconds=30)
)
for r in rounds:
    state = read_state_dict(r["dir"])
    named = [(name, state[name]) for name in sorted(state)]
    if r["flattened"]:
        sender.send(named, flattened=True)
    else:
        for pair in named:
            sender.send([pair])
sys.stdin.readline()
sender.close()
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def new_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-new"), seed=1)


@pytest.fixture()
def server(model_dir: Path) -> Iterator[EngineServer]:
    engine = TorchEngine(model_dir, max_batch_size=4, seed=0)
    with EngineServer(engine, model_dir, port=0, group_timeout_s=30).start() as srv:
        yield srv


@pytest.fixture()
def client(server: EngineServer) -> Iterator[SGLangEngine]:
    with SGLangEngine(server.url, max_context=2048, timeout_s=60) as c:
        yield c


def _learner(port: int, rounds: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", LEARNER, str(port), json.dumps(rounds), GROUP],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def _finish(learner: subprocess.Popen[bytes]) -> None:
    _, err = learner.communicate(b"done\n", timeout=30)
    assert learner.returncode == 0, err.decode()[-2000:]


def _requests(n: int = 2, max_new_tokens: int = 8) -> list[GenerationRequest]:
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    return [GenerationRequest(f"g{i}", (5, 6, 7 + i), params) for i in range(n)]


def _local(model_dir: Path) -> list[GenerationOutput]:
    with TorchEngine(model_dir, max_batch_size=4, seed=0) as engine:
        return engine.generate(_requests())


def _same(got: list[GenerationOutput], want: list[GenerationOutput]) -> None:
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for g, w in zip(got, want, strict=True):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)


def _update_all(client: SGLangEngine, model_dir: Path, **kw: Any) -> None:
    state = read_state_dict(model_dir)
    names = sorted(state)
    client.update_weights_from_distributed(
        names, [state[n].dtype for n in names], [list(state[n].shape) for n in names], group_name=GROUP, **kw
    )


def _slow_steps(server: EngineServer, monkeypatch: pytest.MonkeyPatch, seconds: float = 0.01) -> None:
    """Make each forward take ``seconds`` more, so that a request is still running when the test acts."""
    forward = server.engine.model.forward

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return forward(*args, **kwargs)

    monkeypatch.setattr(server.engine.model, "forward", slow)


def _wait_until(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def _running(server: EngineServer) -> Callable[[], bool]:
    return lambda: server.engine.stats().running >= 1


def test_distributed_updates_load_the_learners_weights(
    server: EngineServer, client: SGLangEngine, model_dir: Path, new_dir: Path
) -> None:
    """Parameter by parameter (OpenRLHF's way), then one flattened bucket back to the original."""
    before = client.generate(_requests())
    port = free_port()
    learner = _learner(
        port, [{"dir": str(new_dir), "flattened": False}, {"dir": str(model_dir), "flattened": True}]
    )
    try:
        client.init_weights_update_group("127.0.0.1", port, 1, 2, group_name=GROUP, backend="gloo")
        new = read_state_dict(new_dir)
        names = sorted(new)
        with client.weight_update_session():
            for i, name in enumerate(names):
                client.update_weights_from_distributed(
                    [name],
                    [new[name].dtype],
                    [list(new[name].shape)],
                    group_name=GROUP,
                    flush_cache=i == len(names) - 1,  # as OpenRLHF: the last parameter flushes
                )
        updated = client.generate(_requests())
        with client.weight_update_session():
            _update_all(client, model_dir, load_format="flattened_bucket")
        back = client.generate(_requests())
        client.destroy_weights_update_group(GROUP)
    finally:
        _finish(learner)
    _same(updated, _local(new_dir))
    assert [o.logprobs for o in updated] != [o.logprobs for o in before]
    _same(back, before)
    with pytest.raises(RuntimeError, match="does not exist"):
        client.destroy_weights_update_group(GROUP)


def test_a_flush_fails_while_requests_run_unless_they_are_retracted(
    server: EngineServer,
    client: SGLangEngine,
    model_dir: Path,
    new_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    learner = _learner(
        port, [{"dir": str(new_dir), "flattened": False}, {"dir": str(model_dir), "flattened": False}]
    )
    _slow_steps(server, monkeypatch)
    pool = ThreadPoolExecutor(2)
    try:
        client.init_weights_update_group("127.0.0.1", port, 1, 2, group_name=GROUP, backend="gloo")
        long = GenerationRequest("long", (1, 2, 3), SamplingParams(temperature=0.0, max_new_tokens=1000))
        running = pool.submit(client.generate, [long])
        _wait_until(_running(server), "the long request runs")
        # Paused in place, the request stays in the batch: the weights load, the flush fails.
        client.pause_generation("in_place")
        with client.weight_update_session(), pytest.raises(RuntimeError, match="cache was not flushed"):
            _update_all(client, new_dir, flush_cache=True)
        assert server.engine.stats().running == 1
        # Retracted requests do not count: the flush succeeds.
        client.pause_generation("retract")
        with client.weight_update_session():
            _update_all(client, model_dir, flush_cache=True)
        assert server.engine.stats().running == 1  # our retract lets it run on (SGLang's would wait)
        client.pause_generation("abort")
        assert running.result(timeout=5)[0].finish_reason == "abort"
        client.continue_generation()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        _finish(learner)


def test_weight_update_session_rules(server: EngineServer, client: SGLangEngine) -> None:
    outside = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[32]], "group_name": GROUP}
    answer = httpx.post(f"{server.url}/update_weights_from_distributed", json=outside)
    assert answer.status_code == 400 and answer.json()["success"] is False
    assert "between begin_weight_update() and end_weight_update()" in answer.json()["message"]
    with pytest.raises(RuntimeError, match="must run between"):
        client.update_weights_from_distributed(
            ["model.norm.weight"], [torch.float32], [[32]], group_name=GROUP
        )
    with pytest.raises(RuntimeError, match="must run between"):
        client.update_weights_from_serialized(["payload"])
    with pytest.raises(RuntimeError, match="no weight-update session is open"):
        client.end_weight_update()
    client.begin_weight_update()
    with pytest.raises(RuntimeError, match="already open"):
        client.begin_weight_update()
    # Inside the session: an unknown group fails before anything is received (no learner needed).
    with pytest.raises(RuntimeError, match=f"Failed to receive weights: .*Group {GROUP} not in"):
        client.update_weights_from_distributed(["model.norm.weight"], ["float32"], [[32]], group_name=GROUP)
    tensor = httpx.post(f"{server.url}/update_weights_from_tensor", json={"serialized_named_tensors": ["x"]})
    assert tensor.status_code == 501 and "CUDA IPC" in tensor.json()["message"]
    with pytest.raises(RuntimeError, match="CUDA IPC"):
        client.update_weights_from_serialized(["payload"])
    client.end_weight_update()
    # Malformed bodies, and what SGLang's scheduler would have died of (an empty group name), are
    # plain refusals naming the field: the client's own body model refuses before sending, and the
    # server refuses the same body from any other client.
    with pytest.raises(ValueError, match="group_name"):
        client.init_weights_update_group("127.0.0.1", 1, 1, 2, group_name="", backend="gloo")
    empty = {
        "master_address": "127.0.0.1",
        "master_port": 1,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": "",
    }
    refused = httpx.post(f"{server.url}/init_weights_update_group", json=empty)
    assert refused.status_code == 400 and "group_name" in refused.json()["error"]["message"]
    bad = httpx.post(
        f"{server.url}/update_weights_from_distributed", json={"names": "x", "dtypes": [], "shapes": []}
    )
    assert bad.status_code == 400 and "names: Input should be a valid list" in bad.json()["error"]["message"]
    pause = httpx.post(f"{server.url}/pause_generation", json={"mode": "keep"})
    assert pause.status_code == 400 and "mode: Input should be 'abort', 'retract' or 'in_place'" in pause.text
    assert update_request([("w", torch.zeros(2, 3, dtype=torch.bfloat16))], group_name=GROUP)["dtypes"] == [
        "bfloat16"
    ]
    assert dtype_from_name("torch.bfloat16") is torch.bfloat16 and dtype_name(torch.float32) == "float32"
    assert (
        tcp_init_method("::1", 5) == "tcp://[::1]:5" and tcp_init_method("10.0.0.1", 5) == "tcp://10.0.0.1:5"
    )


def test_pause_holds_new_requests_until_continue(
    server: EngineServer, client: SGLangEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = client.generate(_requests(1))
    pool = ThreadPoolExecutor(2)
    try:
        client.pause_generation("retract")
        held = pool.submit(client.generate, _requests(1))
        time.sleep(0.3)
        assert not held.done()
        client.continue_generation()
        _same(held.result(timeout=10), want)

        # Abort mode aborts what runs (its answer says so) and answers once it has come back.
        _slow_steps(server, monkeypatch)
        long = GenerationRequest("long", (1, 2, 3), SamplingParams(temperature=0.0, max_new_tokens=500))
        running: Future[list[GenerationOutput]] = pool.submit(client.generate, [long])
        _wait_until(_running(server), "the long request runs")
        client.pause_generation("abort")
        assert server._readers == 0  # the aborted call has answered
        (out,) = running.result(timeout=5)
        assert out.finish_reason == "abort" and len(out.token_ids) < 500
        held = pool.submit(client.generate, _requests(1))
        time.sleep(0.2)
        assert not held.done()
        client.continue_generation()
        _same(held.result(timeout=10), want)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def test_memory_release_and_resume_keep_sglangs_bookkeeping(
    server: EngineServer, client: SGLangEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = client.generate(_requests(1))
    client.release_memory_occupation(["kv_cache"])
    with pytest.raises(ValueError, match=r"memory is released \(\['kv_cache'\]\)"):
        client.generate(_requests(1))
    with pytest.raises(ValueError, match=r"cannot resume \['weights'\]: not released"):
        client.resume_memory_occupation(["weights"])
    with pytest.raises(ValueError, match=r"cannot resume \['weights', 'cuda_graph'\]"):
        client.resume_memory_occupation(None)  # null means all three
    client.resume_memory_occupation(["kv_cache"])
    with pytest.raises(ValueError, match="not released"):
        client.resume_memory_occupation(["kv_cache"])  # SGLang: a KeyError kills the scheduler
    with pytest.raises(ValueError, match="unknown memory tags"):
        client.release_memory_occupation(["gpu"])
    client.release_memory_occupation()  # all three
    client.release_memory_occupation(["weights"])  # a set: releasing again is no error
    answer = httpx.post(
        f"{server.url}/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
    )
    assert answer.status_code == 400 and "resume_memory_occupation" in answer.json()["error"]["message"]
    client.resume_memory_occupation(["weights"])
    with pytest.raises(ValueError, match=r"cannot resume \['weights'\]"):
        client.resume_memory_occupation()  # null means all three, and the weights are back already
    client.resume_memory_occupation(["kv_cache", "cuda_graph"])
    _same(client.generate(_requests(1)), want)  # the weights were kept

    # Releasing needs an idle server: refused while a request runs, fine once a pause aborted it.
    _slow_steps(server, monkeypatch)
    pool = ThreadPoolExecutor(1)
    try:
        long = GenerationRequest("long", (1, 2, 3), SamplingParams(temperature=0.0, max_new_tokens=500))
        running = pool.submit(client.generate, [long])
        _wait_until(_running(server), "the long request runs")
        with pytest.raises(ValueError, match=r"only when server is idle.*would have died"):
            client.release_memory_occupation(["weights"])
        client.pause_generation("abort")
        assert running.result(timeout=5)[0].finish_reason == "abort"
        client.release_memory_occupation(["weights", "kv_cache"])
        client.resume_memory_occupation(["kv_cache", "weights"])
        client.continue_generation()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
