"""Generation engines: token ids in, token ids and their sampling logprobs out.

``TorchEngine`` and ``CheckpointError`` are imported lazily, so that code needing only the wire
types does not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from srt_agent.contracts.generation import (
    Engine,
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    PromptTooLongError,
    SamplingParams,
    state_key,
)

if TYPE_CHECKING:
    from srt_agent.engine.hf_checkpoint import CheckpointError
    from srt_agent.engine.torch_engine import TorchEngine

_LAZY = {
    "TorchEngine": "srt_agent.engine.torch_engine",
    "CheckpointError": "srt_agent.engine.hf_checkpoint",
}

__all__ = [
    "CheckpointError",
    "Engine",
    "FinishReason",
    "GenerationOutput",
    "GenerationRequest",
    "PromptTooLongError",
    "SamplingParams",
    "TorchEngine",
    "state_key",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
