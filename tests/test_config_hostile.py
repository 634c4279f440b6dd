"""Hostile run configs: YAML that expands without bound fails fast, with a ConfigError naming the file.

A few hundred bytes of nested YAML aliases (a "billion laughs") expand to hundreds of millions of
values; before the loader refused them, echoing one in an error message took a minute and
gigabytes and ended in MemoryError.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srt_agent.config import ConfigError, load_config
from srt_agent.config.spec_file import load_spec


def _bomb(levels: int = 9, width: int = 9) -> list[str]:
    """Lines ``a: &a [lol, ...]``, ``b: &b [*a, *a, ...]``, ...: the last expands to width**levels."""
    names = "abcdefghijklmnopqrstuvwxyz"[:levels]
    lines = [f"a: &a [{', '.join(['lol'] * width)}]"]
    for prev, name in itertools.pairwise(names):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * width)}]")
    return lines


def _indented(lines: list[str], spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in lines)


def _fails_fast(*args: object) -> str:
    """The single problem ``load_config(*args)`` reports, checked to come in under 2 seconds."""
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config(*args)  # type: ignore[arg-type]
    assert time.perf_counter() - start < 2.0
    (problem,) = info.value.problems
    assert len(str(info.value)) < 1000
    return problem


@pytest.fixture
def bomb_file(tmp_path: Path) -> Path:
    path = tmp_path / "bomb.yaml"
    path.write_text("laughs:\n" + _indented(_bomb(), 2))  # an unknown section
    assert len(path.read_bytes()) < 500
    return path


def test_alias_bomb_under_an_unknown_section_fails_fast(bomb_file: Path) -> None:
    problem = _fails_fast(bomb_file)
    assert problem == (
        f"{bomb_file}: YAML aliases expand to more than 100000 values (an alias bomb?); write the values out"
    )


def test_alias_bomb_under_a_known_key_fails_fast(tmp_path: Path) -> None:
    steps = tmp_path / "steps.yaml"  # an integer field given the bomb: its error echoes the value
    steps.write_text("env:\n  options:\n" + _indented(_bomb(), 4) + "trainer:\n  steps: *i\n")
    assert "alias bomb" in _fails_fast(steps)
    options = tmp_path / "options.yaml"  # free-form options: validation passes it on unwalked
    options.write_text("env:\n  options:\n" + _indented(_bomb(), 4))
    assert "alias bomb" in _fails_fast(options)


def test_alias_bomb_in_an_override_fails_fast() -> None:
    flow = "{" + ", ".join(_bomb()) + "}"
    problem = _fails_fast(None, [f"env.options={flow}"])
    assert problem.startswith("override 'env.options={a: &a [lol, lol, ") and problem.endswith(
        "': YAML aliases expand to more than 100000 values (an alias bomb?); write the values out"
    )
    assert len(problem) < 250  # the override is echoed shortened


def test_long_string_named_many_times_fails_fast(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    path.write_text(f"env:\n  options:\n    s: &s {'x' * 1_000_000}\n    l: [{', '.join(['*s'] * 20)}]\n")
    assert "more than 10000000 characters" in _fails_fast(path)


def test_alias_loop_and_deep_nesting_are_config_errors(tmp_path: Path) -> None:
    loop = tmp_path / "loop.yaml"
    loop.write_text("env:\n  options:\n    a: &a [1, *a]\n")
    assert "a YAML alias is used inside the value it names" in _fails_fast(loop)
    deep = tmp_path / "deep.yaml"
    deep.write_text("env:\n  options:\n    a: " + "[" * 300 + "]" * 300 + "\n")
    assert _fails_fast(deep) == f"{deep}: the YAML is nested more than 100 levels deep"
    assert "nested more than 100 levels deep" in _fails_fast(None, ["env.options.a=" + "[" * 1000])
    nested = load_config(None, ["env.options.a=" + "[" * 90 + "]" * 90]).env.options["a"]
    for _ in range(89):
        (nested,) = nested
    assert nested == []


def test_a_few_anchors_still_load(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "env:\n  options: &opts {max_steps: 3, families: [a, b]}\n"
        "spec:\n  cache: &cache {byte_budget: 1024}\n"
        "algo: {kl: {coef: &c 0.1}, entropy_coef: *c}\n"
        "trainer: {steps: &n 4, eval_every: *n}\n"
    )
    cfg = load_config(path)
    assert cfg.env.options == {"max_steps": 3, "families": ["a", "b"]}
    assert (cfg.algo.kl.coef, cfg.algo.entropy_coef, cfg.trainer.steps, cfg.trainer.eval_every) == (
        0.1,
        0.1,
        4,
        4,
    )
    assert cfg.flat()["env.options.families"] == ["a", "b"]
    # 9**4 = 6561 values from aliases: well under the budget.
    small = tmp_path / "small.yaml"
    small.write_text("env:\n  options:\n" + _indented(_bomb(levels=5), 4))
    assert len(load_config(small).flat()["env.options.e"]) == 9


def test_long_values_and_overrides_are_echoed_short() -> None:
    for override in (
        "trainer.steps" + "x" * 100_000,  # malformed: no "="
        "trainer.steps=[" + ", ".join(["1"] * 5_000) + "]",
        "trainer.steps=" + "x" * 100_000,
    ):
        with pytest.raises(ConfigError) as info:
            load_config(None, [override])
        assert len(str(info.value)) < 500, str(info.value)[:600]


def test_the_spec_options_file_is_guarded_too(tmp_path: Path, bomb_file: Path) -> None:
    with pytest.raises(ConfigError, match="alias bomb"):
        load_spec(bomb_file)
    bare = tmp_path / "spec.yaml"
    bare.write_text("max_draft_tokens: true\n")
    with pytest.raises(ConfigError, match=r"spec\.max_draft_tokens = True: must be an integer \(got bool\)"):
        load_spec(bare)


def test_train_cli_refuses_the_bomb_with_one_line(bomb_file: Path) -> None:
    from srt_agent.cli import app

    start = time.perf_counter()
    result = CliRunner().invoke(app, ["train", str(bomb_file)])
    assert time.perf_counter() - start < 5.0
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())  # the console wraps long lines
    assert text == (
        f"error: invalid run config: {bomb_file}: YAML aliases expand to more than 100000 values (an alias "
        "bomb?); write the values out"
    )
