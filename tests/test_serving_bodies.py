"""The request bodies the client sends are the models the server reads: round trips and refusals."""

from __future__ import annotations

import pytest
import torch

from srt_agent.contracts.generation import GenerationRequest, SamplingParams
from srt_agent.serving.bodies import (
    GenerateBatchBody,
    GenerateBody,
    InitGroupBody,
    SamplingParamsBody,
    UpdateFromDistributedBody,
    WireError,
    parse_body,
)
from srt_agent.serving.weight_sync import update_request
from srt_agent.serving.wire import request_to_wire, requests_from_wire


def test_a_request_survives_the_client_and_server_bodies() -> None:
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=17, seed=5, stop_token_ids=(3,)
    )
    sent = GenerationRequest(
        "r1", (4, 5, 6), params, task_id="t", priority="runahead", draft_group="srt/Calc"
    )
    body = request_to_wire(sent)
    assert body["priority"] < 0 and body["srt_task_id"] == "t" and "min_p" not in body["sampling_params"]
    (got,) = requests_from_wire(body, lambda: "unused")
    assert got == sent


def test_a_batch_body_gives_one_request_per_prompt_with_per_row_fields() -> None:
    body = {
        "input_ids": [[1, 2], [3]],
        "rid": ["a", "b"],
        "sampling_params": [{"temperature": 0.0}, {"max_new_tokens": 4}],
        "priority": -1,
    }
    a, b = requests_from_wire(body, lambda: "unused")
    assert (a.request_id, a.prompt_ids, a.params.temperature, a.priority) == ("a", (1, 2), 0.0, "runahead")
    assert (b.request_id, b.params.max_new_tokens, b.priority) == ("b", 4, "runahead")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"input_ids": [1, True]}, "input_ids[1]"),
        ({"input_ids": [1, -2]}, "input_ids[1]: Input should be greater than or equal to 0"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [1], "sampling_params": {"top_k": "5"}}, "sampling_params.top_k"),
        ({"input_ids": [1], "sampling_params": {"temperature": True}}, "sampling_params.temperature"),
        ({"input_ids": [1], "sampling_params": {"min_p": 0.1}}, "min_p = 0.1 is not supported"),
        ({"input_ids": [1], "sampling_params": {"stop": [""]}}, "sampling_params.stop"),
        ({"input_ids": [1], "rid": 7}, "rid"),
        ({"input_ids": [1], "stream": "yes"}, "stream"),
        ({"input_ids": [[1], [2]], "rid": ["a"]}, "rid has 1 entries for 2 prompts"),
        ({"input_ids": [[1], [2]], "sampling_params": [{}, {"top_p": "x"}]}, "sampling_params[1].top_p"),
        ({"text": "hi"}, "send token ids"),
        ({}, "input_ids is required"),
    ],
)
def test_a_malformed_generate_body_is_refused_naming_the_field(body: dict[str, object], reason: str) -> None:
    with pytest.raises(WireError, match=None) as caught:
        requests_from_wire(body, lambda: "unused")
    assert reason in str(caught.value), str(caught.value)


def test_weight_sync_bodies_are_shared_and_checked() -> None:
    sent = update_request([("w", torch.zeros(2, 3, dtype=torch.bfloat16))], group_name="g")
    got = parse_body(UpdateFromDistributedBody, sent)
    assert (got.names, got.dtypes, got.shapes, got.group_name) == (["w"], ["bfloat16"], [[2, 3]], "g")
    with pytest.raises(WireError, match="one entry per tensor"):
        parse_body(UpdateFromDistributedBody, {**sent, "shapes": []})
    with pytest.raises(WireError, match="master_port is required"):
        parse_body(InitGroupBody, {"master_address": "h", "rank_offset": 1, "world_size": 2})
    with pytest.raises(WireError, match="group_name"):
        parse_body(
            InitGroupBody,
            {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 2, "group_name": ""},
        )
    with pytest.raises(WireError, match="the body must be a JSON object"):
        parse_body(GenerateBody, [1])


def test_unknown_fields_are_ignored_as_sglang_does() -> None:
    body = parse_body(
        GenerateBatchBody, {"input_ids": [[1]], "lora_path": None, "return_hidden_states": False}
    )
    assert body.input_ids == [[1]]
    assert SamplingParamsBody(temperature=1).wire() == {"temperature": 1.0}
