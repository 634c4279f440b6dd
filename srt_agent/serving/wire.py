"""SGLang's native ``/generate`` JSON, both ways: the subset srt-agent speaks as client and server.

A request is ``{"input_ids": [...], "sampling_params": {...}, "return_logprob": true, "rid": "..."}``
(a batch: lists of each); a response is ``{"output_ids": [...], "meta_info": {...}}`` with
``meta_info.finish_reason`` (``{"type": "stop", "matched": 2}``, ``{"type": "length", "length": 64}``,
``{"type": "abort", "message": "..."}``) and ``meta_info.output_token_logprobs`` as
``[logprob, token_id, text]`` triples. Speculation counters: ``spec_verify_ct`` (verify forwards of
the request). The field names follow ``sglang==0.5.23``'s ``GenerateReqInput`` and
``SamplingParams``; fields srt-agent does not use are ignored by both sides.

Conversions raise :class:`WireError` naming the field, so a server answers 400 with it and a
client reports which part of a server's answer it could not read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from srt_agent.contracts.draft import StreamKind
from srt_agent.contracts.generation import FinishReason, GenerationOutput, GenerationRequest, SamplingParams
from srt_agent.errors import SrtAgentError

__all__ = [
    "RUNAHEAD_PRIORITY",
    "WireError",
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


class WireError(SrtAgentError, ValueError):
    """A request or response does not have the shape of SGLang's native API."""


def _field(obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = obj[name]
    if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else ()):
        raise WireError(f"{where}.{name} must be {_names(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise WireError(f"{where}.{name} must be {_names(kind)}, got {type(value).__name__} {value!r}")
    return value


def _names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _token_ids(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(t) is int and t >= 0 for t in value):
        raise WireError(f"{where} must be a list of token ids (ints >= 0)")
    return tuple(value)


# --------------------------------------------------------------------------- sampling parameters
def sampling_to_wire(params: SamplingParams) -> dict[str, Any]:
    """SGLang ``sampling_params`` for ``params`` (stop tokens and strings kept in the output)."""
    out: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # SGLang: -1 disables
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "stop": list(params.stop_strings),
        "no_stop_trim": True,  # the rollout keeps the stop token: the learner trains on it
        "skip_special_tokens": False,
        # Stop only on the caller's stop tokens: the chat format, not the model config, knows
        # which tokens end a turn.
        "ignore_eos": True,
    }
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    return out


def sampling_from_wire(raw: Any, where: str = "sampling_params") -> SamplingParams:
    """The :class:`SamplingParams` of an SGLang ``sampling_params`` object.

    Raises:
        WireError: Not an object, a field of the wrong type or out of range, or an option
            srt-agent's engine does not implement set to a non-default value (so nothing is
            silently sampled otherwise than asked).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise WireError(f"{where} must be an object, got {type(raw).__name__}")
    unsupported = {
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
        "min_new_tokens": 0,
        "n": 1,
        "regex": None,
        "json_schema": None,
        "ebnf": None,
    }
    for name, default in unsupported.items():
        if name in raw and raw[name] != default:
            raise WireError(f"{where}.{name} = {raw[name]!r} is not supported by this engine (leave it out)")
    kw: dict[str, Any] = {}
    if "temperature" in raw:
        kw["temperature"] = float(_field(raw, "temperature", (int, float), where))
    if "top_p" in raw:
        kw["top_p"] = float(_field(raw, "top_p", (int, float), where))
    if "top_k" in raw:
        top_k = _field(raw, "top_k", int, where)
        kw["top_k"] = 0 if top_k in (-1, 0) or top_k >= 1 << 30 else top_k
    if "max_new_tokens" in raw:
        kw["max_new_tokens"] = _field(raw, "max_new_tokens", int, where)
    if raw.get("stop_token_ids") is not None:
        kw["stop_token_ids"] = _token_ids(raw["stop_token_ids"], f"{where}.stop_token_ids")
    stop = raw.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise WireError(f"{where}.stop must be a string or a list of non-empty strings")
        kw["stop_strings"] = tuple(stops)
    if raw.get("sampling_seed") is not None:
        kw["seed"] = _field(raw, "sampling_seed", int, where)
    try:
        return SamplingParams(**kw)
    except ValueError as exc:
        raise WireError(f"{where}: {exc}") from None


# --------------------------------------------------------------------------- requests
def request_to_wire(request: GenerationRequest) -> dict[str, Any]:
    """The ``/generate`` body of one request (token ids in, token ids and logprobs out)."""
    body: dict[str, Any] = {
        "input_ids": list(request.prompt_ids),
        "sampling_params": sampling_to_wire(request.params),
        "return_logprob": True,
        "logprob_start_len": -1,  # logprobs of the output only, not of the prompt
        "rid": request.request_id,
        "stream": False,
    }
    if request.priority == "runahead":
        body["priority"] = RUNAHEAD_PRIORITY
    # srt-agent's own fields (stock SGLang ignores unknown fields): the task lets srt-agent's server
    # draft from the same task's earlier turns, the group keeps the cost model's calibration per env.
    if request.task_id:
        body["srt_task_id"] = request.task_id
    if request.draft_group:
        body["srt_draft_group"] = request.draft_group
    return body


def requests_from_wire(body: Any, new_id: Any) -> list[GenerationRequest]:
    """The requests of a ``/generate`` body: one, or a batch (``input_ids`` a list of lists).

    Args:
        body: The parsed JSON.
        new_id: Called (no arguments) for a request id when the body gives no ``rid``.

    Raises:
        WireError: Anything malformed (``text`` instead of ``input_ids`` included: this server
            is token-in/token-out).
    """
    if not isinstance(body, Mapping):
        raise WireError("the body must be a JSON object")
    if "input_ids" not in body:
        hint = " (text prompts are not accepted: send token ids)" if "text" in body else ""
        raise WireError(f"input_ids is required{hint}")
    ids = body["input_ids"]
    batch = batch_shape(body)
    prompts = ids if batch else [ids]
    n = len(prompts)

    def per_row(name: str, default: Any) -> list[Any]:
        value = body.get(name, default)
        if batch and isinstance(value, list) and name != "stop":
            if len(value) != n:
                raise WireError(f"{name} has {len(value)} entries for {n} prompts")
            return value
        return [value] * n

    rids = per_row("rid", None)
    params = per_row("sampling_params", None)
    priorities = per_row("priority", None)
    tasks = per_row("srt_task_id", "")
    groups = per_row("srt_draft_group", "")
    out: list[GenerationRequest] = []
    for i in range(n):
        where = f"input_ids[{i}]" if batch else "input_ids"
        prompt = _token_ids(prompts[i], where)
        if not prompt:
            raise WireError(f"{where} is empty")
        rid = rids[i] if rids[i] is not None else new_id()
        if not isinstance(rid, str) or not rid:
            raise WireError(f"rid must be a non-empty string, got {rid!r}")
        priority: StreamKind = "runahead" if isinstance(priorities[i], int) and priorities[i] < 0 else "live"
        sp = sampling_from_wire(params[i], f"sampling_params[{i}]" if batch else "sampling_params")
        task, group = tasks[i], groups[i]
        if not isinstance(task, str) or not isinstance(group, str):
            raise WireError("srt_task_id and srt_draft_group must be strings")
        out.append(GenerationRequest(rid, prompt, sp, task_id=task, priority=priority, draft_group=group))
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
