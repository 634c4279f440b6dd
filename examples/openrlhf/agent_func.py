"""OpenRLHF's agent file for srt envs: pass this path as ``--train.agent_func_path``.

OpenRLHF loads it and builds ``AgentExecutor()`` in each rollout engine; each sample of the prompt
dataset (written by ``srt-agent openrlhf-data``) is played as one srt episode.
"""

from srt_agent.integrations.openrlhf.executor import SrtAgentExecutor as AgentExecutor

__all__ = ["AgentExecutor"]
