"""Stand-in for vLLM (CUDA-only) in the openrlhf tier: what openrlhf 0.11.2 imports from it.

``SamplingParams`` holds the fields OpenRLHF sets; the engine classes raise when used (the tier
runs OpenRLHF's executor path with a stand-in ``llm_engine``, never a vLLM engine).
"""

from typing import Any

__version__ = "0.29.0"


class SamplingParams:
    """The sampling fields OpenRLHF sets and agents read."""

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, **kwargs: Any) -> None:
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_tokens = kwargs.pop("max_tokens", None)
        self.logprobs = kwargs.pop("logprobs", None)
        self.stop_token_ids: list[int] = []
        for key, value in kwargs.items():
            setattr(self, key, value)


class AsyncEngineArgs:
    """Not available on CPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("vLLM stand-in: no engines on CPU")


class AsyncLLMEngine:
    """Not available on CPU."""

    @classmethod
    def from_engine_args(cls, *args: Any, **kwargs: Any) -> "AsyncLLMEngine":
        """Refuse: no vLLM engine here."""
        raise RuntimeError("vLLM stand-in: no engines on CPU")
