"""A long fault-injection soak on a real model: episodes lost, memory over time, threads and processes left.

Run: ``python benchmarks/soak.py --model DIR [--episodes 5000] [--fault-rate 0.1] [--report-every 500]
[--isolation process] [--json PATH]``.

``episodes`` episodes over Calculator, GuessNumber and Retail (:mod:`srt_agent.env.chaos`'s
``chaos/`` ids), rolled out by the in-process engine with SRT on, ``report-every`` at a time through
one runtime (so the tree cache, the env processes and every thread live for the whole run, as in a
long training run). Each episode gets a fault with probability ``fault-rate``, drawn from every
kind: env code that raises, hangs, returns malformed values or a NaN reward, exits, segfaults or
calls ``os._exit`` (with ``--isolation process`` only: in-process they end the run), tools that
raise, hang, return 10 MB or an unprintable value, an observation of 10 MB.

Checked per episode: a healthy one must not fail (it is "lost" if it does); an env or process fault
must fail its episode with a reason naming it; a tool fault must reach the model as an error; a
huge observation is cut. After every ``report-every`` episodes: this process's RSS, the env
processes' RSS, threads and child processes alive, the tree cache's size.

JSON keys (``--json``, one flat object): ``episodes``, ``healthy``, ``faults``, ``healthy_lost``
(the bar: 0), ``faults_unrecorded`` (faults whose episode does not say what happened),
``rss_mb_<n>`` (this process's RSS after ``n`` episodes), ``rss_growth_pct`` (the last checkpoint
over the first; the bar: within 10%), ``env_rss_mb_end`` (the env processes' RSS), ``cache_mb_end``
(the tree cache's bytes), ``threads_start`` and ``threads_end`` (the bar: end <= start + pool size),
``processes_end`` (child processes alive after the last batch), ``pool_size``, ``workers_started``,
``workers_lost`` (env processes killed: crashes, exits, hangs), ``wall_s``, ``episodes_per_s``,
``isolation``, ``fault_rate``, ``cache_mb`` and ``prefix_mb`` (the two budgets), ``prefix_mb_end``
(parked keys/values held at the end), ``seed``.

Two stores grow by design until their byte budgets (256 MB each by default in a run): the tree
cache and the engine's parked keys/values. Here both default to 4 MB, so they are full before the
first checkpoint and RSS growth after it measures everything else (leaks).
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from srt_agent.chat.template import ChatFormat
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.env.chaos import (
    CHAOS_BASES,
    ENV_FAULTS,
    HARMLESS_FAULTS,
    PROCESS_FAULTS,
    TOOL_FAULTS,
    register_chaos_envs,
)
from srt_agent.output.paths import resolve_model_dir
from srt_agent.output.records import write_record
from srt_agent.rollout.config import EpisodeRequest, RolloutConfig
from srt_agent.rollout.scheduler import rollout_sync
from srt_agent.runtime import build_runtime
from srt_agent.tree_cache import TreeCache, TreeCacheConfig

TOOL_ENVS = ("Calculator", "Retail")  # GuessNumber has no tools


def plan(episodes: int, rate: float, isolation: str, seed: int) -> list[EpisodeRequest]:
    """The soak's episodes: bases in turn, each with a fault at ``rate`` (kinds drawn uniformly)."""
    rng = random.Random(seed)
    env_kinds = list(ENV_FAULTS) + list(HARMLESS_FAULTS)
    if isolation == "process":
        env_kinds += list(PROCESS_FAULTS)
    specs = []
    for i in range(episodes):
        base = CHAOS_BASES[i % len(CHAOS_BASES)]
        fault = ""
        if rng.random() < rate:
            fault = rng.choice(env_kinds + (list(TOOL_FAULTS) if base in TOOL_ENVS else []))
        specs.append(
            EpisodeRequest(
                f"chaos/{base}-v0",
                seed=i,
                episode_id=f"{i}/{base}/{fault or 'ok'}",
                env_options={"fault": fault, "hang_s": 60.0, "max_turns": 4},
            )
        )
    return specs


