"""One path for speculation options: a run config's `spec` section reaches every engine a command builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from train_fixtures import save_tiny_policy

from srt_agent.bench.rollout import RolloutBenchConfig
from srt_agent.config.loader import ConfigError
from srt_agent.config.spec_file import load_spec, sglang_refusals
from srt_agent.evaluation.runner import _load
from srt_agent.integrations.sglang.launch import server_env
from srt_agent.integrations.sglang.plugin import SPEC_FILE_VARIABLE, worker_cache_config
from srt_agent.rollout.config import RolloutConfig

SPEC = {
    "max_draft_tokens": 3,
    "cache": {"byte_budget": 3_000_000, "backoff_window": 1},
    "run_ahead": {"max_in_flight": 5},
}


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"spec": SPEC}))
    return path


def test_load_spec_reads_the_spec_section_or_gives_the_defaults(spec_file: Path) -> None:
    spec = load_spec(spec_file)
    assert (spec.max_draft_tokens, spec.cache.backoff_window, spec.run_ahead.max_in_flight) == (3, 1, 5)
    assert load_spec(None) == load_spec(None, ())
    assert load_spec(spec_file, ["spec.max_draft_tokens=5"]).max_draft_tokens == 5
    with pytest.raises(ConfigError, match=r"spec\.cache\.windw"):
        load_spec(None, ["spec.cache.windw=2"])


def test_eval_engines_take_the_spec_section(spec_file: Path, tmp_path: Path) -> None:
    model = save_tiny_policy(tmp_path / "m")
    runtime = _load(model, RolloutConfig(max_concurrent=2), True, None, None, options=load_spec(spec_file))
    try:
        assert runtime.engine.spec.max_draft_tokens == 3  # type: ignore[attr-defined]
        assert runtime.cache is not None and runtime.cache.config.backoff_window == 1  # type: ignore[attr-defined]
    finally:
        runtime.close()


def test_bench_configurations_start_from_the_spec_section(spec_file: Path, tmp_path: Path) -> None:
    bench = RolloutBenchConfig(tmp_path, spec_options=load_spec(spec_file))
    cache, spec = bench.spec_configs()
    assert (cache.backoff_window, cache.byte_budget, spec.max_draft_tokens) == (1, 3_000_000, 3)
    assert bench.run_ahead().enabled and bench.run_ahead().max_in_flight == 5
    flags = RolloutBenchConfig(
        tmp_path, spec_options=load_spec(spec_file), backoff_window=0, max_draft_tokens=6
    )
    cache, spec = flags.spec_configs()
    assert (cache.backoff_window, spec.max_draft_tokens) == (0, 6)  # flags override the file


def test_the_sglang_worker_reads_the_run_configs_cache(spec_file: Path) -> None:
    env = server_env({}, spec_file=spec_file)
    assert Path(env[SPEC_FILE_VARIABLE]).is_absolute()
    config = worker_cache_config(env)
    assert (config.byte_budget, config.backoff_window) == (3_000_000, 1)
    assert worker_cache_config({**env, "SRT_CACHE_BYTES": "1000"}).byte_budget == 1000
    assert worker_cache_config({}).byte_budget == load_spec(None).cache.byte_budget


def test_options_sglang_cannot_honour_are_refused_with_the_reason() -> None:
    assert sglang_refusals(load_spec(None)) == []
    refused = sglang_refusals(load_spec(None, ["spec.adaptive=false", "spec.enabled=false"]))
    assert any("spec.adaptive = False" in r for r in refused)
    assert any("without --speculative-algorithm" in r for r in refused)
