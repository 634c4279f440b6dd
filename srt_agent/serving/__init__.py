"""Engines over HTTP: SGLang's native API as client (``SGLangEngine``) and server (``srt-agent serve``).

``SGLangEngine`` and ``EngineServer`` import lazily, so reading a run config's ``engine`` section
imports neither httpx nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from srt_agent.serving.engine_config import EngineConfig

if TYPE_CHECKING:
    from srt_agent.serving.client import EngineConnectionError, SGLangEngine
    from srt_agent.serving.server import EngineServer

_LAZY = {
    "SGLangEngine": "srt_agent.serving.client",
    "EngineConnectionError": "srt_agent.serving.client",
    "EngineServer": "srt_agent.serving.server",
}

__all__ = ["EngineConfig", "EngineConnectionError", "EngineServer", "SGLangEngine"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
