"""Envs in worker processes (``env_isolation="process"``): same episodes as in-process, and an env
that crashes, exits or hangs costs its own episode only."""

from __future__ import annotations

import io
import time
from dataclasses import replace

import gymnasium as gym
import pytest
from fault_injection import ENV_FAULTS, PROCESS_FAULTS
from rich.console import Console
from scripted_engine import ScriptedEngine
from test_rollout_support import oracle_responder, oracles, tiny_format

from srt_agent.env.chaos import faults_seed
from srt_agent.env.registration import register_env, registered_isolation
from srt_agent.evaluation import eval_command
from srt_agent.rollout import EpisodeRequest, RolloutConfig
from srt_agent.rollout.env_processes import EnvProcessPool
from srt_agent.rollout.scheduler import RolloutScheduler, rollout_sync

ENVS = ("Calculator", "Retail")


def _engine(specs: list[EpisodeRequest]) -> ScriptedEngine:
    fmt = tiny_format()
    by_task = {}
    for base in ENVS:
        by_task.update(oracles(f"srt/{base}-v0", range(len(specs))))
    return ScriptedEngine(fmt, oracle_responder(fmt, by_task), max_context=1 << 16)


def test_episodes_in_processes_equal_in_process_ones_and_faults_cost_their_episode_only() -> None:
    faults = [*ENV_FAULTS, *PROCESS_FAULTS]
    specs = [
        EpisodeRequest(
            f"soak/{ENVS[i % 2]}-v0",
            seed=i,
            episode_id=f"{i}-{fault or 'ok'}",
            env_options={"fault": fault, "hang_s": 30.0},
        )
        for i, fault in enumerate(["", *faults, "", "", ""])
    ]
    healthy = [s for s in specs if not s.env_options["fault"]]
    fmt = tiny_format()
    deadlines = {"env_step_timeout_s": 1.0, "env_setup_timeout_s": 3.0}  # 8 workers start on 2 cores
    in_process = RolloutScheduler(_engine(specs), fmt, RolloutConfig(max_concurrent=8, **deadlines))
    ref = {t.episode_id: t for t in rollout_sync(in_process, healthy).trajectories}
    scheduler = RolloutScheduler(
        _engine(specs), fmt, RolloutConfig(max_concurrent=8, env_isolation="process", **deadlines)
    )
    t0 = time.perf_counter()
    try:
        got = {t.episode_id: t for t in rollout_sync(scheduler, specs).trajectories}
        pool = scheduler.env_processes
        assert pool is not None
        wall = time.perf_counter() - t0
        for spec in specs:
            fault, t = str(spec.env_options["fault"]), got[spec.episode_id]
            if not fault:
                r = ref[spec.episode_id]
                assert (t.status, t.token_ids, t.logprobs, t.total_reward, t.success) == (
                    r.status, r.token_ids, r.logprobs, r.total_reward, r.success
                )  # fmt: skip
                assert t.setup_s > 0 and all(turn.env_s > 0 for turn in t.turns[:-1])
            else:
                expected = {**ENV_FAULTS, **PROCESS_FAULTS}[fault]
                assert t.status == "failed" and expected in t.reason, (fault, t.reason)
        # The hangs were cut at their deadlines (their processes killed), not waited out for 30 s.
        assert wall < 20, wall
        assert "its process was killed" in got["3-reset-hang"].reason
        assert "env raised EnvProcessDied" in got["10-reset-segfault"].reason
        # Killed: the two hangs and the two crashes. Healthy workers were reused, not restarted each time.
        assert pool.lost == 4 and pool.started < len(specs)
        assert pool.busy == 0 and pool.alive <= 8  # every worker given back (a failed make's too)
    finally:
        scheduler.close()
    assert pool.alive == 0


def test_an_env_registered_for_processes_runs_in_one_without_the_rollout_asking() -> None:
    register_env("test-iso/Crashy-v0", "srt_agent.env.chaos:FaultyEnv", isolation="process")
    assert registered_isolation("test-iso/Crashy-v0") == "process"
    assert registered_isolation("srt/Calculator-v0") == "thread"
    with pytest.raises(ValueError, match="isolation must be"):
        register_env("test-iso/Bad-v0", "srt_agent.env.chaos:FaultyEnv", isolation="fork")  # type: ignore[arg-type]
    scheduler = RolloutScheduler(_engine([]), tiny_format(), RolloutConfig())
    assert scheduler._factory("test-iso/Crashy-v0") is not None  # a pool of processes
    assert scheduler._factory("srt/Calculator-v0") is None  # this process
    scheduler.close()


def test_eval_with_process_isolation_survives_an_env_that_segfaults_on_some_resets() -> None:
    """The reliability bar in small: 5% of resets segfault; the other episodes complete, exit 0."""
    env = "srt_agent.env.chaos:chaos/Calculator-v0"
    options = {"fault": "reset-segfault", "rate": 0.05}
    crashing = [s for s in range(40) if faults_seed(s, 0.05)]
    assert 1 <= len(crashing) <= 4  # the seeds are fixed: this run has crashes, and few
    specs = [EpisodeRequest(env, seed=s) for s in range(40)]
    engine = _engine(specs)
    out = io.StringIO()
    code = eval_command(
        env, engine, fmt=tiny_format(), episodes=40, k=1, console=Console(file=out, width=200),
        isolation="process", env_options=options,
    )  # fmt: skip
    text = out.getvalue()
    assert code == 0, text
    assert f"{len(crashing)} episode(s) failed" in text and "killed by signal 11 (SIGSEGV)" in text


def test_a_pool_retires_workers_and_closes_them_all() -> None:
    pool = EnvProcessPool(2, max_episodes=2)
    try:
        for i in range(5):
            env = pool(EpisodeRequest("srt/GuessNumber-v0", seed=i, episode_id=f"g{i}"))
            obs, _ = env.reset(seed=i)
            assert obs and env.unwrapped is env
            env.close()
        assert pool.started == 3 and pool.lost == 0  # each worker served two episodes
        with pytest.raises(gym.error.Error):
            pool(EpisodeRequest("srt/Nope-v0", episode_id="x"))
    finally:
        pool.close()
    assert pool.alive == 0


def test_an_env_error_keeps_its_type_across_the_process() -> None:
    pool = EnvProcessPool(1)
    try:
        spec = EpisodeRequest("soak/Calculator-v0", seed=0, env_options={"fault": "step-raise"})
        env = pool(replace(spec, env_id="fault_injection:soak/Calculator-v0"))
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match="injected in step"):
            env.step("hi")
        env.close()
        assert pool.lost == 0 and pool.alive == 1  # an exception is not a crash: the worker lives on
    finally:
        pool.close()
