import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import srt_agent
from srt_agent.cli import app
from srt_agent.env.play import play
from srt_agent.env.testing import GenericTestEnv

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
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # never loaded: the paths are checked first
    for args in (
        ["eval", "--env", "srt/Calculator-v0", "--model", str(model), "--json", str(a_file / "r.json")],
        ["demo", "--json", str(a_file / "r.json")],
        ["eval", "--env", "srt/Calculator-v0", "--model", str(model), "--trace", str(tmp_path)],
    ):
        result = runner.invoke(app, args)
        text = " ".join(result.output.split())  # the console wraps long lines
        assert result.exit_code == 2, text
        assert "cannot create its folder" in text or "is a folder; give a file path" in text, text
        assert "Traceback" not in text


def test_an_env_of_your_own_is_reached_as_module_colon_id(monkeypatch: pytest.MonkeyPatch) -> None:
    examples = Path(__file__).resolve().parents[1] / "examples"
    monkeypatch.chdir(examples)  # the user's folder: custom_env.py lives here, not on sys.path
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(examples))])
    env = srt_agent.make("custom_env:example/Convert-v0")  # imports the module, which registers the id
    env.reset(seed=0)
    unit, amount = env.unwrapped.unit, env.unwrapped.amount  # type: ignore[attr-defined]
    env.close()
    call = f'<tool_call>{{"name": "meters_per", "arguments": {{"unit": "{unit}"}}}}</tool_call>'
    rate = {"kilometer": 1000.0, "mile": 1609.344, "yard": 0.9144}[unit]
    typed = f"{call}\n{amount * rate}\n"
    result = runner.invoke(app, ["play", "custom_env:example/Convert-v0", "--seed", "0"], input=typed)
    text = " ".join(result.output.split())
    assert result.exit_code == 0, text
    assert "reward 1; task convert-" in text, text
    bad = runner.invoke(app, ["play", "no_such_module:example/Convert-v0"])
    assert bad.exit_code == 2 and "cannot import env module 'no_such_module'" in bad.output


def test_commands_find_the_model_you_have_or_say_which_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srt_agent.output.paths import resolve_model_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SRT_AGENT_MODEL", raising=False)
    with pytest.raises(FileNotFoundError, match="build one with `srt-agent build-model`"):
        resolve_model_dir(None)
    (tmp_path / "runs" / "tool-choice-model").mkdir(parents=True)
    (tmp_path / "runs" / "tool-choice-model" / "config.json").write_text("{}")
    path, note = resolve_model_dir(None)  # the quickstart's model, the only one there
    assert path == Path("runs/tool-choice-model") and "the only one under runs/" in note
    (tmp_path / "runs" / "other").mkdir()
    (tmp_path / "runs" / "other" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="models found: runs/other, runs/tool-choice-model; pick one"):
        resolve_model_dir(None)
    result = runner.invoke(app, ["eval", "--env", "srt/Calculater-v0"])
    assert result.exit_code == 2 and "unknown env id" in result.output  # before any model is looked for


def test_heartbeat_prints_progress_where_bars_cannot_show() -> None:
    import io

    from rich.console import Console

    from srt_agent.output.console import Heartbeat

    piped = io.StringIO()
    beat = Heartbeat(Console(file=piped, width=100), "SFT step", 300, every_s=3600)
    for i in range(1, 301):
        beat.update(i, "loss 0.5")
    assert piped.getvalue().splitlines() == ["SFT step 300/300 loss 0.5 (0 s)"]  # rate-limited, then the end
    shown = io.StringIO()
    live = Heartbeat(Console(file=shown, force_terminal=True), "SFT step", 3, every_s=0)
    for i in range(1, 4):
        live.update(i)
    assert shown.getvalue() == ""  # a terminal shows the live bar instead


def test_env_options_are_read_as_run_config_overrides_are() -> None:
    from srt_agent.cli.app import parse_env_options as _env_options

    got = _env_options(["max_turns=4", "lr=1e-4", "ops=[+, '-']", "dataset_options={min_terms: 2}"])
    assert got == {"max_turns": 4, "lr": 1e-4, "ops": ["+", "-"], "dataset_options": {"min_terms": 2}}
    with pytest.raises(ValueError, match=r"--option 'max_turns': write KEY=VALUE"):
        _env_options(["max_turns"])
    with pytest.raises(ValueError, match=r"--option: .*not valid YAML"):
        _env_options(["a=[1, 2"])
    with pytest.raises(ValueError, match=r"--option: .*nested more than 100 levels"):
        _env_options(["a=" + "[" * 200 + "]" * 200])  # the guarded reader's bound, as for overrides
    result = runner.invoke(app, ["play", "srt/Calculator-v0", "-o", "max_turns"])
    assert result.exit_code == 2 and "write KEY=VALUE" in result.output