def verdict(spec: EpisodeRequest, t: Trajectory) -> str:
    """``ok`` if the episode went as its fault (or none) says, else ``lost`` or ``unrecorded``."""
    fault = str(spec.env_options["fault"])
    if not fault:
        return "lost" if t.status == "failed" else "ok"
    if fault.startswith("step-") and not t.turns and t.status != "failed":
        return "ok"  # ended before its first step (a prompt over the context): the fault never came
    if fault in ENV_FAULTS or fault in PROCESS_FAULTS:
        expected = {**ENV_FAULTS, **PROCESS_FAULTS}[fault]
        return "ok" if t.status == "failed" and expected in t.reason else "unrecorded"
    env_text = " ".join(m.content for m in t.messages if m.role in ("tool", "user"))
    words = {**TOOL_FAULTS, **HARMLESS_FAULTS}[fault]
    # An episode whose every call failed before reaching a tool (a name that is no tool, bad
    # arguments) never met the broken tool: nothing to record.
    missed = fault in TOOL_FAULTS and t.tool_errors >= t.tool_calls
    return "ok" if t.status != "failed" and (words in env_text or missed) else "unrecorded"


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process, MB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next(x for x in f if x.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1024


def children() -> list[int]:
    """Process ids of this process's children."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid():
                out.append(int(entry))
    return out


def main() -> None:
    """Run the soak and print (and write) its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="HF model dir (default: the default model).")
    parser.add_argument("--episodes", type=int, default=5000)
    parser.add_argument("--fault-rate", type=float, default=0.1)
    parser.add_argument("--report-every", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32, help="Episodes in flight (and env processes).")
    parser.add_argument("--isolation", choices=("process", "thread"), default="process")
    parser.add_argument("--step-deadline", type=float, default=2.0, help="rollout.env_step_timeout_s")
    parser.add_argument("--setup-deadline", type=float, default=10.0, help="rollout.env_setup_timeout_s")
    parser.add_argument(
        "--cache-mb",
        type=float,
        default=4.0,
        help="The tree cache's byte budget (spec.cache.byte_budget), MB.",
    )
    parser.add_argument(
        "--prefix-mb", type=float, default=4.0, help="The engine's budget for parked keys/values, MB."
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    register_chaos_envs()
    model_dir, note = resolve_model_dir(args.model)
    if note:
        print(note)
    fmt = ChatFormat.from_pretrained(model_dir)
    rollout = RolloutConfig(
        max_concurrent=args.concurrency,
        max_new_tokens=64,
        seed=args.seed,
        env_step_timeout_s=args.step_deadline,
        env_setup_timeout_s=args.setup_deadline,
        env_isolation=args.isolation,
    )
    cache = TreeCache(TreeCacheConfig(byte_budget=int(args.cache_mb * 2**20)))
    specs = plan(args.episodes, args.fault_rate, args.isolation, args.seed)
    runtime = build_runtime(
        model_dir,
        rollout,
        draft_source=cache,
        fmt=fmt,
        num_threads=1,
        prefix_cache_bytes=int(args.prefix_mb * 2**20),
    )
    engine = runtime.engine
    assert isinstance(engine, TorchEngine)
    record: dict[str, Any] = {
        "episodes": len(specs),
        "faults": sum(1 for s in specs if s.env_options["fault"]),
        "isolation": args.isolation,
        "fault_rate": args.fault_rate,
        "seed": args.seed,
        "cache_mb": args.cache_mb,
        "prefix_mb": args.prefix_mb,
        "pool_size": args.concurrency if args.isolation == "process" else 0,
    }
    record["healthy"] = record["episodes"] - record["faults"]
    counts = {"ok": 0, "lost": 0, "unrecorded": 0}
    threads_start = threading.active_count()
    checkpoints: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    try:
        for start in range(0, len(specs), args.report_every):
            batch = specs[start : start + args.report_every]
            trajectories = rollout_sync(runtime.scheduler, batch).trajectories
            for spec, t in zip(batch, trajectories, strict=True):
                how = verdict(spec, t)
                counts[how] += 1
                if how != "ok":
                    print(f"  {how}: {spec.episode_id}: {t.status} {t.reason[:200]}")
            done = start + len(batch)
            kids = children()
            checkpoints.append((done, rss_mb()))
            print(
                f"{done:6d} episodes  {time.perf_counter() - t0:7.1f} s  RSS {rss_mb():7.1f} MB  "
                f"env processes {len(kids):3d} ({sum(rss_mb(p) for p in kids):7.1f} MB)  "
                f"threads {threading.active_count():3d}  cache {cache.stats().bytes / 2**20:6.1f} MB  "
                f"parked KV {engine.prefix_store_bytes / 2**20:6.1f} MB  "
                f"lost {counts['lost']}  unrecorded {counts['unrecorded']}",
                flush=True,
            )
        wall = time.perf_counter() - t0
        kids = children()
        pool = runtime.scheduler.env_processes
        record.update(
            healthy_lost=counts["lost"],
            faults_unrecorded=counts["unrecorded"],
            rss_growth_pct=round(100 * (checkpoints[-1][1] / checkpoints[0][1] - 1), 2),
            env_rss_mb_end=round(sum(rss_mb(p) for p in kids), 1),
            cache_mb_end=round(cache.stats().bytes / 2**20, 2),
            prefix_mb_end=round(engine.prefix_store_bytes / 2**20, 2),
            threads_start=threads_start,
            threads_end=threading.active_count(),
            processes_end=len(kids),
            workers_started=pool.started if pool is not None else 0,
            workers_lost=pool.lost if pool is not None else 0,
            wall_s=round(wall, 2),
            episodes_per_s=round(len(specs) / wall, 2),
            **{f"rss_mb_{n}": round(mb, 1) for n, mb in checkpoints},
        )
    finally:
        runtime.close()
    print(
        f"soak: {record['episodes']} episodes ({record['faults']} faults), "
        f"healthy lost {record['healthy_lost']}, faults unrecorded {record['faults_unrecorded']}, "
        f"RSS {checkpoints[0][1]:.0f} -> {checkpoints[-1][1]:.0f} MB "
        f"({record['rss_growth_pct']:+.1f}%), threads {record['threads_start']} -> {record['threads_end']} "
        f"(pool {record['pool_size']}), env processes at the end {record['processes_end']}"
    )
    if args.json is not None:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
