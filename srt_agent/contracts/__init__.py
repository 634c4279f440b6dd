"""Contracts shared by the parts of srt-agent: the small place everyone imports.

* :mod:`~srt_agent.contracts.generation`: a generation request and its output, sampling
  parameters, the engine protocol, conversation-state keys;
* :mod:`~srt_agent.contracts.draft`: the draft tree a draft source proposes, the per-step queries
  and stream updates, and the draft-source protocol the engine speculates with;
* :mod:`~srt_agent.contracts.trajectory`: one episode as the rollout hands it to the learner.

Chat messages are :mod:`srt_agent.chat.messages`.
"""
