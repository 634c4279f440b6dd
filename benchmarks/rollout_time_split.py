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
timers above).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from srt_agent.chat_format import ChatFormat
from srt_agent.engine import scheduler as engine_scheduler
from srt_agent.engine import speculative
from srt_agent.engine.checkpoint import read_state_dict
from srt_agent.paths import default_model_dir
from srt_agent.rollout import bench
from srt_agent.rollout.bench_peers import drift_weights

SECONDS: defaultdict[str, float] = defaultdict(float)
CALLS: Counter[str] = Counter()
ACTIVE = [False]  # timers count only inside a measured round


def _timed(cls: type, name: str, key: str) -> None:
    original: Callable[..., Any] = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not ACTIVE[0]:
            return original(*args, **kwargs)
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SECONDS[key] += time.perf_counter() - start
            CALLS[key] += 1

    setattr(cls, name, wrapper)


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
        (speculative.Speculator, "report", "report"),
    ):
        _timed(cls, name, key)
    _count_prefill_tokens()
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
                SECONDS.clear()
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
    finally:
        for arm in arms:
            arm.engine.close()
    for name, parts_sum in sums.items():
        print(
            f"rounds 1..{args.rounds - 1} {name:16s} "
            + " ".join(f"{k} {v:.2f}s" for k, v in parts_sum.items())
        )
    if args.json is not None:
        record = {f"{name}_{k}_s": v for name, parts_sum in sums.items() for k, v in parts_sum.items()}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
