"""What the commands print and write, and where.

:mod:`~srt_agent.output.console`: the console and its live progress; :mod:`~srt_agent.output.records`:
``--json`` records; :mod:`~srt_agent.output.paths`: where outputs and built models go.
"""
