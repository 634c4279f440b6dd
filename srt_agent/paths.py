"""Default locations of things the CLI builds and reads."""

from __future__ import annotations

import os
from pathlib import Path


def default_model_dir() -> Path:
    """Where ``srt-agent build-model`` writes the embedded model and other commands look for it.

    ``$SRT_AGENT_MODEL`` if set, else ``runs/embedded-model`` under the current directory (so a
    fresh clone starts without one, and ``runs/`` is git-ignored).
    """
    return Path(os.environ.get("SRT_AGENT_MODEL", "runs/embedded-model"))
