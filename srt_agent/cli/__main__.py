"""``python -m srt_agent.cli``, where the console script is not installed."""

from srt_agent.cli import main

main()
