"""Rollouts on a local Ray cluster: 1 vs 2 engine replicas, and cache-aware vs round-robin routing.

Run: ``python benchmarks/ray_replicas.py [--model DIR] [--env srt/Calculator-v0] [--prompts 8
--samples 4 --rounds 3] [--json PATH]``.

The workload is GRPO-like: ``prompts`` tasks times ``samples`` trials, ``rounds`` rounds over the
same tasks (the policy does not change between rounds, so later rounds can draft from earlier
ones). Configurations, each on fresh replicas (with fresh tree caches) and 2 env workers:

* ``r1``: one replica; ``r2``: two replicas, cache-aware routing (a task's requests go to the
  replica that served it first); ``r2_rr``: two replicas, round-robin routing.

Printed per configuration: wall-clock of the timed rounds (round 0, which also starts the
replicas' caches, is timed apart), tokens per second, tokens per forward, and the share of draft
lookups answered from the exact conversation state (``hit_exact``) or the same task
(``hit_task``). On this 2-core machine two replicas share two cores with the envs and the driver,
so their throughput gain is bounded well below 2x; the hit rates are what routing changes.

JSON keys (``--json``, one flat object): ``{config}_{figure}`` for figures ``wall_s``,
``tokens_per_s``, ``tokens_per_forward``, ``hit_exact``, ``hit_task``, plus ``speedup_r2``
(r1 wall / r2 wall) and the settings.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from srt_agent.chat.template import ChatFormat
from srt_agent.distributed.ray_config import RayConfig
from srt_agent.output.paths import resolve_model_dir
from srt_agent.output.records import write_record
from srt_agent.rollout.config import EpisodeRequest, RolloutConfig
from srt_agent.rollout.scheduler import rollout_sync
from srt_agent.runtime import build_runtime
from srt_agent.tree_cache import TreeCache

CONFIGS = {
    "r1": RayConfig(replicas=1, env_workers=2),
    "r2": RayConfig(replicas=2, env_workers=2),
    "r2_rr": RayConfig(replicas=2, env_workers=2, routing="round_robin"),
}


def episodes(env_id: str, prompts: int, samples: int, round_: int) -> list[EpisodeRequest]:
    """One round's episodes (the episode ids carry the round, so sampling seeds differ by round)."""
    return [
        EpisodeRequest(env_id, seed=s, trial=t, episode_id=f"r{round_}/{s}/{t}", env_options={"max_turns": 6})
        for s in range(prompts)
        for t in range(samples)
    ]


def run_config(name: str, args: argparse.Namespace, model_dir: Path, fmt: ChatFormat) -> dict[str, float]:
    """One configuration's figures over rounds 1.. (round 0 warms the replicas and their caches)."""
    rollout = RolloutConfig(max_concurrent=args.prompts * args.samples, max_new_tokens=128, seed=0)
    runtime = build_runtime(model_dir, rollout, draft_source=TreeCache(), fmt=fmt, ray=CONFIGS[name])
    wall = tokens = forwards = lookups = exact = task = 0.0
    try:
        for r in range(args.rounds):
            t0 = time.perf_counter()
            batch = rollout_sync(runtime.scheduler, episodes(args.env, args.prompts, args.samples, r))
            seconds = time.perf_counter() - t0
            print(f"{name} round {r}: {seconds:.1f} s")
            if r == 0:
                continue
            m = batch.metrics
            wall += seconds
            tokens += m.live_tokens
            forwards += m.live_forward_passes
            lookups += m.draft_lookups
            exact += m.spec.drafts_by_source.get("exact", 0)
            task += m.spec.drafts_by_source.get("task", 0)
    finally:
        runtime.close()
    return {
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 2) if wall else 0.0,
        "tokens_per_forward": round(tokens / forwards, 3) if forwards else 0.0,
        "hit_exact": round(exact / lookups, 4) if lookups else 0.0,
        "hit_task": round(task / lookups, 4) if lookups else 0.0,
    }


def main() -> None:
    """Run every configuration and print (and write) the figures."""
    import ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model dir (default: the one under runs/)")
    parser.add_argument("--env", default="srt/Calculator-v0")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: needs >= 2 (round 0 warms the engines up and is not counted)")
    model_dir, _ = resolve_model_dir(args.model)
    fmt = ChatFormat.from_pretrained(model_dir)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    record: dict[str, Any] = {"model": str(model_dir), "env": args.env, "prompts": args.prompts,
                              "samples": args.samples, "rounds": args.rounds}  # fmt: skip
    try:
        for name in args.configs.split(","):
            for key, value in run_config(name, args, model_dir, fmt).items():
                record[f"{name}_{key}"] = value
    finally:
        ray.shutdown()
    if "r1_wall_s" in record and "r2_wall_s" in record:
        record["speedup_r2"] = round(record["r1_wall_s"] / record["r2_wall_s"], 3)
    for key, value in record.items():
        print(f"{key:24} {value}")
    if args.json is not None:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
