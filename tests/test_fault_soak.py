"""A fault-injection soak: hundreds of episodes across the built-in envs, a tenth of them with an
injected env or tool fault (raise, hang, malformed value, exit; a tool that raises, hangs, returns
10 MB or an unprintable value).

What must hold: every healthy episode finishes with the same tokens as in a fault-free run of the
same seeds; every injected fault is recorded in its own episode (an env fault as the episode's
reason, a tool fault as the error the model got back); no thread or process is left behind; memory
stays bounded. The default tier runs a short version; ``-m slow`` the full one (600 episodes).
"""

from __future__ import annotations

import os
import random
import resource
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from fault_injection import BASES, ENV_FAULTS, HANG_S, TOOL_FAULTS
from scripted_engine import ScriptedEngine
from test_rollout_support import oracle_responder, oracles, tiny_format

from srt_agent.isolation import shutdown_workers
from srt_agent.rollout import EpisodeRequest, RolloutConfig, Trajectory, run_rollouts

RATE = 0.10
TOOL_ENVS = ("Calculator", "Retail")  # GuessNumber has no tools


@dataclass(frozen=True)
class Soak:
    specs: list[EpisodeRequest]
    clean: dict[str, Trajectory]
    faulty: dict[str, Trajectory]
    wall_s: float
    rss_growth_mb: float
    clean_rss_growth_mb: float


def _spec(base: str, i: int, fault: str) -> EpisodeRequest:
    episode_id = f"{base}-{i}-{fault or 'ok'}"
    return EpisodeRequest(f"soak/{base}-v0", seed=i, episode_id=episode_id, env_options={"fault": fault})


def _plan(episodes: int, seed: int = 0) -> list[EpisodeRequest]:
    """``episodes`` episodes spread over the envs; each has a fault with probability RATE."""
    rng = random.Random(seed)
    specs = []
    for i in range(episodes):
        base = BASES[i % len(BASES)]
        fault = ""
        if rng.random() < RATE:
            kinds = list(ENV_FAULTS) + (list(TOOL_FAULTS) if base in TOOL_ENVS else [])
            fault = rng.choice(kinds)
        specs.append(_spec(base, i, fault))
    return specs


def _covering_plan(episodes: int) -> list[EpisodeRequest]:
    """Each fault kind once (tool faults on envs with tools), the other episodes healthy."""
    kinds = [(BASES[i % len(BASES)], kind) for i, kind in enumerate(ENV_FAULTS)]
    kinds += [(TOOL_ENVS[i % len(TOOL_ENVS)], kind) for i, kind in enumerate(TOOL_FAULTS)]
    specs = [_spec(base, i, kind) for i, (base, kind) in enumerate(kinds)]
    return specs + [_spec(BASES[i % len(BASES)], i, "") for i in range(len(specs), episodes)]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def run_soak(specs: list[EpisodeRequest]) -> Soak:
    fmt = tiny_format()
    episodes = len(specs)
    by_task = {}
    for base in BASES:
        by_task.update(oracles(f"srt/{base}-v0", range(episodes)))
    engine = ScriptedEngine(fmt, oracle_responder(fmt, by_task), max_context=1 << 16)
    config = RolloutConfig(max_concurrent=32, env_step_timeout_s=1.0, env_setup_timeout_s=1.0)
    clean_specs = [replace(s, env_options={"fault": ""}) for s in specs]
    rss0 = _rss_mb()
    clean = {t.episode_id: t for t in run_rollouts(engine, fmt, clean_specs, config=config)}
    rss1 = _rss_mb()
    t0 = time.perf_counter()
    faulty = {t.episode_id: t for t in run_rollouts(engine, fmt, specs, config=config)}
    wall_s = time.perf_counter() - t0
    return Soak(specs, clean, faulty, wall_s, _rss_mb() - rss1, rss1 - rss0)


