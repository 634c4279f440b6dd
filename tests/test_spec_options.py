"""One path for speculation options: a run config's `spec` section reaches every engine a command builds."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from train_fixtures import save_tiny_policy, tiny_config
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.config.loader import ConfigError
from srt_agent.config.spec_file import load_spec
from srt_agent.distributed.actors import EngineReplica
from srt_agent.distributed.ray_engine import replica_args
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.evaluation.runner import _load
from srt_agent.integrations.sglang import plugin
from srt_agent.integrations.sglang.launch import server_env
from srt_agent.integrations.sglang.plugin import SPEC_FILE_VARIABLE, worker_cache_config
from srt_agent.integrations.sglang.refusals import sglang_refusals
from srt_agent.rollout.config import RolloutConfig
from srt_agent.runtime import _replica_cache
from srt_agent.speed.rollout_speed import RolloutBenchConfig
from srt_agent.tree_cache import TreeCache
from srt_agent.tree_cache.options import TreeCacheConfig

SPEC = {
    "max_draft_tokens": 3,
    "cache": {"byte_budget": 3_000_000, "backoff_window": 1},
    "run_ahead": {"enabled": True, "max_in_flight": 5},
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


def test_an_options_file_may_hold_the_spec_section_or_the_cache_alone(tmp_path: Path) -> None:
    bare = tmp_path / "spec.json"
    bare.write_text(json.dumps(SPEC))
    assert load_spec(bare) == load_spec(_file(tmp_path / "run.yaml", {"spec": SPEC}))
    cache = _file(tmp_path / "cache.yaml", SPEC["cache"])
    assert load_spec(cache).cache == load_spec(bare).cache
    assert load_spec(cache).max_draft_tokens == load_spec(None).max_draft_tokens
    with pytest.raises(ConfigError, match=r"spec\.cache\.windw"):
        load_spec(_file(tmp_path / "typo.yaml", {"windw": 2, "byte_budget": 10}))


def test_a_server_refuses_a_bare_spec_section_that_runs_ahead(spec_file: Path, tmp_path: Path) -> None:
    bare = _file(tmp_path / "spec.yaml", SPEC)
    with pytest.raises(ConfigError, match=r"spec\.run_ahead = .*a server has no run-ahead queue"):
        load_spec(bare, server=True)
    assert load_spec(bare).run_ahead.max_in_flight == 5  # eval and bench run ahead
    # A run config's run-ahead is its trainer's (the server's client); run-ahead off asks nothing.
    assert load_spec(spec_file, server=True).max_draft_tokens == 3
    off = _file(tmp_path / "off.yaml", {**SPEC, "run_ahead": False})
    assert not load_spec(off, server=True).run_ahead.enabled


def test_eval_engines_take_the_spec_section(spec_file: Path, tmp_path: Path) -> None:
    model = save_tiny_policy(tmp_path / "m")
    runtime = _load(model, RolloutConfig(max_concurrent=2), True, None, None, options=load_spec(spec_file))
    try:
        assert runtime.engine.spec.max_draft_tokens == 3  # type: ignore[attr-defined]
        assert runtime.cache is not None and runtime.cache.config.backoff_window == 1  # type: ignore[attr-defined]
        assert runtime.scheduler.runahead is not None
        assert runtime.scheduler.runahead.config == load_spec(spec_file).run_ahead
    finally:
        runtime.close()
    plain = _load(model, RolloutConfig(max_concurrent=2), False, None, None, options=load_spec(spec_file))
    try:
        assert plain.cache is None and plain.scheduler.runahead is None  # --no-spec: neither
    finally:
        plain.close()


def test_ray_replicas_are_built_with_the_run_configs_cache_and_draft_budget(tmp_path: Path) -> None:
    """Without Ray: the arguments each replica actor gets, and the replica they build in-process."""
    model = save_tiny_policy(tmp_path / "m")
    cfg = tiny_config(model, tmp_path / "run", trainer={"backend": "ray"}, spec=SPEC)
    # What the trainer hands build_runtime: its tree cache (from spec.cache) and spec's engine options.
    args = replica_args(
        model,
        cfg.ray,
        max_batch_size=2,
        cache=_replica_cache(TreeCache(cfg.spec.cache)),
        spec=cfg.spec,
        seed=0,
    )
    assert (args["cache"], args["spec"]) == (cfg.spec.cache, cfg.spec)
    replica = EngineReplica(**args)
    try:
        cache, spec = replica.options()
    finally:
        replica.engine.close()
    assert cache == cfg.spec.cache and spec == cfg.spec
    assert (cache.byte_budget, cache.backoff_window, spec.max_draft_tokens) == (3_000_000, 1, 3)
    no_drafts = replica_args(model, cfg.ray, max_batch_size=2, cache=None, spec=None, seed=0)
    assert no_drafts["cache"] is None and no_drafts["spec"] == SpecConfig()


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
    assert sglang_refusals(load_spec(None), draft_slots=9) == []  # the default 8 drafts + the root
    (contradiction,) = sglang_refusals(load_spec(None), draft_slots=12)
    assert "--speculative-num-draft-tokens 12 contradicts spec.max_draft_tokens = 8" in contradiction


def test_sglang_started_directly_reads_and_checks_the_options_file(
    spec_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = SimpleNamespace(speculative_num_draft_tokens=None, speculative_ngram_max_bfs_breadth=10)
    monkeypatch.setenv(SPEC_FILE_VARIABLE, str(spec_file))
    plugin.validate_server_args(args)
    plugin.ngram_defaults(args, plugin.worker_spec().tree_slots)
    assert args.speculative_num_draft_tokens == 4  # spec.max_draft_tokens = 3, and the root
    with pytest.raises(ValueError, match=r"--speculative-num-draft-tokens 12 contradicts"):
        plugin.validate_server_args(SimpleNamespace(speculative_num_draft_tokens=12))
    monkeypatch.setenv(SPEC_FILE_VARIABLE, str(_file(tmp_path / "fixed.yaml", {"draws": "walk"})))
    with pytest.raises(ValueError, match=r"spec\.draws = 'walk': SGLang's SRT worker has no such option"):
        plugin.validate_server_args(SimpleNamespace(speculative_num_draft_tokens=None))
    monkeypatch.setenv(SPEC_FILE_VARIABLE, str(_file(tmp_path / "ahead.yaml", {"run_ahead": True})))
    with pytest.raises(ConfigError, match="a server has no run-ahead queue"):
        plugin.validate_server_args(SimpleNamespace(speculative_num_draft_tokens=None))
    monkeypatch.delenv(SPEC_FILE_VARIABLE)
    monkeypatch.setenv("SRT_CACHE_BYTES", "-1")
    with pytest.raises(ConfigError, match=r"spec\.cache\.byte_budget = -1"):
        plugin.validate_server_args(SimpleNamespace(speculative_num_draft_tokens=12))


def test_sglang_serve_refuses_draft_tokens_that_contradict_the_options_file(spec_file: Path) -> None:
    result = CliRunner().invoke(
        app, ["sglang-serve", "--model", "m", "--config", str(spec_file), "--draft-tokens", "12"]
    )
    assert result.exit_code == 2
    assert "contradicts spec.max_draft_tokens = 3" in " ".join(result.output.split())


def _file(path: Path, data: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_replicas_tree_cache_leaves_as_bytes_and_a_new_replica_starts_from_them(tmp_path: Path) -> None:
    """Without Ray: what a checkpoint keeps of each replica, and what a resumed replica loads."""
    import asyncio

    from srt_agent.contracts.generation import GenerationRequest, SamplingParams
    from srt_agent.distributed.ray_engine import replica_cache_files, replica_cache_name

    model = save_tiny_policy(tmp_path / "m")
    replica = EngineReplica(model, 2, cache=TreeCacheConfig())
    try:
        request = GenerationRequest("r", (5, 6, 7), SamplingParams(seed=1, max_new_tokens=6), task_id="t")
        asyncio.run(replica.generate(request))
        saved = replica.cache_bytes()
    finally:
        replica.engine.close()
    assert saved is not None and replica.cache_states() == 1
    again = EngineReplica(model, 2, cache=TreeCacheConfig(), cache_file=saved)
    try:
        assert again.cache_states() == 1 and again.cache is not None
        assert again.cache.stats().nodes == replica.cache.stats().nodes  # type: ignore[union-attr]
    finally:
        again.engine.close()
    assert EngineReplica(model, 2).cache_bytes() is None  # SRT off: nothing to keep
    for i in range(2):
        (tmp_path / replica_cache_name(i)).write_bytes(saved)
    (tmp_path / replica_cache_name(3)).write_bytes(saved)  # not contiguous: not a replica's
    assert replica_cache_files(tmp_path) == [tmp_path / replica_cache_name(i) for i in range(2)]
