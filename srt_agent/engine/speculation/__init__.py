"""Speculative decoding inside the engine: exact tree verification and the cost model that sizes drafts.

* :mod:`~srt_agent.engine.speculation.speculator`: drafting, verifying and reporting per step;
* :mod:`~srt_agent.engine.speculation.verify`: the exact acceptance walk;
* :mod:`~srt_agent.engine.speculation.budget`: the cost model (how much to draft, per request group);
* :mod:`~srt_agent.engine.speculation.stats`: counters; :mod:`~srt_agent.engine.speculation.spec_config`:
  the options (``spec`` in a run config).
"""
