"""``python -m srt_agent.cli``, where the console script is not installed."""

from srt_agent.cli import main

if __name__ == "__main__":  # not when a tool imports every module of the package
    main()
