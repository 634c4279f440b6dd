"""A stand-in for OpenRLHF's ``llm_engine`` (vLLM's async generate) backed by srt-agent's TorchEngine."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams


class TorchLLM:
    """``await generate(prompt_token_ids, sampling_params)`` -> a vLLM-shaped ``RequestOutput``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.outputs: list[GenerationOutput] = []
        self._calls = itertools.count()

    async def generate(
        self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None
    ) -> Any:
        n = next(self._calls)  # concurrent samples of a group each get their own id and seed
        params = SamplingParams(
            temperature=sampling_params.temperature,
            max_new_tokens=sampling_params.max_tokens,
            stop_token_ids=tuple(getattr(sampling_params, "stop_token_ids", None) or ()),
            seed=n,
        )
        out = await self.engine.agenerate(GenerationRequest(f"g{n}", tuple(prompt_token_ids), params))
        self.outputs.append(out)
        logprobs = None
        if sampling_params.logprobs is not None:
            logprobs = [
                {t: SimpleNamespace(logprob=lp)} for t, lp in zip(out.token_ids, out.logprobs, strict=True)
            ]
        finish = "length" if out.finish_reason == "length" else "stop"
        step = SimpleNamespace(
            token_ids=list(out.token_ids), text="", finish_reason=finish, logprobs=logprobs
        )
        return SimpleNamespace(outputs=[step])
