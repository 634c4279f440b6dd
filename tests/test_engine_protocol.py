"""Every engine implements the whole :class:`~srt_agent.contracts.generation.Engine` protocol.

The rollout scheduler and the trainer call these members directly (no probing with ``getattr``), so
an engine that lacks one would fail mid-run; this catches it at test time, for each engine class.
"""

from __future__ import annotations

import inspect

import pytest

from srt_agent.contracts.generation import Engine
from srt_agent.contracts.speculation import SpecStats
from srt_agent.distributed.ray_engine import RayEngine
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.integrations.openrlhf.samples import VLLMEngineAdapter
from srt_agent.serving.client import SGLangEngine
from srt_agent.speed.peers import HFEngine

MEMBERS = sorted(
    name for name, _ in inspect.getmembers(Engine) if not name.startswith("_") and name in Engine.__dict__
)


def test_the_protocol_names_what_callers_use() -> None:
    assert {"max_context", "generate", "agenerate", "update_weights", "spec_stats", "close"} <= set(MEMBERS)


@pytest.mark.parametrize("cls", [TorchEngine, SGLangEngine, RayEngine, HFEngine, VLLMEngineAdapter])
def test_engine_has_every_protocol_member(cls: type) -> None:
    missing = [name for name in MEMBERS if not hasattr(cls, name)]
    assert not missing, f"{cls.__name__} lacks {missing}"
    params = inspect.signature(cls.spec_stats).parameters
    assert "reset" in params and params["reset"].default is False


def test_an_engine_that_does_not_speculate_reports_zeros() -> None:
    assert VLLMEngineAdapter.spec_stats(object.__new__(VLLMEngineAdapter)) == SpecStats()
