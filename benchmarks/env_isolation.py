"""What running env code in worker processes costs per call: µs per env step and reset, in-process vs process.

Run: ``python benchmarks/env_isolation.py [--steps 2000] [--json PATH]``.

For Calculator and Retail, the same calls three ways: ``direct`` (the env's own ``step`` in this
thread: the floor), ``thread`` (each call in a thread of its own under a deadline, as rollouts run
env code by default), ``process`` (the env in a worker process of
:class:`~srt_agent.rollout.env_processes.EnvProcessPool`, as with ``env.isolation: process``). Each
step sends a tool call (Calculator: an arithmetic expression; Retail: a user look-up), so a step
includes the env's tool work; an episode that ends is reset (resets are timed apart).

JSON keys (``--json``, one flat object): ``<env>_<way>_step_us`` and ``<env>_<way>_reset_us``
(median µs per call), ``<env>_process_overhead_us`` (process minus thread, per step) for env
``calculator`` and ``retail``; ``steps``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from srt_agent.env.registration import make
from srt_agent.isolation import run_in_thread
from srt_agent.output.records import write_record
from srt_agent.rollout.config import EpisodeRequest
from srt_agent.rollout.env_processes import EnvProcessPool
from srt_agent.tooling.parser import format_tool_call

ACTIONS = {
    "calculator": ("srt/Calculator-v0", format_tool_call("calculator", {"expression": "(17 + 25) * 3"})),
    "retail": ("srt/Retail-v0", format_tool_call("find_user_id_by_email", {"email": "nobody@example.com"})),
}


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    value = fn()
    return (time.perf_counter() - t) * 1e6, value


def measure(
    env: Any, action: str, steps: int, call: Callable[[Callable[[], Any]], Any]
) -> tuple[float, float]:
    """Median µs of a step and of a reset, calling the env through ``call``."""
    step_us, reset_us = [], []
    seeds = iter(range(1 << 30))
    us, _ = _timed(lambda: call(functools.partial(env.reset, seed=next(seeds))))
    reset_us.append(us)
    for _ in range(steps):
        us, result = _timed(lambda: call(functools.partial(env.step, action)))
        step_us.append(us)
        if result[2] or result[3]:  # terminated or truncated: a new episode
            us, _ = _timed(lambda: call(functools.partial(env.reset, seed=next(seeds))))
            reset_us.append(us)
    return statistics.median(step_us), statistics.median(reset_us)


def main() -> None:
    """Time the calls each way and print (and write) the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    record: dict[str, Any] = {"steps": args.steps}
    with EnvProcessPool(1) as pool:
        for key, (env_id, action) in ACTIONS.items():
            options = {"max_turns": 1000}
            local = make(env_id, **options)
            remote = pool(EpisodeRequest(env_id, episode_id=f"bench-{key}", env_options=options))
            ways: dict[str, tuple[Any, Callable[[Callable[[], Any]], Any]]] = {
                "direct": (local, lambda fn: fn()),
                "thread": (local, lambda fn: run_in_thread(fn, 60.0)),
                "process": (remote, lambda fn: fn()),  # the proxy times its own calls
            }
            for way, (env, call) in ways.items():
                measure(env, action, min(50, args.steps), call)  # warm-up
                step_us, reset_us = measure(env, action, args.steps, call)
                record[f"{key}_{way}_step_us"] = round(step_us, 1)
                record[f"{key}_{way}_reset_us"] = round(reset_us, 1)
                print(f"{key:10s} {way:8s} step {step_us:9.1f} µs   reset {reset_us:9.1f} µs")
            record[f"{key}_process_overhead_us"] = round(
                record[f"{key}_process_step_us"] - record[f"{key}_thread_step_us"], 1
            )
            remote.close()
            local.close()
    if args.json is not None:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
