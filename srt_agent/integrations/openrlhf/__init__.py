"""srt-agent's envs inside OpenRLHF: an ``AgentExecutor`` that plays any registered srt env.

OpenRLHF (``--train.agent_func_path``) loads a file defining ``AgentExecutor``; srt-agent's is
:mod:`srt_agent.integrations.openrlhf.executor` (see ``examples/openrlhf/``). The episode logic
(:mod:`.episode`) imports nothing from OpenRLHF; the executor module needs it installed.
"""

from srt_agent.integrations.openrlhf.samples import episode_prompt, play_episode

__all__ = ["episode_prompt", "play_episode"]
