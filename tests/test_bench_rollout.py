"""``srt-agent bench rollout`` on a tiny random model: every configuration runs, figures are sane."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from chat_fixtures import save_tiny_llama
from rich.console import Console
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.config.sections import SpecSection
from srt_agent.speed.rollout_report import bench_rollout, headline, limits, markdown_table, step_split_line
from srt_agent.speed.rollout_speed import CONFIGS, RolloutBenchConfig, run_rollout_bench

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def tiny(model_dir: Path, **kw: object) -> RolloutBenchConfig:
    settings: dict[str, object] = {
        "envs": ("srt/Calculator-v0",), "prompts": 2, "samples": 2, "rounds": 2, "max_new_tokens": 8,
        "max_turns": 2, "latency_s": 0.05, "max_batch_size": 4,
    }  # fmt: skip
    return RolloutBenchConfig(model_dir, **{**settings, **kw})  # type: ignore[arg-type]


def test_every_configuration_runs_and_the_json_has_the_headline_keys(model_dir: Path, tmp_path: Path) -> None:
    config = tiny(model_dir)
    out = io.StringIO()
    record = bench_rollout(
        config,
        json_path=tmp_path / "b.json",
        plot_path=tmp_path / "b.png",
        console=Console(file=out, width=200),
    )
    assert json.loads((tmp_path / "b.json").read_text()) == record
    assert (tmp_path / "b.png").stat().st_size > 1000
    assert "| config | rounds | wall-clock | vs SRT off |" in out.getvalue()
    keys = {
        "srt_speedup", "srt_no_runahead_speedup", "srt_speedup_last_round", "srt_speedup_calculator",
        "srt_forward_ratio", "tokens_per_forward", "acceptance_rate", "mean_accepted", "hit_rate_exact",
        "hit_rate_task", "hit_rate_global", "runahead_tokens", "runahead_accepted_tokens", "token_prob",
        "useless_drafts_ratio", "cache_only_ratio", "hf_generate_ratio", "prompt_lookup_ratio",
        "latency200_runahead_acceptance", "latency200_no_runahead_acceptance",
        "latency200_runahead_speedup", "latency200_runahead_tokens", "latency200_prediction_hit_rate",
        "rounds", "prompts", "samples", "drift", "threads", "decode_share", "srt_speedup_ceiling",
        "srt_speedup_no_capture", "off_prefill_capture_s", "srt_speedup_ceiling_calculator",
        "off_engine_start_s", "srt_warm_up_s", "srt_warm_up_capture_s", "srt_unwarmed_shapes",
        "srt_unwarmed_runs", "off_prefill_replays",
        "hf_generate_engine_start_s",
    }  # fmt: skip
    assert keys <= set(record), keys - set(record)
    for c in CONFIGS:
        if c != "server":  # runs only with a server URL (tests/test_serving.py)
            assert record[f"{c}_wall_s"] > 0 and record[f"{c}_tokens"] > 0
    for key in ("srt_speedup", "srt_no_runahead_speedup", "useless_drafts_ratio", "cache_only_ratio"):
        assert 0 < record[key] < 100
    for key in ("acceptance_rate", "latency200_runahead_acceptance", "hit_rate_task", "token_prob"):
        assert 0 <= record[key] <= 1
    assert record["tokens_per_forward"] >= 1 and record["off_tokens_per_forward"] == 1
    assert record["off_engine_start_s"] > 0 and record["srt_warm_up_s"] == 0  # no static steps on a CPU
    # Same seeds, exact verification: every TorchEngine configuration generated the same tokens.
    torch_engine = (
        "off", "srt", "srt_no_runahead", "useless", "cache_only", "latency_srt", "latency_srt_no_runahead"
    )  # fmt: skip
    assert len({record[f"{c}_tokens"] for c in torch_engine}) == 1


def test_rollouts_on_static_steps_capture_nothing_mid_run(model_dir: Path) -> None:
    """build_runtime warms the static steps up for the rollout's sampling before the first batch
    (on a CPU they run uncaptured: the same shapes a GPU captures), so a rollout meets none it
    did not build, drafts and prefills included."""
    from srt_agent.rollout.config import RolloutConfig
    from srt_agent.rollout.episode import EpisodeRequest
    from srt_agent.rollout.scheduler import rollout_sync
    from srt_agent.runtime import build_runtime
    from srt_agent.tree_cache import TreeCache

    rollout = RolloutConfig(max_concurrent=4, max_new_tokens=8, temperature=0.0)  # greedy: drafts repeat
    options = {"max_turns": 2}
    specs = [EpisodeRequest("srt/Calculator-v0", s, t, env_options=options) for s in (1, 2) for t in (0, 1)]
    with build_runtime(model_dir, rollout, draft_source=TreeCache(), cuda_graphs=True) as runtime:
        engine = runtime.engine
        stats = engine.stats()  # type: ignore[union-attr]
        assert stats.warm_shapes > 0 and stats.warm_up_s > 0
        for _ in range(2):  # the second round drafts from the first's cache
            batch = rollout_sync(runtime.scheduler, specs)
        after = engine.stats()  # type: ignore[union-attr]
        verified = engine.spec_stats()  # type: ignore[union-attr]
    assert all(t.status in ("ok", "truncated") for t in batch.trajectories) and batch.metrics.live_tokens > 0
    assert verified.verify_forwards > 0 and verified.nodes_accepted > 0  # the verify shapes ran
    assert after.unwarmed_shapes == 0 and after.prefill_forwards > 0
    # The per-step split: decode and verify steps and prefills timed apart, each with the static
    # steps' device share (their whole forward here, uncaptured on a CPU) inside it.
    v = verified
    assert 0 < v.verify_device_s <= v.verify_step_s and 0 < v.decode_device_s <= v.decode_step_s
    assert 0 < v.prefill_device_s <= v.prefill_s
    assert v.decode_step_s + v.verify_step_s + v.prefill_s <= v.step_s
    assert abs(v.decode_device_s + v.verify_device_s + v.prefill_device_s - v.device_s) < 1e-6


def test_results_per_round_and_the_table(model_dir: Path) -> None:
    config = tiny(model_dir, configs=("srt", "hf_generate"), rounds=3, hf_rounds=2)
    results = run_rollout_bench(config)
    assert config.configs == ("off", "srt", "hf_generate")  # off is always there: the reference
    rounds = {c: sorted(r.round for r in results if r.config == c) for c in config.configs}
    assert rounds == {"off": [0, 1, 2], "srt": [0, 1, 2], "hf_generate": [0, 1]}
    # Round by round, plain and speculative decoding generated the same tokens (same seeds and
    # weights, exact verification).
    tokens = {(r.config, r.round): r.metrics.live_tokens for r in results}
    assert all(tokens[("off", k)] == tokens[("srt", k)] for k in range(3))
    assert all(r.metrics.spec.target_forwards > 0 for r in results if r.config != "hf_generate")
    table = markdown_table(config, results)
    assert table.count("\n") == 1 + 3 and "| srt | 3 |" in table and "| hf_generate | 2 |" in table
    record = headline(config, results)
    assert "useless_drafts_ratio" not in record and "latency200_runahead_acceptance" not in record


def test_srt_drafts_and_accepts_in_the_bench(model_dir: Path) -> None:
    """Greedy rounds over the same prompts: later rounds replay earlier ones from the tree cache.

    Run-ahead takes every free row (on a CPU the engine's ledger would soon stop it: its rows cost),
    and every step verifies the full budget: how much the cost model drafts follows the measured
    step times, which a loaded machine moves (tokens per forward 1.46 in one CI run, 1.5+ alone).
    """
    free_rows = SpecSection.model_validate(
        {"runahead_slowdown": 10, "run_ahead": True, "adaptive": False}  # on, on a CPU too
    )
    config = tiny(model_dir, configs=("srt",), rounds=3, temperature=0.0, spec_options=free_rows)
    results = run_rollout_bench(config)
    tokens = {(r.config, r.round): r.metrics.live_tokens for r in results}
    assert all(tokens[("off", k)] == tokens[("srt", k)] for k in range(3))
    assert sum(r.metrics.spec.nodes_accepted for r in results if r.config == "srt") > 0
    record = headline(config, results)
    assert record["tokens_per_forward"] > 1.5
    # Each kind of step priced apart (no static steps here: no device share).
    assert record["srt_ms_per_verify_step"] > 0 and record["off_ms_per_decode_step"] > 0
    assert record["srt_verify_step_cost"] == pytest.approx(
        record["srt_ms_per_verify_step"] / record["off_ms_per_decode_step"], abs=1e-3
    )
    assert record["off_ms_per_prefill"] > 0 and record["off_device_ms_per_prefill"] == 0
    assert record["off_prefill_rows"] >= record["off_prefill_forwards"] > 0
    assert record["off_prefill_tokens"] >= record["off_prefill_rows"]
    assert "off_ms_per_verify_step" not in record  # off never verifies
    assert "a verify step costs" in step_split_line(record)


def test_bad_settings_and_a_missing_model_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown bench configurations"):
        RolloutBenchConfig(tmp_path, configs=("srt", "turbo"))
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        RolloutBenchConfig(tmp_path, rounds=0)
    with pytest.raises(ValueError, match="backoff_window must be >= 0"):
        RolloutBenchConfig(tmp_path, backoff_window=-1)
    with pytest.raises(ValueError, match="backoff_window"):  # the tree cache's own bound
        RolloutBenchConfig(tmp_path, backoff_window=20)
    with pytest.raises(ValueError, match="draws"):
        RolloutBenchConfig(tmp_path, draws="bogus")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="asks for CUDA"):
            RolloutBenchConfig(tmp_path, device="cuda")
    result = CliRunner().invoke(app, ["bench", "rollout", "--model", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in " ".join(result.output.split())


def test_limits_give_the_ceiling_from_offs_own_split() -> None:
    """Free decode steps leave prefills, tool waits and the driver: that bounds any drafting."""
    record = {
        "off_wall_s": 10.0,
        "off_forward_s": 5.0,  # 1 s of it capturing decode shapes (2 s captured, 1 s of prefills)
        "off_graph_capture_s": 2.0,
        "off_prefill_capture_s": 1.0,
        "srt_wall_s": 9.0,
        "srt_graph_capture_s": 3.0,
    }
    got = limits(record)
    assert got["decode_share"] == 0.4
    assert got["srt_speedup_ceiling"] == pytest.approx(1 / 0.6, abs=1e-3)
    assert got["srt_speedup_no_capture"] == pytest.approx(8.0 / 6.0, abs=1e-3)
    assert limits({"off_wall_s": 10.0}) == {}  # no split: nothing claimed
    no_srt = limits({"off_wall_s": 4.0, "off_forward_s": 1.0})  # a CPU run: no capture keys
    assert no_srt == {"decode_share": 0.25, "srt_speedup_ceiling": pytest.approx(4 / 3, abs=1e-3)}


def test_profile_dir_profiles_an_extra_untimed_round_of_off_and_srt(model_dir: Path, tmp_path: Path) -> None:
    config = tiny(model_dir, configs=("srt", "useless"), rounds=1, profile_dir=tmp_path / "prof")
    figures: dict[str, float | int | str] = {}
    results = run_rollout_bench(config, engine_figures=figures)
    assert sorted(r.round for r in results if r.config == "off") == [0]  # the extra round is not a result
    # Nor in the engine's counters: beyond the timed round's steps, only the untimed warm-up's
    # (a 16-token greedy generation: at most 15 decode steps).
    timed = sum(r.metrics.spec.target_forwards for r in results if r.config == "off")
    assert 0 <= int(figures["off_decode_steps"]) - timed <= 15
    assert sorted(p.name for p in (tmp_path / "prof").iterdir()) == ["off.txt", "srt.txt"]
    off = (tmp_path / "prof" / "off.txt").read_text()
    assert "srt.prefill:" in off and "srt.decode_step:" in off and "srt.verify_step" not in off
    srt = (tmp_path / "prof" / "srt.txt").read_text()
    assert "srt.draft:" in srt and "srt.prefill:" in srt  # (whether it verifies is the cost model's call)
    assert "profile_dir" not in headline(config, results)  # a setting, not a figure (and not JSON)
