"""The optional native core (``srt_agent._native``, built from ``native/`` by ``pip install``).

Its functions have Python twins, which are the reference and run when the core is missing (no
C++ compiler at install time) or disabled (``SRT_NATIVE=0``, e.g. to compare the two). Callers
use :data:`core`: the module, or ``None`` to take the Python path.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)


def _load() -> ModuleType | None:
    if os.environ.get("SRT_NATIVE", "1") == "0":
        return None
    try:
        from srt_agent import _native
    except ImportError as exc:
        log.warning(
            "srt-agent's native core is not built (%s): the engine's per-step bookkeeping runs in "
            "Python, slower. Install a C++17 compiler (e.g. g++) and reinstall srt-agent "
            "(pip install -e .) to build it.",
            exc,
        )
        return None
    module: ModuleType = _native
    return module


core: ModuleType | None = _load()
"""The native module, or ``None`` (not built, or ``SRT_NATIVE=0``)."""
