"""``srt-agent train``: config file plus dotted overrides, --json summary, clear errors (exit code 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from train_fixtures import save_tiny_policy, tiny_settings, write_config
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.train.checkpoint import latest_checkpoint
from srt_agent.train.metrics_log import read_records
from srt_agent.train.summary import SUMMARY_SCHEMA

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


def test_train_applies_overrides_and_writes_the_summary(model_dir: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "tiny.yaml", tiny_settings(model_dir, tmp_path / "ignored"))
    out = tmp_path / "run"
    summary_path = tmp_path / "summary.json"
    args = ["train", str(config), "trainer.steps=1", f"trainer.out_dir={out}", "trainer.baseline_every=1"]
    result = runner.invoke(app, [*args, "--json", str(summary_path)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "held-out success before" in result.output and not (tmp_path / "ignored").exists()
    summary = json.loads(summary_path.read_text())
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["schema"] == SUMMARY_SCHEMA and summary["steps"] == summary["steps_planned"] == 1
    assert {
        "success_before",
        "success_after",
        "improvement",
        "garbled_turn_rate_before",
        "wall_s",
        "build_s",
        "rollout_s",
    } <= summary.keys()
    assert summary["srt_speedup_steps"] == 1 and summary["srt_speedup_mean"] > 0
    assert summary["baseline_token_match_mean"] == 1.0  # same seeds, exact verification: same tokens
    assert (out / "plots" / "reward.png").stat().st_size > 0 and (
        out / "plots" / "rollout_time.png"
    ).is_file()
    (step,) = [r for r in read_records(out / "metrics.jsonl") if r["kind"] == "step"]
    assert step["srt_speedup"] == pytest.approx(step["baseline_rollout_s"] / step["rollout_s"], rel=0.05)
    assert yaml.safe_load((out / "config.yaml").read_text())["trainer"]["baseline_every"] == 1


def test_bad_override_names_the_key_and_exits_2(model_dir: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "tiny.yaml", tiny_settings(model_dir, tmp_path / "run"))
    result = runner.invoke(app, ["train", str(config), "trainer.stpes=3"], env=WIDE)
    assert result.exit_code == 2
    assert "trainer.stpes" in result.output and "did you mean trainer.steps" in result.output


def test_missing_model_without_build_exits_2_with_the_fix(tmp_path: Path) -> None:
    config = write_config(tmp_path / "tiny.yaml", tiny_settings(tmp_path / "no-model", tmp_path / "run"))
    result = runner.invoke(app, ["train", str(config)], env=WIDE)
    assert result.exit_code == 2 and "srt-agent build-model" in result.output


def test_a_second_fresh_run_into_the_same_dir_asks_for_resume(model_dir: Path, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "tiny.yaml", tiny_settings(model_dir, tmp_path / "run", trainer={"steps": 1})
    )
    assert runner.invoke(app, ["train", str(config)], env=WIDE).exit_code == 0
    again = runner.invoke(app, ["train", str(config)], env=WIDE)
    assert again.exit_code == 2 and "--resume" in again.output
    steps = tmp_path / "run" / "metrics.jsonl"
    (first,) = [r for r in read_records(steps) if r["kind"] == "step"]
    resumed = runner.invoke(app, ["train", str(config), "--resume", "trainer.steps=2"], env=WIDE)
    assert resumed.exit_code == 0 and "resuming from step 1" in resumed.output
    # It went on from step 1's checkpoint: step 1 is kept as it was, and only step 2 ran.
    after = [r for r in read_records(steps) if r["kind"] == "step"]
    assert [r["step"] for r in after] == [1, 2] and after[0] == first
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert checkpoint is not None and checkpoint.step == 2


def test_a_missing_model_is_built_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import srt_agent.recipe.build as build

    built: list[Path] = []
    configs: list[object] = []

    def fake_build(out_dir: Path, **kwargs: object) -> Path:  # the real build takes minutes: tested elsewhere
        built.append(Path(out_dir))
        configs.append((kwargs["config"], kwargs["seed"]))
        return save_tiny_policy(Path(out_dir))

    monkeypatch.setattr(build, "ensure_model", fake_build)
    model = tmp_path / "model"
    settings = tiny_settings(model, tmp_path / "run", trainer={"steps": 1})
    settings["model"].update(build_if_missing=True, build_preset="tool-choice", build_seed=3)
    config = write_config(tmp_path / "tiny.yaml", settings)
    result = runner.invoke(app, ["train", str(config), "--json", str(tmp_path / "s.json")], env=WIDE)
    assert result.exit_code == 0, result.output
    assert built == [model] and "Building the tool-choice model" in result.output
    assert configs == [(build.preset_config("tool-choice"), 3)]
    assert json.loads((tmp_path / "s.json").read_text())["build_s"] > 0
    settings["model"].update(dir=str(tmp_path / "model0"), build_seed=0)  # the seed the package ships
    config = write_config(
        tmp_path / "tiny0.yaml",
        settings | {"trainer": {**settings["trainer"], "out_dir": str(tmp_path / "run0")}},
    )
    result = runner.invoke(app, ["train", str(config)], env=WIDE)
    assert result.exit_code == 0 and "Building" not in result.output  # copying it says so itself


def test_a_missing_model_with_building_off_says_how_to_build_it(tmp_path: Path) -> None:
    settings = tiny_settings(tmp_path / "nothing", tmp_path / "run", trainer={"steps": 1})
    settings["model"]["build_preset"] = "tool-choice"
    config = write_config(tmp_path / "tiny.yaml", settings)
    result = runner.invoke(app, ["train", str(config)], env=WIDE)
    assert result.exit_code == 2
    assert "srt-agent build-model --out" in result.output and "--preset tool-choice" in result.output


def test_mistakes_found_before_anything_runs_exit_2(model_dir: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "tiny.yaml", tiny_settings(model_dir, tmp_path / "run"))
    result = runner.invoke(app, ["train", str(config), "env.id=srt/Calculater-v0"], env=WIDE)
    assert result.exit_code == 2 and "env.id: unknown env id 'srt/Calculater-v0'" in result.output
    assert "Did you mean srt/Calculator-v0" in result.output and "Traceback" not in result.output
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    result = runner.invoke(app, ["train", str(config), f"trainer.out_dir={a_file}"], env=WIDE)
    assert result.exit_code == 2 and "trainer.out_dir" in result.output and "is a file" in result.output
    result = runner.invoke(app, ["train", str(config), "--json", str(a_file / "summary.json")], env=WIDE)
    assert result.exit_code == 2 and "--json" in result.output and "cannot create its folder" in result.output
    assert not list((tmp_path / "run").glob("*"))  # nothing ran (the folder was only checked)


def test_the_summary_has_held_out_success_per_task_kind(model_dir: Path, tmp_path: Path) -> None:
    from rich.console import Console

    from srt_agent.config import load_config
    from srt_agent.train.summary import summarize, summary_table

    cfg = load_config(write_config(tmp_path / "tiny.yaml", tiny_settings(model_dir, tmp_path / "run")))
    evals = [
        {"kind": "eval", "step": 0, "success_rate": 0.25, "success_cancel": 0.5, "success_return": 0.0,
         "garbled_turn_rate": 0.125, "mean_progress": 0.5},
        {"kind": "step", "step": 1, "reward_mean": 0.5, "success_rate": 0.5, "success_cancel": 1.0,
         "informative_group_share": 0.25},
        {"kind": "eval", "step": 1, "success_rate": 0.5, "success_cancel": 1.0, "success_return": 0.0,
         "garbled_turn_rate": 0.0, "mean_progress": 0.75},
    ]  # fmt: skip
    summary = summarize(evals, cfg, wall_s=1.0)
    assert (summary["garbled_turn_rate_before"], summary["garbled_turn_rate_after"]) == (0.125, 0.0)
    assert (summary["progress_before"], summary["progress_after"]) == (0.5, 0.75)
    assert summary["informative_group_share_mean"] == 0.25
    assert summary["success_before_cancel"] == 0.5 and summary["success_after_cancel"] == 1.0
    assert summary["success_before_return"] == summary["success_after_return"] == 0.0
    assert "success_before_rate" not in summary and not any(isinstance(v, dict) for v in summary.values())
    console = Console(width=120, record=True)
    console.print(summary_table(summary))
    text = console.export_text()
    assert "cancel: before -> after" in text and "50.0% -> 100.0%" in text
    assert "garbled turns before -> after" in text and "12.5% -> 0.0%" in text
    assert "share of the goal reached" in text and "50.0% -> 75.0%" in text
    assert "groups whose rewards differ" in text and "25.0%" in text
    # One evaluation: every "after" figure falls back to the "before" one.
    once = summarize(evals[:1], cfg, wall_s=1.0)
    after = (once["success_after"], once["garbled_turn_rate_after"], once["success_after_cancel"])
    assert after == (0.25, 0.125, 0.5)
    plain = summarize([r for r in evals if "success_cancel" not in r or r["kind"] == "step"], cfg, wall_s=1.0)
    assert not any(k.startswith("success_after_") for k in plain)  # an env without task kinds
