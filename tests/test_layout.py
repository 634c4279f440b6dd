"""The package's floor plan: one file name per module, a small root, a lazy top level."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import srt_agent

PACKAGE = Path(srt_agent.__file__).parent


def test_no_two_modules_share_a_file_name() -> None:
    names = Counter(p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert [name for name, n in names.items() if n > 1] == []


def test_package_root_holds_at_most_eight_modules() -> None:
    assert len(list(PACKAGE.glob("*.py"))) <= 8


def test_every_top_level_name_is_the_object_of_its_module() -> None:
    assert sorted(srt_agent.__all__) == sorted(srt_agent._EXPORTS)
    for name in srt_agent.__all__:
        module = importlib.import_module(srt_agent._EXPORTS[name])
        assert getattr(srt_agent, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="no attribute 'policy'"):
        _ = srt_agent.policy  # type: ignore[attr-defined]  # the 0.1.0 module paths are gone


def test_importing_the_tree_cache_does_not_import_gymnasium() -> None:
    code = "import sys, srt_agent.tree_cache; assert 'gymnasium' not in sys.modules, 'gymnasium imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
