"""OpenRLHF's ``AgentExecutor`` for srt envs (needs ``openrlhf``; see ``examples/openrlhf/``).

OpenRLHF loads ``--train.agent_func_path`` as a file and builds its ``AgentExecutor`` class with no
arguments, once per rollout engine. This one plays each sample as an srt episode
(:func:`~srt_agent.integrations.openrlhf.samples.play_episode`).
"""

from __future__ import annotations

import os
from typing import Any

from openrlhf.utils.agent import AgentExecutorBase

import srt_agent.envs  # noqa: F401 - registers the built-in envs
from srt_agent.integrations.openrlhf.samples import play_episode

__all__ = ["SrtAgentExecutor"]


class SrtAgentExecutor(AgentExecutorBase):  # type: ignore[misc]
    """Plays srt episodes for OpenRLHF.

    One assistant turn is capped at OpenRLHF's ``--rollout.max_new_tokens``, or, when that is
    unset, at the ``SRT_MAX_NEW_TOKENS`` environment variable (512).
    """

    def __init__(self) -> None:
        self.max_new_tokens = int(os.environ.get("SRT_MAX_NEW_TOKENS", "512"))

    async def execute(
        self,
        prompt: str,
        label: str,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        llm_engine: Any,
        images: Any = None,
    ) -> dict[str, Any]:
        """One sample: the srt episode the prompt names, as OpenRLHF's sample dict."""
        return await play_episode(
            prompt,
            label,
            sampling_params,
            max_length,
            hf_tokenizer,
            llm_engine,
            max_new_tokens=self.max_new_tokens,
        )
