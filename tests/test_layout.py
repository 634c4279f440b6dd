"""The package's floor plan: one file name per module, a small root, and old import paths kept."""

from __future__ import annotations

import importlib
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


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("srt_agent.messages", "Message", "srt_agent.chat.messages"),
        ("srt_agent.policy", "Policy", "srt_agent.env.episode_loop"),
        ("srt_agent.registration", "register_env", "srt_agent.env.registration"),
        ("srt_agent.spaces", "MessagesSpace", "srt_agent.env.spaces"),
        ("srt_agent.testing", "check_multiturn_env", "srt_agent.env.testing"),
        ("srt_agent.tool_parser", "parse_tool_calls", "srt_agent.tool.parser"),
        ("srt_agent.toolset", "ToolSet", "srt_agent.tool.toolset"),
        ("srt_agent.env", "MultiTurnEnv", "srt_agent.env.multi_turn"),
        ("srt_agent.tool", "tool", "srt_agent.tool.definition"),
    ],
)
def test_old_import_paths_name_the_moved_objects(old: str, name: str, new: str) -> None:
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)
