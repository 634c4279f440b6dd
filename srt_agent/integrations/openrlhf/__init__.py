"""srt-agent inside OpenRLHF: its envs as an ``AgentExecutor``, and SGLang rollout engines with SRT.

OpenRLHF (``--train.agent_func_path``) loads a file defining ``AgentExecutor``; srt-agent's is
:mod:`srt_agent.integrations.openrlhf.executor` (see ``examples/openrlhf/``). The episode logic
(:mod:`.samples`) imports nothing from OpenRLHF; the executor module needs it installed.
:mod:`.sglang_engine` gives OpenRLHF's learner rollout engines that are SGLang servers drafting with
SRT (``create_sglang_engines``, with ``create_vllm_engines``'s arguments).
"""

from srt_agent.integrations.openrlhf.samples import episode_prompt, play_episode

__all__ = ["episode_prompt", "play_episode"]
