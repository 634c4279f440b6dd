"""Where a rollout round's engine time goes, SRT off vs on: prefill, decode, verify, lookups.

Run: ``python benchmarks/rollout_time_split.py [--env srt/Calculator-v0 --rounds 4 --threads 2
--configs off,srt_no_runahead]`` (needs the embedded model: ``srt-agent build-model``).

It runs the workload of ``srt-agent bench rollout`` (same episodes, seeds and weight drift; rounds
interleaved, their order rotating) for one env, and wraps the engine scheduler's and speculator's
step functions with wall-clock timers. Per round and configuration it prints the round's wall-clock,
tokens per forward, and the seconds and calls of each part; at the end the sums over rounds 1..
(round 0 warms the caches up). Prefill token counts (real and padded) show what prefix reuse saved.
Timers nest: ``step`` contains everything else, ``finish`` contains ``report``.
``--max-draft-tokens`` caps the draft budget per row, ``--backoff-window`` sets the tree cache's
suffix back-off, ``--draws`` how verify steps draw, ``--device cuda`` runs the engines on a GPU;
``--json PATH`` writes the sums over rounds 1.. as ``{config}_{part}_s`` (parts: ``wall`` and the
timers above, wall-clock), ``{config}_{part}_cpu_s`` (the engine thread's CPU time in the part: a
worker thread's wall-clock timers also count its waits for the GIL, which the rollout's own thread
holds while it steps envs), ``{config}_{part}_calls``, ``{config}_spec_host_cpu_s`` (CPU time of
speculation's host work: lookups with the cost model, reports to the draft source, its ``finish``
calls) and ``{config}_verify_extra_per_step_ms`` (a verify step's wall-clock over a plain decode
step's, the latter averaged over every configuration's decode steps). Timers ``cache_draft``,
``cache_extend`` and ``cache_finish`` time the tree cache's own calls (inside ``lookups``,
``report`` and ``finish``).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from srt_agent.bench.peers import drift_weights
from srt_agent.chat_format import ChatFormat
from srt_agent.engine import scheduler as engine_scheduler
from srt_agent.engine import speculative
from srt_agent.engine.checkpoint import read_state_dict
from srt_agent.paths import default_model_dir
from srt_agent.rollout import bench
from srt_agent.tree_cache import TreeCache

SECONDS: defaultdict[str, float] = defaultdict(float)
CPU: defaultdict[str, float] = defaultdict(float)
CALLS: Counter[str] = Counter()
ACTIVE = [False]  # timers count only inside a measured round


def _timed(cls: type, name: str, key: str) -> None:
    original: Callable[..., Any] | None = getattr(cls, name, None)
    if original is None:  # an older tree (for before/after runs): the part is not timed
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not ACTIVE[0]:
            return original(*args, **kwargs)
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            SECONDS[key] += time.perf_counter() - start
            CPU[key] += time.thread_time() - cpu
            CALLS[key] += 1

    setattr(cls, name, wrapper)


def _time_gc() -> None:
    """Count the cyclic garbage collector's pauses (any thread) as the part ``gc``.

    A tree cache of Python node objects is a large heap the collector walks on every full
    collection; those pauses land inside whatever part allocated, so they are counted apart.
    """
    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            elapsed = time.perf_counter() - started.pop()
            if ACTIVE[0]:
                SECONDS["gc"] += elapsed
                CPU["gc"] += elapsed
                CALLS["gc"] += 1
                if info.get("generation") == 2:
                    SECONDS["gc_full"] += elapsed
                    CPU["gc_full"] += elapsed
                    CALLS["gc_full"] += 1

    gc.callbacks.append(callback)


def _count_prefill_tokens() -> None:
    original = engine_scheduler.Scheduler._prefill

    def wrapper(self: engine_scheduler.Scheduler, group: list[Any]) -> None:
        if ACTIVE[0]:
            new = [engine_scheduler._new_tokens(s) for s in group]
            CALLS["prefill_tokens"] += sum(new)
            CALLS["prefill_tokens_padded"] += max(new) * len(group)
        original(self, group)

    engine_scheduler.Scheduler._prefill = wrapper  # type: ignore[method-assign]


def main() -> None:
    """Parse the options, run the rounds, print the split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="srt/Calculator-v0")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", default="off,srt_no_runahead")
    parser.add_argument("--max-draft-tokens", type=int, default=None, help="draft budget per row")
    parser.add_argument("--backoff-window", type=int, default=0, help="tree cache suffix back-off")
    parser.add_argument("--draws", default="auto", help="how verify steps draw: auto, walk or all")
    parser.add_argument("--device", default="cpu", help="torch device of the engines (cpu or cuda)")
    parser.add_argument("--json", type=Path, default=None, help="write the sums over rounds 1.. here")
    args = parser.parse_args()
    names = [c.strip() for c in args.configs.split(",")]
    for cls, name, key in (
        (engine_scheduler.Scheduler, "step", "step"),
        (engine_scheduler.Scheduler, "_prefill", "prefill"),
        (engine_scheduler.Scheduler, "_plain_decode", "decode"),
        (engine_scheduler.Scheduler, "_finish_step", "finish"),
        (speculative.Speculator, "drafts", "lookups"),
        (speculative.Speculator, "verify", "verify"),
        (speculative.Speculator, "report_many", "report"),
        (speculative.Speculator, "report", "report"),  # older trees report row by row
        (TreeCache, "draft", "cache_draft"),
        (TreeCache, "extend", "cache_extend"),
        (TreeCache, "draft_many", "cache_draft"),
        (TreeCache, "extend_many", "cache_extend"),
        (TreeCache, "finish", "cache_finish"),
    ):
        _timed(cls, name, key)
    _count_prefill_tokens()
    _time_gc()
    torch.set_num_threads(args.threads)
    cfg = bench.RolloutBenchConfig(
        default_model_dir(),
        envs=(args.env,),
        rounds=args.rounds,
        configs=tuple(names),
        threads=args.threads,
        max_draft_tokens=args.max_draft_tokens,
        backoff_window=args.backoff_window,
        draws=args.draws,
        device=args.device,
    )
    fmt = ChatFormat.from_pretrained(cfg.model_dir)
    arms = [bench._make_arm(name, cfg, fmt) for name in names]
    weights = dict(read_state_dict(cfg.model_dir))
    sums: dict[str, defaultdict[str, float]] = {a.name: defaultdict(float) for a in arms}
    try:
        for r in range(args.rounds):
            if r:
                weights = drift_weights(weights, cfg.drift, seed=cfg.seed * 1000 + r)
            for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
                if r:
                    arm.engine.update_weights(weights)
                gc.collect()  # as bench rollout does: no batch inherits a pending full collection
                SECONDS.clear()
                CPU.clear()
                CALLS.clear()
                ACTIVE[0] = True
                result = bench._run_batch(arm, cfg, args.env, r)
                ACTIVE[0] = False
                m = result.metrics
                parts = " ".join(f"{k} {v:.2f}s/{CALLS[k]}" for k, v in sorted(SECONDS.items()))
                tokens = f"prefill tokens {CALLS['prefill_tokens']} (padded {CALLS['prefill_tokens_padded']})"
                print(
                    f"round {r} {arm.name:16s} wall {m.wall_s:.2f}s tok/fwd {m.tokens_per_forward:.2f} "
                    f"{parts} {tokens}"
                )
                if r >= 1:
                    sums[arm.name]["wall"] += m.wall_s
                    for k, v in SECONDS.items():
                        sums[arm.name][k] += v
                        sums[arm.name][k + "_cpu"] += CPU[k]
                        sums[arm.name][k + "_calls"] += CALLS[k]
    finally:
        for arm in arms:
            arm.engine.close()
    record: dict[str, float] = {}
    for name, parts_sum in sums.items():
        wall = {k: v for k, v in parts_sum.items() if not k.endswith(("_cpu", "_calls"))}
        print(
            f"rounds 1..{args.rounds - 1} {name:16s} wall-clock: "
            + " ".join(f"{k} {v:.2f}s" for k, v in wall.items())
        )
        print(
            f"rounds 1..{args.rounds - 1} {name:16s} thread CPU:  "
            + " ".join(f"{k} {parts_sum[k + '_cpu']:.3f}s" for k in wall if k != "wall")
        )
        for k, v in parts_sum.items():
            record[f"{name}_{k}" if k.endswith("_calls") else f"{name}_{k}_s"] = v
        # Host work of speculation: the cost model and the draft source's calls (thread CPU time,
        # which excludes waits for the GIL that wall-clock timers of a worker thread include).
        record[f"{name}_spec_host_cpu_s"] = sum(
            parts_sum.get(k + "_cpu", 0.0) for k in ("lookups", "report", "cache_finish")
        )
        decode = [(p.get("decode", 0.0), p.get("decode_calls", 0.0)) for p in sums.values()]
        per_decode = sum(d for d, _ in decode) / max(1.0, sum(n for _, n in decode))
        if parts_sum.get("verify_calls"):
            extra = parts_sum["verify"] / parts_sum["verify_calls"] - per_decode
            record[f"{name}_verify_extra_per_step_ms"] = 1000 * extra
            print(
                f"rounds 1..{args.rounds - 1} {name:16s} verify step {1000 * (extra + per_decode):.2f} ms, "
                f"plain decode step {1000 * per_decode:.2f} ms (extra {1000 * extra:.2f} ms)"
            )
        print(
            f"rounds 1..{args.rounds - 1} {name:16s} speculation host CPU (lookups + report + finish "
            f"calls): {record[f'{name}_spec_host_cpu_s']:.3f}s"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
