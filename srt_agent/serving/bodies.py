"""The request bodies of the server's API as pydantic models, shared by the client and the server.

The client builds every body it sends from these models (:meth:`Body.wire`) and the server reads
every body it receives through them (:func:`parse_body`), so both sides agree on the names and
types by construction. Field names follow ``sglang==0.5.23`` (``GenerateReqInput``,
``SamplingParams`` and the RL weight-sync requests). Fields srt-agent does not use are ignored on
both sides, as SGLang ignores unknown ones; types are strict (``true`` is not an int, ``"1"`` is not
a number), and a refusal names the field (``sampling_params.top_k: ...``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from srt_agent.errors import SrtAgentError

__all__ = [
    "BeginUpdateBody",
    "Body",
    "ContinueBody",
    "DestroyGroupBody",
    "GenerateBatchBody",
    "GenerateBody",
    "InitGroupBody",
    "MemoryBody",
    "PauseBody",
    "SamplingParamsBody",
    "Selector",
    "UpdateFromDiskBody",
    "UpdateFromDistributedBody",
    "UpdateFromTensorBody",
    "WireError",
    "parse_body",
]

DEFAULT_GROUP_NAME = "weight_update_group"
"""SGLang's default name of the weight-sync process group."""

TokenId = Annotated[int, Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class WireError(SrtAgentError, ValueError):
    """A request or response does not have the shape of SGLang's native API."""


class Body(BaseModel):
    """A request body: strict types, unknown fields ignored (as SGLang does)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    def wire(self) -> dict[str, Any]:
        """The JSON object to send (fields left at ``None`` are left out)."""
        return self.model_dump(mode="json", exclude_none=True)


B = TypeVar("B", bound=Body)


def parse_body(model: type[B], body: Any, where: str = "") -> B:
    """``body`` read as ``model``.

    Args:
        model: The body's model.
        body: The parsed JSON.
        where: A prefix for the field names in errors (``sampling_params[2]``).

    Raises:
        WireError: Not an object, or a field missing, of the wrong type or out of range; the message
            names the first bad field.
    """
    if not isinstance(body, dict):
        name = f"{where} " if where else "the body "
        raise WireError(f"{name}must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise WireError(_first_error(exc, where)) from None


def _first_error(exc: ValidationError, where: str) -> str:
    """``field.path: reason`` of a validation error's most specific failure.

    The tags pydantic puts in a path for union members (``list[int]``) are left out.
    """
    # The most specific failure: of a union, the member the input was meant as (the deepest path).
    error = max(exc.errors(include_url=False, include_input=False), key=lambda e: len(e["loc"]))
    path = where
    for part in error["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif "[" in part or part[:1].isupper() or part in ("str", "int", "float", "list", "dict"):
            continue  # a union member's tag (list[int], SamplingParamsBody), not a field
        else:
            path += f".{part}" if path else part
    reason = str(error["msg"])
    if error["type"] == "missing":
        return f"{path} is required"
    extra = error.get("ctx", {}).get("error") if error["type"] == "value_error" else None
    return f"{path}: {extra or reason}" if path else str(extra or reason)


# --------------------------------------------------------------------------- generation
_UNSUPPORTED: dict[str, Any] = {
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


class SamplingParamsBody(Body):
    """SGLang's ``sampling_params``: the subset this engine samples with.

    Options the engine does not implement are accepted only at their defaults, so that nothing is
    silently sampled otherwise than asked.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = Field(default=None, description="-1 (SGLang) or 0: no top-k.")
    max_new_tokens: int | None = None
    stop_token_ids: list[TokenId] | None = None
    stop: str | list[Annotated[str, Field(min_length=1)]] | None = None
    sampling_seed: int | None = None
    no_stop_trim: bool | None = None
    skip_special_tokens: bool | None = None
    ignore_eos: bool | None = None
    # Options this engine does not implement: read to refuse them, never sent (excluded from dumps).
    min_p: float = Field(default=0.0, exclude=True)
    frequency_penalty: float = Field(default=0.0, exclude=True)
    presence_penalty: float = Field(default=0.0, exclude=True)
    repetition_penalty: float = Field(default=1.0, exclude=True)
    min_new_tokens: int = Field(default=0, exclude=True)
    n: int = Field(default=1, exclude=True)
    regex: str | None = Field(default=None, exclude=True)
    json_schema: str | None = Field(default=None, exclude=True)
    ebnf: str | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _only_defaults_of_unsupported(self) -> SamplingParamsBody:
        for name, default in _UNSUPPORTED.items():
            value = getattr(self, name)
            if value != default:
                raise ValueError(f"{name} = {value!r} is not supported by this engine (leave it out)")
        return self


class GenerateBody(Body):
    """One ``/generate`` request: token ids in, token ids and logprobs out.

    ``priority`` below 0 marks a run-ahead request; ``srt_task_id`` and ``srt_draft_group`` are
    srt-agent's own fields (stock SGLang ignores them): the task lets the server draft from the same
    task's earlier turns, the group keeps the cost model's calibration per env.
    """

    input_ids: TokenIds
    sampling_params: SamplingParamsBody | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    rid: Annotated[str, Field(min_length=1)] | None = None
    stream: bool | None = None
    priority: int | None = None
    srt_task_id: str = ""
    srt_draft_group: str = ""


class GenerateBatchBody(Body):
    """A batch ``/generate`` request: ``input_ids`` a list of prompts.

    Every other field is one value for all prompts or a list with one per prompt.
    """

    input_ids: Annotated[list[TokenIds], Field(min_length=1)]
    sampling_params: SamplingParamsBody | list[SamplingParamsBody] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    rid: Annotated[str, Field(min_length=1)] | list[Annotated[str, Field(min_length=1)]] | None = None
    stream: bool | None = None
    priority: int | list[int] | None = None
    srt_task_id: str | list[str] = ""
    srt_draft_group: str | list[str] = ""

    def row(self, i: int) -> GenerateBody:
        """The ``i``-th prompt's request."""
        n = len(self.input_ids)

        def pick(name: str) -> Any:
            value = getattr(self, name)
            if isinstance(value, list):
                if len(value) != n:
                    raise WireError(f"{name} has {len(value)} entries for {n} prompts")
                return value[i]
            return value

        return GenerateBody(
            input_ids=self.input_ids[i],
            sampling_params=pick("sampling_params"),
            rid=pick("rid"),
            priority=pick("priority"),
            srt_task_id=pick("srt_task_id"),
            srt_draft_group=pick("srt_draft_group"),
        )


# --------------------------------------------------------------------------- weights and memory
class UpdateFromDiskBody(Body):
    """``/update_weights_from_disk``: load a checkpoint directory on the server's disk."""

    model_path: Annotated[str, Field(min_length=1)]
    flush_cache: bool = True


class UpdateFromTensorBody(Body):
    """``/update_weights_from_tensor``: serialized tensors (base64), one payload per TP rank."""

    serialized_named_tensors: list[str]
    flush_cache: bool = True
    load_format: str | None = None
    abort_all_requests: bool = False


class InitGroupBody(Body):
    """``/init_weights_update_group``: join the learner's weight-sync process group."""

    master_address: str
    master_port: Annotated[int, Field(ge=1, le=65535)]
    rank_offset: Annotated[int, Field(ge=0)]
    world_size: Annotated[int, Field(ge=1)]
    group_name: Annotated[str, Field(min_length=1)] = DEFAULT_GROUP_NAME
    backend: str = "nccl"


class DestroyGroupBody(Body):
    """``/destroy_weights_update_group``."""

    group_name: str = DEFAULT_GROUP_NAME


Selector = Literal["target", "draft", "all"]
"""Which model a weight update loads into (srt-agent has one: every selector means the policy)."""


class BeginUpdateBody(Body):
    """``/begin_weight_update``: open the weight-update session (SGLang 0.5.23)."""

    selector: Selector = "all"


class UpdateFromDistributedBody(Body):
    """``/update_weights_from_distributed``: receive tensors the learner broadcasts over the group."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[Annotated[int, Field(ge=0)]]]
    group_name: str = DEFAULT_GROUP_NAME
    flush_cache: bool = True
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    selector: Selector = "all"

    @model_validator(mode="after")
    def _one_dtype_and_shape_per_name(self) -> UpdateFromDistributedBody:
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(
                f"names, dtypes and shapes must have one entry per tensor, got {len(self.names)}, "
                f"{len(self.dtypes)} and {len(self.shapes)}"
            )
        return self


PauseMode = Literal["abort", "retract", "in_place"]


class PauseBody(Body):
    """``/pause_generation``."""

    mode: PauseMode = "abort"


class ContinueBody(Body):
    """``/continue_generation``."""

    torch_empty_cache: bool = True


class MemoryBody(Body):
    """``/release_memory_occupation`` and ``/resume_memory_occupation``: null or ``[]`` tags mean all."""

    tags: list[str] | None = None
