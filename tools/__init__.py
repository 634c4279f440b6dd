"""Built-in tools (installed as ``srt_agent.tools``; the folder is ``tools/`` at the top level)."""