def _check(soak: Soak) -> dict[str, int]:
    counts: dict[str, int] = {}
    assert len(soak.faulty) == len(soak.specs)
    for spec in soak.specs:
        fault = str(spec.env_options["fault"])
        got, ref = soak.faulty[spec.episode_id], soak.clean[spec.episode_id]
        counts["solved_without_faults"] = counts.get("solved_without_faults", 0) + ref.success
        counts[fault or "healthy"] = counts.get(fault or "healthy", 0) + 1
        if not fault:
            same = (got.status, got.reason, got.token_ids, got.loss_mask, got.logprobs, got.total_reward)
            assert same == (
                ref.status,
                ref.reason,
                ref.token_ids,
                ref.loss_mask,
                ref.logprobs,
                ref.total_reward,
            )
        elif fault in ENV_FAULTS:
            assert got.status == "failed" and ENV_FAULTS[fault] in got.reason, (fault, got.reason)
        else:
            tool_text = " ".join(m.content for m in got.messages if m.role == "tool")
            assert TOOL_FAULTS[fault] in tool_text, (fault, tool_text[:300])
            assert got.tool_errors >= 1 or fault == "tool-huge"
    deadline = time.monotonic() + 5 * HANG_S
    while any(t.name.startswith(("srt-env", "srt-tool")) for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a thread of an env or tool call was left behind"
        time.sleep(0.05)
    shutdown_workers()
    children = os.popen(f"ps -o pid= --ppid {os.getpid()}").read().split()
    assert len(children) <= 1, children  # the ps itself
    assert soak.rss_growth_mb < 400, soak.rss_growth_mb  # 10 MB tool outputs are not kept
    return counts


def _report(soak: Soak, counts: dict[str, int]) -> None:
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    faults = sum(n for k, n in counts.items() if k not in ("healthy", "solved_without_faults"))
    print(
        f"\nsoak: {len(soak.specs)} episodes, {faults} faults {dict(sorted(counts.items()))}, "
        f"faulty run {soak.wall_s:.1f} s, RSS growth {soak.rss_growth_mb:.0f} MB "
        f"(the fault-free run before it: {soak.clean_rss_growth_mb:.0f} MB), peak RSS {peak_mb:.0f} MB"
    )


def test_a_short_soak_loses_and_changes_no_healthy_episode() -> None:
    soak = run_soak(_covering_plan(36))
    counts = _check(soak)
    _report(soak, counts)
    assert set(counts) == {"healthy", "solved_without_faults", *ENV_FAULTS, *TOOL_FAULTS}


@pytest.mark.slow
def test_the_full_soak_loses_and_changes_no_healthy_episode() -> None:
    soak = run_soak(_plan(600))
    counts = _check(soak)
    _report(soak, counts)
    assert sum(n for k, n in counts.items() if k in ENV_FAULTS or k in TOOL_FAULTS) >= 40


@pytest.mark.slow
def test_the_soak_through_ray_env_workers_survives_a_worker_killed_mid_run() -> None:
    """Envs in 2 Ray env workers, one killed 2 s in: its episodes fail saying so, the rest are as
    without faults, and the pool replaces the worker for the episodes that come after."""
    ray = pytest.importorskip("ray")
    import sys

    from srt_agent.distributed.envs import EnvWorkerPool
    from srt_agent.rollout.scheduler import RolloutScheduler, rollout_sync

    specs = _covering_plan(12) + _plan(150, seed=1)[12:]  # every fault kind, then 10% at random
    fmt = tiny_format()
    by_task = {}
    for base in BASES:
        by_task.update(oracles(f"srt/{base}-v0", range(len(specs))))
    engine = ScriptedEngine(fmt, oracle_responder(fmt, by_task), max_context=1 << 16)
    # Deadlines leave room for a replacement worker's start-up (it counts against its first make).
    config = RolloutConfig(max_concurrent=32, env_step_timeout_s=8.0, env_setup_timeout_s=8.0)
    clean_specs = [replace(s, env_options={"fault": ""}) for s in specs]
    clean = {t.episode_id: t for t in run_rollouts(engine, fmt, clean_specs, config=config)}
    # Workers import the injector by the MODULE:ID syntax, from the driver's sys.path.
    remote_specs = [
        replace(s, env_id=f"fault_injection:{s.env_id}", env_options={**s.env_options, "hang_s": 10.0})
        for s in specs
    ]
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
    )
    try:
        pool = EnvWorkerPool(2)
        for i in range(2):  # started before the clock runs
            warm = replace(remote_specs[0], episode_id=f"warm-up-{i}", env_options={"fault": ""})
            pool.make(warm).close()
        killer = threading.Timer(2.0, lambda: ray.kill(pool.workers[0]))
        killer.start()
        t0 = time.perf_counter()
        scheduler = RolloutScheduler(engine, fmt, config, env_factory=pool.make)
        faulty = {t.episode_id: t for t in rollout_sync(scheduler, remote_specs).trajectories}
        wall_s = time.perf_counter() - t0
        killer.join()
        replaced = pool.replaced
        pool.close()
    finally:
        ray.shutdown()
    lost = [t for t in faulty.values() if "env worker holding this episode died" in t.reason]
    counts: dict[str, int] = {"lost_with_worker": len(lost)}
    for spec in specs:
        fault = str(spec.env_options["fault"])
        got, ref = faulty[spec.episode_id], clean[spec.episode_id]
        counts[fault or "healthy"] = counts.get(fault or "healthy", 0) + 1
        if got in lost:
            assert got.status == "failed"
        elif not fault:
            assert (got.status, got.token_ids, got.loss_mask) == (ref.status, ref.token_ids, ref.loss_mask), (
                spec.episode_id,
                got.reason,
            )
        elif fault in ENV_FAULTS:
            assert got.status == "failed" and ENV_FAULTS[fault] in got.reason, (fault, got.reason)
    assert len(faulty) == len(specs) and lost and replaced >= 1
    shown = dict(sorted(counts.items()))
    print(f"\nray soak: {len(specs)} episodes, {shown}, {wall_s:.1f} s, workers replaced {replaced}")


@pytest.mark.slow
def test_the_soak_benchmark_in_processes_loses_no_healthy_episode_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """``benchmarks/soak.py`` on a real (tiny) engine: 1,000 episodes, 10% faults of every kind, a
    segfault and ``os._exit`` among them, envs in worker processes."""
    import json
    import subprocess
    import sys

    from chat_fixtures import save_tiny_llama

    model = save_tiny_llama(tmp_path / "model")
    out = tmp_path / "soak.json"
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, str(root / "benchmarks" / "soak.py"), "--model", str(model), "--episodes", "1000",
         "--report-every", "250", "--concurrency", "16", "--json", str(out)],
        check=True, cwd=root, timeout=1500,
    )  # fmt: skip
    record = json.loads(out.read_text())
    assert record["healthy_lost"] == 0 and record["faults_unrecorded"] == 0, record
    assert record["faults"] >= 60 and record["workers_lost"] >= 5
    assert record["threads_end"] <= record["threads_start"] + record["pool_size"]
    assert record["processes_end"] <= record["pool_size"]
