"""SGLang's native ``/generate`` JSON, both ways: the subset srt-agent speaks as client and server.

A request is ``{"input_ids": [...], "sampling_params": {...}, "return_logprob": true, "rid": "..."}``
(a batch: lists of each); a response is ``{"output_ids": [...], "meta_info": {...}}`` with
``meta_info.finish_reason`` (``{"type": "stop", "matched": 2}``, ``{"type": "length", "length": 64}``,
``{"type": "abort", "message": "..."}``) and ``meta_info.output_token_logprobs`` as
``[logprob, token_id, text]`` triples. Speculation counters: ``spec_verify_ct`` (verify forwards of
the request). The field names follow ``sglang==0.5.23``'s ``GenerateReqInput`` and
``SamplingParams``; fields srt-agent does not use are ignored by both sides.

Requests travel as the pydantic bodies of :mod:`srt_agent.serving.bodies` (the client and the server
share them). Conversions raise :class:`~srt_agent.serving.bodies.WireError` naming the field, so a
server answers 400 with it and a client reports which part of a server's answer it could not read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from srt_agent.contracts.draft import StreamKind
from srt_agent.contracts.generation import FinishReason, GenerationOutput, GenerationRequest, SamplingParams
from srt_agent.serving.bodies import (
    GenerateBatchBody,
    GenerateBody,
    SamplingParamsBody,
    WireError,
    parse_body,
)

__all__ = [
    "RUNAHEAD_PRIORITY",
    "batch_shape",
    "output_from_wire",
    "output_to_wire",
    "request_to_wire",
    "requests_from_wire",
]

RUNAHEAD_PRIORITY = -1
"""``priority`` of run-ahead requests. SGLang (``--enable-priority-scheduling``) runs larger values
first by default, and live requests carry none (0); srt-agent's own server admits them after live
ones and preempts them for live ones."""


def _token_ids(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(t) is int and t >= 0 for t in value):
        raise WireError(f"{where} must be a list of token ids (ints >= 0)")
    return tuple(value)


# --------------------------------------------------------------------------- sampling parameters
def sampling_to_wire(params: SamplingParams) -> SamplingParamsBody:
    """SGLang ``sampling_params`` for ``params`` (stop tokens and strings kept in the output)."""
    return SamplingParamsBody(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,  # SGLang: -1 disables
        max_new_tokens=params.max_new_tokens,
        stop_token_ids=list(params.stop_token_ids),
        stop=list(params.stop_strings),
        no_stop_trim=True,  # the rollout keeps the stop token: the learner trains on it
        skip_special_tokens=False,
        # Stop only on the caller's stop tokens: the chat format, not the model config, knows
        # which tokens end a turn.
        ignore_eos=True,
        sampling_seed=params.seed,
    )


def sampling_from_wire(body: SamplingParamsBody | None, where: str = "sampling_params") -> SamplingParams:
    """The :class:`SamplingParams` of an SGLang ``sampling_params`` body (``None``: the defaults).

    Raises:
        WireError: A value :class:`SamplingParams` refuses (a non-finite temperature, say).
    """
    if body is None:
        return SamplingParams()
    kw: dict[str, Any] = {}
    if body.temperature is not None:
        kw["temperature"] = body.temperature
    if body.top_p is not None:
        kw["top_p"] = body.top_p
    if body.top_k is not None:
        kw["top_k"] = 0 if body.top_k in (-1, 0) or body.top_k >= 1 << 30 else body.top_k
    if body.max_new_tokens is not None:
        kw["max_new_tokens"] = body.max_new_tokens
    if body.stop_token_ids is not None:
        kw["stop_token_ids"] = tuple(body.stop_token_ids)
    if body.stop is not None:
        kw["stop_strings"] = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    if body.sampling_seed is not None:
        kw["seed"] = body.sampling_seed
    try:
        return SamplingParams(**kw)
    except ValueError as exc:
        raise WireError(f"{where}: {exc}") from None


# --------------------------------------------------------------------------- requests
def request_to_wire(request: GenerationRequest) -> dict[str, Any]:
    """The ``/generate`` body of one request (token ids in, token ids and logprobs out)."""
    return GenerateBody(
        input_ids=list(request.prompt_ids),
        sampling_params=sampling_to_wire(request.params),
        return_logprob=True,
        logprob_start_len=-1,  # logprobs of the output only, not of the prompt
        rid=request.request_id,
        stream=False,
        priority=RUNAHEAD_PRIORITY if request.priority == "runahead" else None,
        srt_task_id=request.task_id,
        srt_draft_group=request.draft_group,
    ).wire()


def requests_from_wire(body: Any, new_id: Any) -> list[GenerationRequest]:
    """The requests of a ``/generate`` body: one, or a batch (``input_ids`` a list of lists).

    Args:
        body: The parsed JSON.
        new_id: Called (no arguments) for a request id when the body gives no ``rid``.

    Raises:
        WireError: Anything malformed (``text`` instead of ``input_ids`` included: this server
            is token-in/token-out).
    """
    if isinstance(body, Mapping) and "input_ids" not in body and "text" in body:
        raise WireError("input_ids is required (text prompts are not accepted: send token ids)")
    if batch_shape(body):
        batch = parse_body(GenerateBatchBody, body)
        rows = [(batch.row(i), f"sampling_params[{i}]") for i in range(len(batch.input_ids))]
    else:
        rows = [(parse_body(GenerateBody, body), "sampling_params")]
    out: list[GenerationRequest] = []
    for row, where in rows:
        priority: StreamKind = "runahead" if row.priority is not None and row.priority < 0 else "live"
        out.append(
            GenerationRequest(
                row.rid if row.rid is not None else new_id(),
                tuple(row.input_ids),
                sampling_from_wire(row.sampling_params, where),
                task_id=row.srt_task_id,
                priority=priority,
                draft_group=row.srt_draft_group,
            )
        )
    return out


# --------------------------------------------------------------------------- outputs
def output_to_wire(
    output: GenerationOutput, prompt_tokens: int, *, text: str | None = None, speculative: bool = False
) -> dict[str, Any]:
    """The ``/generate`` answer for one output.

    Args:
        output: The engine's output.
        prompt_tokens: The prompt's length.
        text: The decoded output, when the server has a tokenizer.
        speculative: Report ``spec_verify_ct`` (the request's forwards after its prefill).
    """
    finish: dict[str, Any]
    if output.finish_reason == "stop":
        finish = {"type": "stop", "matched": output.stop}
    elif output.finish_reason == "length":
        finish = {"type": "length", "length": len(output.token_ids)}
    else:  # abort, preempted
        finish = {"type": "abort", "message": output.error or output.finish_reason}
    meta: dict[str, Any] = {
        "id": output.request_id,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(output.token_ids),
        "output_token_logprobs": [
            [lp, t, None] for lp, t in zip(output.logprobs, output.token_ids, strict=True)
        ],
        "srt_forward_passes": output.forward_passes,
    }
    if output.finish_reason == "preempted":
        meta["srt_preempted"] = True
    if speculative:
        meta["spec_verify_ct"] = max(output.forward_passes - 1, 0)
    body: dict[str, Any] = {"output_ids": list(output.token_ids), "meta_info": meta}
    if text is not None:
        body["text"] = text
    return body


def output_from_wire(request_id: str, body: Any) -> GenerationOutput:
    """The :class:`GenerationOutput` in a ``/generate`` answer for one request.

    ``forward_passes`` is srt-agent's own count when the server is srt-agent's, else
    ``spec_verify_ct + 1`` (the prefill) under speculation, else one per token.

    Raises:
        WireError: A missing or malformed field, or logprobs that do not match the tokens.
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("meta_info"), Mapping):
        raise WireError("the answer has no meta_info object")
    meta = body["meta_info"]
    if "output_ids" not in body:
        raise WireError("the answer has no output_ids (was the server started with a tokenizer-only API?)")
    tokens = _token_ids(body["output_ids"], "output_ids")
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list) or len(triples) != len(tokens):
        got = len(triples) if isinstance(triples, list) else type(triples).__name__
        raise WireError(f"meta_info.output_token_logprobs has {got} entries for {len(tokens)} output ids")
    logprobs: list[float] = []
    for i, (triple, token) in enumerate(zip(triples, tokens, strict=True)):
        if not isinstance(triple, list) or len(triple) < 2 or triple[1] != token:
            raise WireError(
                f"meta_info.output_token_logprobs[{i}] = {triple!r} is not [logprob, {token}, ...]"
            )
        lp = triple[0]
        if not isinstance(lp, int | float) or math.isnan(lp) or lp > 1e-6:
            raise WireError(f"meta_info.output_token_logprobs[{i}] has logprob {lp!r}")
        logprobs.append(float(lp))
    reason, stop, error = _finish_from_wire(meta.get("finish_reason"))
    if meta.get("srt_preempted"):
        reason, error = "preempted", None
    passes = meta.get("srt_forward_passes")
    if not isinstance(passes, int) or isinstance(passes, bool):
        verify = meta.get("spec_verify_ct")
        passes = verify + 1 if isinstance(verify, int) and verify > 0 else len(tokens)
    return GenerationOutput(request_id, tokens, tuple(logprobs), reason, stop, passes, error)


def _finish_from_wire(raw: Any) -> tuple[FinishReason, int | str | None, str | None]:
    if raw is None:  # SGLang reports None for a request still running; a complete answer never does
        raise WireError("meta_info.finish_reason is null: the request did not finish")
    if not isinstance(raw, Mapping) or not isinstance(raw.get("type"), str):
        raise WireError(f"meta_info.finish_reason = {raw!r} has no type")
    kind = raw["type"]
    if kind == "stop":
        matched = raw.get("matched")
        return (
            "stop",
            matched if isinstance(matched, int | str) and not isinstance(matched, bool) else None,
            None,
        )
    if kind == "length":
        return "length", None, None
    if kind == "abort":
        message = raw.get("message")
        return "abort", None, str(message) if message else "the server aborted the request"
    raise WireError(f"meta_info.finish_reason.type = {kind!r} is not stop, length or abort")


def batch_shape(body: Any) -> bool:
    """Whether a ``/generate`` body is a batch (its ``input_ids`` a list of lists)."""
    ids = body.get("input_ids") if isinstance(body, Mapping) else None
    return isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
