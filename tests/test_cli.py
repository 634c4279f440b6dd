import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import srt_agent
from srt_agent.cli import app
from srt_agent.play import play
from srt_agent.testing import GenericTestEnv

runner = CliRunner()


def test_envs_lists_builtins_with_tools() -> None:
    result = runner.invoke(app, ["envs"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for env_id in ("srt/Calculator-v0", "srt/Retail-v0", "srt/GuessNumber-v0"):
        assert env_id in result.output
    assert "calculator" in result.output and "find_user_id_by_email" in result.output


@pytest.mark.parametrize("env_id", ["srt/Calculator-v0", "srt/Retail-v0", "srt/GuessNumber-v0"])
def test_play_oracle_reaches_reward_one(env_id: str) -> None:
    result = runner.invoke(app, ["play", env_id, "--oracle", "--seed", "3"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Episode terminated" in result.output and "reward 1;" in result.output


def test_play_unknown_env_exits_2_with_choices() -> None:
    result = runner.invoke(app, ["play", "srt/Retial-v0"])
    assert result.exit_code == 2
    assert "srt/Retail-v0" in result.output and "unknown env id" in result.output


def test_play_bad_option_exits_2() -> None:
    result = runner.invoke(app, ["play", "srt/GuessNumber-v0", "--max-turns", "0"])
    assert result.exit_code == 2 and "max_turns" in result.output


def test_demo_writes_flat_json(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    args = ["demo", "--quiet", "--episodes", "5", "--seed", "10", "--json", str(out)]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["episodes"] == 5 and record["seed"] == 10
    for key in ("srt_Retail_v0", "srt_Calculator_v0", "srt_GuessNumber_v0"):
        assert record[f"{key}_success_rate"] == 1.0 and record[f"{key}_truncated"] == 0
        assert record[f"{key}_mean_turns"] >= 2
    assert all(not isinstance(v, (dict, list)) for v in record.values())


def test_demo_prints_the_last_transcript() -> None:
    result = runner.invoke(app, ["demo", "--seed", "2"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "srt/Retail-v0: last episode (seed 2)" in result.output and "<tool_call>" in result.output


def test_human_play_runs_typed_tool_calls_for_real() -> None:
    lines = iter(
        [
            "/help",
            '<tool_call>{"name": "echo", \\',
            '"arguments": {"text": "typed by a person"}}</tool_call>',
            "",
            "the answer is 42",
        ]
    )
    console = Console(record=True, width=120)
    result = play(GenericTestEnv(), seed=0, oracle=False, console=console, read_line=lambda _: next(lines))
    assert result is not None and result.total_reward == 1.0 and result.turns == 2
    assert result.transcript[3].content == "typed by a person"
    assert "Tool calls are written as" in console.export_text()


def test_human_play_quit_and_eof() -> None:
    console = Console(record=True, width=120)
    assert play(GenericTestEnv(), seed=0, oracle=False, console=console, read_line=lambda _: "/quit") is None

    def eof(_: str) -> str:
        raise EOFError

    assert play(GenericTestEnv(), seed=0, oracle=False, console=console, read_line=eof) is None
    assert "Stopped." in console.export_text()
    assert srt_agent.registered_envs()


def test_build_model_with_an_unknown_preset_exits_2_with_choices(tmp_path: Path) -> None:
    result = runner.invoke(app, ["build-model", "--out", str(tmp_path / "m"), "--preset", "big"])
    assert result.exit_code == 2
    assert "unknown build preset 'big'" in result.output and "embedded, tool-choice" in result.output
    assert not (tmp_path / "m").exists()  # nothing built


def test_unwritable_json_path_fails_before_the_run(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for args in (
        ["eval", "--env", "srt/Calculator-v0", "--model", str(tmp_path), "--json", str(a_file / "r.json")],
        ["demo", "--json", str(a_file / "r.json")],
        ["eval", "--env", "srt/Calculator-v0", "--model", str(tmp_path), "--trace", str(tmp_path)],
    ):
        result = runner.invoke(app, args)
        text = " ".join(result.output.split())  # the console wraps long lines
        assert result.exit_code == 2, text
        assert "cannot create its folder" in text or "is a folder; give a file path" in text, text
        assert "Traceback" not in text
