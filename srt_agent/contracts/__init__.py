"""Contracts shared by the parts of srt-agent: what the engine and the tree cache exchange.

:mod:`srt_agent.contracts.draft`: the draft tree a draft source proposes, the per-step queries and
stream updates, and the draft-source protocol the engine speculates with.
"""
