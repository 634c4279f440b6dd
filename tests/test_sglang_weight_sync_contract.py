"""What the OpenRLHF rollout engine sends SGLang, against SGLang 0.5.23's own classes (``pytest -m sglang``).

Every control body the client sends builds SGLang's request struct (unknown or mistyped fields
fail there); a ``/generate`` body passes SGLang's JSON contract; the engine's launch flags parse
with SGLang's own argument parser; and a learner's rank 0 made with srt-agent's
``init_custom_process_group`` broadcasts to a receiver made with SGLang's (gloo, two processes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import torch

pytestmark = pytest.mark.sglang
io_struct = pytest.importorskip("sglang.srt.managers.io_struct", reason="the sglang tier needs sglang")

from sglang.srt.entrypoints.api_contract import generate_contract_error  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from srt_agent.contracts.generation import GenerationRequest, SamplingParams  # noqa: E402
from srt_agent.integrations.openrlhf.server_process import server_args  # noqa: E402
from srt_agent.integrations.sglang.launch import server_command  # noqa: E402
from srt_agent.serving.client import SGLangEngine  # noqa: E402
from srt_agent.serving.weight_sync import tcp_init_method  # noqa: E402
from srt_agent.serving.wire import request_to_wire  # noqa: E402

STRUCTS: dict[str, Any] = {
    "/init_weights_update_group": io_struct.InitWeightsUpdateGroupReqInput,
    "/update_weights_from_distributed": io_struct.UpdateWeightsFromDistributedReqInput,
    "/update_weights_from_tensor": io_struct.UpdateWeightsFromTensorReqInput,
    "/begin_weight_update": io_struct.BeginWeightUpdateReqInput,
    "/end_weight_update": io_struct.EndWeightUpdateReqInput,
    "/pause_generation": io_struct.PauseGenerationReqInput,
    "/continue_generation": io_struct.ContinueGenerationReqInput,
    "/release_memory_occupation": io_struct.ReleaseMemoryOccupationReqInput,
    "/resume_memory_occupation": io_struct.ResumeMemoryOccupationReqInput,
}


def _recording_client(bodies: dict[str, Any]) -> SGLangEngine:
    def answer(request: httpx.Request) -> httpx.Response:
        bodies[request.url.path] = json.loads(request.content or b"{}")
        return httpx.Response(200, json={"success": True, "message": "ok", "status": "ok"})

    return SGLangEngine(
        "http://sglang.test", max_context=64, transport=httpx.MockTransport(answer), check=False
    )


def test_every_control_body_builds_sglangs_request_struct() -> None:
    bodies: dict[str, Any] = {}
    calls: list[Callable[[SGLangEngine], None]] = [
        lambda c: c.init_weights_update_group("10.0.0.1", 29500, 1, 3, group_name="openrlhf", backend="nccl"),
        lambda c: c.begin_weight_update(),
        lambda c: c.update_weights_from_distributed(
            ["model.embed_tokens.weight"],
            [torch.bfloat16],
            [[8, 4]],
            group_name="openrlhf",
            flush_cache=False,
        ),
        lambda c: c.update_weights_from_serialized(["cGF5bG9hZA=="], flush_cache=True),
        lambda c: c.end_weight_update(),
        lambda c: c.pause_generation(mode="retract"),
        lambda c: c.continue_generation(),
        lambda c: c.release_memory_occupation(["weights", "kv_cache", "cuda_graph"]),
        lambda c: c.resume_memory_occupation(["weights"]),
    ]
    with _recording_client(bodies) as client:
        for call in calls:
            call(client)
    assert set(bodies) == set(STRUCTS)
    for path, body in bodies.items():
        STRUCTS[path](**body)  # SGLang's own struct: an unknown or missing field raises here
    assert bodies["/update_weights_from_distributed"]["dtypes"] == ["bfloat16"]  # getattr(torch, s)


def test_a_generate_body_passes_sglangs_json_contract() -> None:
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=16, stop_token_ids=(2,), seed=3
    )
    body = request_to_wire(GenerationRequest("r1", (1, 2, 3), params, task_id="t"))
    assert generate_contract_error(body) is None


def test_the_engines_launch_flags_parse_with_sglangs_parser() -> None:
    command = server_args(
        "sglang", "/models/policy", host="127.0.0.1", port=30001, tensor_parallel_size=2, seed=7,
        max_model_len=4096, enforce_eager=True, gpu_memory_utilization=0.6, enable_sleep=True,
    )  # fmt: skip
    extra = command[command.index("--") + 1 :]
    argv = server_command("/models/policy", host="127.0.0.1", port=30001, draft_tokens=12, extra=extra)
    argv = argv[argv.index("sglang.launch_server") + 1 :]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parsed = parser.parse_args(argv)
    assert (parsed.tp_size, parsed.random_seed, parsed.context_length) == (2, 7, 4096)
    assert parsed.enable_memory_saver and parsed.enable_weights_cpu_backup and parsed.disable_cuda_graph
    assert parsed.mem_fraction_static == pytest.approx(0.6)


RECEIVER = """
import sys, torch
from datetime import timedelta
from sglang.srt.utils.common import init_custom_process_group
import torch.distributed as dist
pg = init_custom_process_group(backend="gloo", init_method=sys.argv[1], world_size=2, rank=1,
                               group_name="openrlhf", timeout=timedelta(seconds=60))
t = torch.zeros(4, 3)
dist.broadcast(t, src=0, group=pg)
print(t.sum().item())
"""


def test_a_learner_group_broadcasts_to_a_receiver_built_by_sglang() -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from srt_agent.integrations.openrlhf.server_process import free_port
    from srt_agent.serving.weight_sync import init_custom_process_group

    init = tcp_init_method("127.0.0.1", free_port())
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, init],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    group = init_custom_process_group(
        backend="gloo",
        init_method=init,
        world_size=2,
        rank=0,
        group_name="openrlhf",
        timeout=timedelta(seconds=60),
    )
    dist.broadcast(torch.arange(12, dtype=torch.float32).reshape(4, 3), src=0, group=group)
    out, err = receiver.communicate(timeout=60)
    assert receiver.returncode == 0, err.decode()[-2000:]
    assert float(out.decode().strip().splitlines()[-1]) == 66.0
