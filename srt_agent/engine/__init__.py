"""Generation engines: token ids in, token ids and their sampling logprobs out."""

from srt_agent.engine.types import (
    Engine,
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    PromptTooLongError,
    SamplingParams,
    state_key,
)

__all__ = [
    "Engine",
    "FinishReason",
    "GenerationOutput",
    "GenerationRequest",
    "PromptTooLongError",
    "SamplingParams",
    "state_key",
]
