"""benchmarks/draft_ceiling.py: the oracle's expected accepted tokens, by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def _script() -> ModuleType:
    path = Path(__file__).parents[1] / "benchmarks" / "draft_ceiling.py"
    spec = importlib.util.spec_from_file_location("draft_ceiling", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mode_chain_gain_by_hand() -> None:
    gain = _script().mode_chain_gain
    # From position 0 the draft covers the 2 tokens after the emitted one: 0.5 + 0.5 * 0.5.
    assert gain([0.5, 0.5, 1.0], 8) == pytest.approx([0.75, 0.5, 0.0])
    assert gain([0.5, 0.5, 1.0], 1) == pytest.approx([0.5, 0.5, 0.0])  # one drafted token at most
    assert gain([1.0] * 5, 3) == pytest.approx([3.0, 3.0, 2.0, 1.0, 0.0])
