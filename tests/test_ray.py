"""The Ray backend on a local cluster: 2 engine replicas and 2 env workers on this machine.

The same seeds give the same trajectories as the single-process run (requests carry their seeds,
so which replica serves them does not matter), killing a replica mid-rollout loses no episode,
and weights reach every replica through the object store.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from train_fixtures import save_tiny_policy

from srt_agent.contracts.generation import GenerationRequest, SamplingParams
from srt_agent.distributed.ray_config import RayConfig
from srt_agent.distributed.router import Router
from srt_agent.engine.hf_checkpoint import read_state_dict
from srt_agent.rollout.config import EpisodeRequest, RolloutConfig
from srt_agent.rollout.scheduler import rollout_sync
from srt_agent.runtime import Runtime, build_engine, build_runtime
from srt_agent.tree_cache import TreeCache
from srt_agent.tree_cache.options import TreeCacheConfig

ray = pytest.importorskip("ray")

CONFIG = RayConfig(replicas=2, env_workers=2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


def _specs() -> list[EpisodeRequest]:
    return [
        EpisodeRequest("srt/Calculator-v0", seed=s, trial=t, env_options={"max_turns": 2})
        for s in range(3)
        for t in range(2)
    ]


def _runtime(model_dir: Path, ray_config: RayConfig | None) -> Runtime:
    rollout = RolloutConfig(max_concurrent=6, max_new_tokens=8, seed=3)
    return build_runtime(model_dir, rollout, draft_source=TreeCache(), ray=ray_config)


def _tokens(runtime: Runtime) -> list[tuple[int, ...]]:
    try:
        batch = rollout_sync(runtime.scheduler, _specs())
    finally:
        runtime.close()
    assert all(t.status == "ok" or t.status == "truncated" for t in batch.trajectories), [
        t.error for t in batch.trajectories
    ]
    return [tuple(t.token_ids) for t in batch.trajectories]


def test_replicas_and_env_workers_give_the_single_process_trajectories(
    cluster: None, model_dir: Path
) -> None:
    local = _tokens(_runtime(model_dir, None))
    runtime = _runtime(model_dir, CONFIG)
    engine = runtime.engine
    assert _tokens(runtime) == local
    # Cache-aware routing spread the three tasks over both replicas, all samples of a task on one.
    assert sorted(len(engine.router.tasks_of(r)) for r in range(2)) == [1, 2]  # type: ignore[union-attr]


def test_a_replica_killed_mid_rollout_loses_no_episode(cluster: None, model_dir: Path) -> None:
    local = _tokens(_runtime(model_dir, None))
    runtime = _runtime(model_dir, CONFIG)
    engine = runtime.engine
    killed: list[int] = []

    def kill_once(_: object) -> None:
        if not killed:
            ray.kill(engine.replicas[0])  # type: ignore[union-attr]
            killed.append(0)

    runtime.scheduler.progress = kill_once
    assert _tokens(runtime) == local
    assert killed and engine.replaced >= 1  # type: ignore[union-attr]


def test_an_env_worker_asks_the_envs_own_judge_of_success(cluster: None) -> None:
    """GuessNumber counts any positive reward as solved: found late, its reward is below 1."""
    from srt_agent.distributed.envs import EnvWorkerPool
    from srt_agent.env.registration import make

    local = make("srt/GuessNumber-v0")
    local.reset(seed=5)
    secret, config = local.unwrapped.secret, local.unwrapped.config  # type: ignore[attr-defined]
    local.close()
    wrong = [g for g in range(config.low, config.high + 1) if g != secret][: config.max_turns - 1]
    pool = EnvWorkerPool(1)
    try:
        env = pool.make(EpisodeRequest("srt/GuessNumber-v0", seed=5))
        env.reset(seed=5)
        total = sum(float(env.step(f"Is it {g}?")[1]) for g in wrong)  # the last turn finds it
        total += float(env.step(f"Is it {secret}?")[1])
        env.close()
        assert 0 < total < 1
        assert env.is_success(total, {})  # the env's judge; the default (reward >= 1) says no
        lost = pool.make(EpisodeRequest("srt/GuessNumber-v0", seed=6))
        lost.reset(seed=6)
        lost.step("no number here")
        lost.close()
        assert not lost.is_success(0.0, {})
    finally:
        pool.close()


def test_env_isolation_holds_in_env_workers_an_exiting_env_costs_its_episode_only(cluster: None) -> None:
    """With ``env_isolation: process`` an env that calls ``os._exit`` takes down its own process, not
    the worker and the other episodes on it (run in the worker itself, it would kill them all)."""
    from srt_agent.distributed.envs import EnvWorkerPool
    from srt_agent.env.chaos import faults_seed
    from srt_agent.rollout.env_processes import EnvProcessDied

    env_id = "srt_agent.env.chaos:chaos/GuessNumber-v0"
    bad = next(s for s in range(100) if faults_seed(s, 0.5))
    good = next(s for s in range(100) if not faults_seed(s, 0.5))
    options = {"fault": "step-os-exit", "rate": 0.5}
    pool = EnvWorkerPool(1, RolloutConfig(env_isolation="process", max_concurrent=4))
    try:
        healthy = pool.make(EpisodeRequest(env_id, seed=good, env_options=options))
        doomed = pool.make(EpisodeRequest(env_id, seed=bad, env_options=options))
        healthy.reset(seed=good)
        doomed.reset(seed=bad)
        with pytest.raises(EnvProcessDied, match="exit code 7"):
            doomed.step("Is it 5?")
        doomed.close()
        obs, _, _, _, _ = healthy.step("Is it 5?")  # same worker, still there
        assert obs and pool.replaced == 0
        healthy.close()
        assert healthy.is_success(0.0, {}) is False  # judged in its process as it closed
        ray.get(pool.workers[0].shutdown.remote())  # stops the worker's env processes
    finally:
        pool.close()


def test_weights_reach_every_replica(cluster: None, model_dir: Path, tmp_path: Path) -> None:
    from srt_agent.distributed.ray_engine import RayEngine

    new = read_state_dict(save_tiny_policy(tmp_path / "other", seed=1))
    requests = [
        GenerationRequest(f"r{i}", (5, 6, i + 1), SamplingParams(max_new_tokens=6, seed=i), task_id=f"t{i}")
        for i in range(4)
    ]
    engine = RayEngine(model_dir, CONFIG, max_batch_size=4, cache=TreeCacheConfig())
    try:
        engine.update_weights(new)
        got = engine.generate(requests)
        assert sum(n > 0 for n in engine.cache_states()) == 2  # four tasks over two replicas
    finally:
        engine.close()
    with build_engine(model_dir, max_batch_size=4) as local:
        local.update_weights(new)
        want = local.generate(requests)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_cache_aware_routing_keeps_a_task_on_one_replica() -> None:
    router = Router(3)
    first = [router.pick(f"task{i}") for i in range(6)]
    assert first == [0, 1, 2, 0, 1, 2]  # new tasks go to the least loaded replica
    assert [router.pick(f"task{i}") for i in range(6)] == first  # and stay there
    spread = Router(3, "round_robin")
    assert len({spread.pick("task0") for _ in range(3)}) == 3
    resumed = Router(2)  # a resumed run: tasks go back to the replica holding their history
    resumed.restore({**router.owners(), "gone": 5})
    assert [resumed.pick(f"task{i}") for i in (1, 3, 2)] == [1, 0, 0]  # task2's replica 2 is gone
    assert resumed.pick("new") == 1 and "gone" not in resumed.owners()


def test_training_on_ray_equals_training_in_one_process(
    cluster: None, model_dir: Path, tmp_path: Path
) -> None:
    from train_fixtures import tiny_config

    from srt_agent.train.trainer import Trainer

    def train(**trainer: object) -> list[float]:
        cfg = tiny_config(
            model_dir, tmp_path / str(trainer.get("backend", "local")), trainer=trainer, ray={"replicas": 2}
        )
        run = Trainer(cfg)
        try:
            steps = [r for r in run.run() if r["kind"] == "step"]
        finally:
            run.close()
        return [float(s[k]) for s in steps for k in ("reward_mean", "gen_tokens", "pg_loss")]

    # with the baseline on, the Ray run keeps a second set of replicas (speculation off)
    assert train(backend="ray", baseline_every=1) == pytest.approx(train(baseline_every=1), abs=1e-5)


def test_replicas_that_cannot_be_placed_fail_with_the_reason(cluster: None, model_dir: Path) -> None:
    from srt_agent.distributed.ray_engine import RayEngine

    too_big = RayConfig(replicas=1, replica_cpus=64, start_timeout_s=2)
    with pytest.raises(RuntimeError, match=r"CPUs free and each replica asks for 64"):
        RayEngine(model_dir, too_big, max_batch_size=2)


def test_replicas_run_with_the_run_configs_speculation_options(
    cluster: None, model_dir: Path, tmp_path: Path
) -> None:
    from train_fixtures import tiny_config

    from srt_agent.train.trainer import Trainer

    spec = {
        "max_draft_tokens": 3,
        "probe_interval": 7,
        "cache": {"byte_budget": 3_000_000, "backoff_window": 1},
        "run_ahead": {"enabled": True, "max_in_flight": 3},
    }
    cfg = tiny_config(
        model_dir, tmp_path / "opts", trainer={"backend": "ray"}, ray={"replicas": 2}, spec=spec
    )
    run = Trainer(cfg)
    try:
        engine = run.rollouts.engine
        options = engine.replica_options()  # type: ignore[attr-defined]
        scheduler = run.rollouts.scheduler
    finally:
        run.close()
    assert options == [(cfg.spec.cache, cfg.spec)] * 2
    assert options[0][1].max_draft_tokens == 3 and options[0][0].backoff_window == 1
    # The run-ahead queue feeds the replicas, with the config's settings.
    assert scheduler.runahead is not None and scheduler.runahead.config.max_in_flight == 3


def test_a_custom_draft_source_is_refused_on_ray_with_the_reason(cluster: None, model_dir: Path) -> None:
    from srt_agent.contracts.draft import EMPTY_DRAFT, DraftTree, StaticDraftSource

    class Mine(StaticDraftSource):
        def draft(self, *args: object, **kwargs: object) -> DraftTree:
            return EMPTY_DRAFT

    with pytest.raises(ValueError, match="Mine draft source cannot be copied into the replicas"):
        build_runtime(model_dir, RolloutConfig(max_concurrent=2), draft_source=Mine(), ray=CONFIG)


def test_a_checkpoint_keeps_each_replicas_tree_cache_and_resuming_restores_it(
    cluster: None, model_dir: Path, tmp_path: Path
) -> None:
    from train_fixtures import tiny_config

    from srt_agent.distributed.ray_engine import replica_cache_files
    from srt_agent.train.checkpoint import latest_checkpoint, verify_checkpoint
    from srt_agent.train.trainer import Trainer

    cfg = tiny_config(model_dir, tmp_path / "run", trainer={"backend": "ray"}, ray={"replicas": 2})
    run = Trainer(cfg)
    try:
        list(run.run())
        states = run.rollouts.engine.cache_states()  # type: ignore[attr-defined]
        routes = run.rollouts.engine.router.owners()  # type: ignore[attr-defined]
    finally:
        run.close()
    assert sum(states) > 0  # the replicas drafted from caches their rollouts filled
    ckpt = latest_checkpoint(cfg.trainer.out_dir)
    assert ckpt is not None and verify_checkpoint(ckpt) == []  # the replica files are in the manifest
    files = replica_cache_files(ckpt.path)
    assert [TreeCache.load(f).stats().states for f in files] == states
    more = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"steps": 3})})
    resumed = Trainer(more, resume=True)
    try:
        assert resumed.rollouts.engine.cache_states() == states  # type: ignore[attr-defined]
        assert resumed.rollouts.engine.router.owners() == routes  # type: ignore[attr-defined]
    finally:
        resumed.close()


def _wait_until_dead(actor: object, timeout_s: float = 60.0) -> None:
    """Block until a killed actor refuses calls: ``ray.kill`` returns before the process is gone,
    and a call that races ahead of the kill is still answered by the old replica."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.cache_states.remote(), timeout=10)  # type: ignore[attr-defined]
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError(f"the killed actor still answered after {timeout_s} s")


# A replacement replica starts a Ray worker that imports torch and loads the model: on a loaded
# 2-core machine that alone has taken most of the default 120 s.
@pytest.mark.timeout(300)
def test_a_replica_that_died_idle_is_replaced_when_every_replica_is_asked(
    cluster: None, model_dir: Path
) -> None:
    from srt_agent.distributed.ray_engine import RayEngine

    engine = RayEngine(model_dir, RayConfig(replicas=2), max_batch_size=2, cache=TreeCacheConfig())
    try:
        ray.kill(engine.replicas[1])  # no request of its own in flight: nothing replaced it yet
        _wait_until_dead(engine.replicas[1])
        assert engine.cache_states() == [0, 0]  # asked anyway: replaced, and the new one answers
        assert engine.replaced == 1
        engine.spec_stats()
        engine.update_weights(read_state_dict(model_dir))
        assert engine.replaced == 1
    finally:
        engine.close()
