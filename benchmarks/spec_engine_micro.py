"""Micro-benchmark of speculative decoding in ``TorchEngine``: tokens per forward and decode tok/s.

On a random Llama shaped like the embedded model (:data:`srt_agent.speed.random_model.EMBEDDED_LIKE`),
three systems generate the same seeded requests:

* ``off``: no draft source (plain decoding);
* ``perfect``: drafts replay a previous sample of the same seed (every drafted token is accepted);
* ``random``: random token trees that claim probability 1 (nothing is ever accepted): the cost
  model has to notice and stop verifying them, so this should be within a few percent of ``off``.

Decode throughput excludes the prompt: each measurement times a full generation and a
prefill-only one (1 token) and reports ``batch * (new_tokens - 1) / (t_full - t_prefill)``, median
over repeats, systems alternating. It is reported twice: by wall clock, and by the process's CPU
time (``cpu``), which other processes on a shared machine disturb much less (with one torch
thread the engine's worker does all the work; the caller only waits). The main numbers come
after one untimed generation (the cost model has learnt); ``cold`` is each engine's first
generation (calibration at construction excluded, learning included). ``identical`` counts the
sequences whose tokens equal ``off``'s: all of them, unless float rounding of the logits (a
batched tree forward sums in another order than a one-token one) moves a seeded draw across a
token boundary, which then changes the rest of that sequence (still an exact sample).

Run: ``python benchmarks/spec_engine_micro.py [--batch-sizes 1 8] [--device cuda] [--json PATH]``;
``--model DIR`` measures that checkpoint instead of the random one (prompts stay random tokens).
JSON keys (``--json``, also printed): ``{off,perfect,random}_{key}_b{batch}`` with ``key`` one of
``tokens_per_forward``, ``tok_s``, ``tok_s_vs_off``, ``cpu_tok_s``, ``cpu_tok_s_vs_off``,
``cold_tok_s``, ``cold_cpu_tok_s``, ``identical``, ``decode_steps`` (decode and verify steps of
one generation), ``step_cost_vs_off`` (one of its steps in plain decode steps, host and device:
off's steps / its steps / wall speed-up; ``perfect``'s is the verify step's price at the full
draft width), and with static steps (``--static``, always on a
GPU) ``host_us_per_token``: the engine's step time less the device's (launches and waits), per
generated token, i.e. the host's Python work; with ``--profile DIR``, ``{off,perfect}_device_ms_per_step``
(kernel time per decode/verify step, from torch.profiler; tables in DIR) and ``_steps``; and the
settings.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from srt_agent.contracts.draft import EMPTY_DRAFT, DraftTree, StaticDraftSource
from srt_agent.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams
from srt_agent.engine.hf_checkpoint import read_config
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.output.records import write_record
from srt_agent.speed.profiling import profile_engine
from srt_agent.speed.random_model import EMBEDDED_LIKE, save_random_model


class _Replay(StaticDraftSource):
    """Perfect drafts: the continuation each task id produced before (same seed, same tokens)."""

    def __init__(self) -> None:
        self.book: dict[str, tuple[int, ...]] = {}

    def draft(
        self, state_key: str, task_id: str, prompt_ids: Sequence[int], generated: Sequence[int], budget: int
    ) -> DraftTree:
        full = self.book.get(task_id, ())
        n = len(generated)
        if tuple(full[:n]) != tuple(generated):
            return EMPTY_DRAFT
        nxt = full[n : n + budget]
        return DraftTree(nxt, tuple(range(-1, len(nxt) - 1)), (1.0,) * len(nxt), "exact")


class _Random(_Replay):
    """Useless drafts: random chains with a random sibling, all claiming probability 1."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        super().__init__()
        self.vocab = vocab
        self.rng = random.Random(seed)

    def draft(
        self, state_key: str, task_id: str, prompt_ids: Sequence[int], generated: Sequence[int], budget: int
    ) -> DraftTree:
        tokens = [self.rng.randrange(self.vocab) for _ in range(budget)]
        parents = list(range(-1, budget - 1))
        if budget >= 2 and tokens[1] != tokens[0]:
            parents[1] = -1  # a second root child: the tree branches
        return DraftTree(tuple(tokens), tuple(parents), (1.0,) * budget, "global")


def _requests(prompts: list[tuple[int, ...]], n: int, temperature: float) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            f"r{i}", p, SamplingParams(temperature=temperature, max_new_tokens=n, seed=i), task_id=f"r{i}"
        )
        for i, p in enumerate(prompts)
    ]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(
    engine: TorchEngine, requests: list[GenerationRequest]
) -> tuple[float, float, list[GenerationOutput]]:
    start, cpu = time.perf_counter(), _cpu()
    outs = engine.generate(requests)
    return time.perf_counter() - start, _cpu() - cpu, outs


@dataclass
class _Rate:
    wall: float  # decode tok/s by wall clock
    cpu: float  # decode tok/s by process CPU time
    tokens_per_forward: float
    host_us_per_token: float  # engine step time less device time, per generated token
    outs: list[GenerationOutput]
    steps: int  # decode and verify steps of the generation


def _decode_rate(
    engine: TorchEngine, prompts: list[tuple[int, ...]], new_tokens: int, temperature: float
) -> _Rate:
    """Figures of one generation (decode rates exclude the prefill, timed separately)."""
    engine.spec_stats(reset=True)
    full, full_cpu, outs = _timed(engine, _requests(prompts, new_tokens, temperature))
    stats = engine.spec_stats(reset=True)
    prefill, prefill_cpu, _ = _timed(engine, _requests(prompts, 1, temperature))
    tokens = len(prompts) * (new_tokens - 1)
    host = (stats.step_s - stats.device_s) / max(stats.tokens, 1)
    return _Rate(
        tokens / max(full - prefill, 1e-9),
        tokens / max(full_cpu - prefill_cpu, 1e-9),
        stats.tokens_per_forward,
        1e6 * host,
        outs,
        stats.target_forwards,
    )


def _profile(
    engine: TorchEngine,
    prompts: list[tuple[int, ...]],
    new_tokens: int,
    temperature: float,
    folder: str,
    name: str,
    batch: int,
) -> dict[str, float | int | str]:
    """Profile one generation with torch.profiler: kernel time per decode/verify step.

    Writes ``{folder}/{name}_b{batch}.txt`` (each kind of step's host and device time, then
    operators and kernels by device time and by host time) and returns
    ``{name}_device_ms_per_step_b{batch}`` (kernel time of the whole generation, prefill
    included, over its decode and verify steps) and ``{name}_steps_b{batch}``.
    """
    before = engine.stats().decode_steps
    _, total_ms = profile_engine(
        engine,
        lambda: engine.generate(_requests(prompts, new_tokens, temperature)),
        Path(folder) / f"{name}_b{batch}.txt",
        f"{name} batch {batch}",
    )
    steps = max(engine.stats().decode_steps - before, 1)
    return {
        f"{name}_device_ms_per_step_b{batch}": round(total_ms / steps, 4),
        f"{name}_steps_b{batch}": steps,
    }


def run(
    batch_sizes: Sequence[int],
    new_tokens: int,
    prompt_len: int,
    repeats: int,
    temperature: float,
    device: str,
    model: str | None = None,
    static: bool = False,
    profile: str | None = None,
) -> dict[str, float | int | str]:
    """Measure the three systems at each batch size; returns a flat record.

    ``model``: the checkpoint to measure (default: a random embedded-shaped model). ``static``:
    every step in static shapes (CUDA graphs on a GPU; on a CPU the same host path without
    capture), which also reports the host's own work per token. ``profile``: a folder where one
    generation of ``off`` and ``perfect`` per batch size is profiled (see :func:`_profile`).
    """
    static = static or torch.device(device).type == "cuda"
    record: dict[str, float | int | str] = {
        "device": device,
        "threads": torch.get_num_threads(),
        "new_tokens": new_tokens,
        "prompt_len": prompt_len,
        "temperature": temperature,
        "model": model or "random embedded-shaped",
        "static": static,
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = model or save_random_model(tmp, seed=0, **EMBEDDED_LIKE)
        vocab = read_config(path).vocab_size if model else int(EMBEDDED_LIKE["vocab_size"])
        gen = torch.Generator().manual_seed(0)
        for b in batch_sizes:
            prompts = [tuple(row) for row in torch.randint(0, vocab, (b, prompt_len), generator=gen).tolist()]
            replay = _Replay()
            sources = {"off": None, "perfect": replay, "random": _Random(vocab)}
            engines = {
                name: TorchEngine(
                    path,
                    max_batch_size=b,
                    device=device,
                    draft_source=src,
                    tokenizer=None,
                    cuda_graphs=True if static else None,
                )
                for name, src in sources.items()
            }
            try:
                for eng in engines.values():  # allocator warm-up; no decode step, so nothing learnt
                    eng.generate(_requests(prompts, 1, temperature))
                reference = engines["off"].generate(_requests(prompts, new_tokens, temperature))
                replay.book = {o.request_id: o.token_ids for o in reference}
                rates: dict[str, list[float]] = {name: [] for name in engines}
                cpu_rates: dict[str, list[float]] = {name: [] for name in engines}
                host: dict[str, list[float]] = {name: [] for name in engines}
                per_forward: dict[str, float] = {}
                steps: dict[str, list[int]] = {name: [] for name in engines}
                for r in range(repeats + 1):  # round 0 is each engine's first (cold) generation
                    order = list(engines) if r % 2 == 0 else list(engines)[::-1]
                    for name in order:
                        got = _decode_rate(engines[name], prompts, new_tokens, temperature)
                        wall, cpu, tpf, outs = got.wall, got.cpu, got.tokens_per_forward, got.outs
                        same = sum(
                            o.token_ids == ref.token_ids for o, ref in zip(outs, reference, strict=True)
                        )
                        record[f"{name}_identical_b{b}"] = f"{same}/{len(outs)}"
                        if r == 0:
                            record[f"{name}_cold_tok_s_b{b}"] = round(wall, 1)
                            record[f"{name}_cold_cpu_tok_s_b{b}"] = round(cpu, 1)
                        else:
                            rates[name].append(wall)
                            cpu_rates[name].append(cpu)
                            host[name].append(got.host_us_per_token)
                            per_forward[name] = tpf
                            steps[name].append(got.steps)
                if profile is not None:
                    for name in ("off", "perfect"):
                        record.update(
                            _profile(engines[name], prompts, new_tokens, temperature, profile, name, b)
                        )
                for name in engines:
                    record[f"{name}_tokens_per_forward_b{b}"] = round(per_forward[name], 2)
                    if static:
                        record[f"{name}_host_us_per_token_b{b}"] = round(statistics.median(host[name]), 2)
                    for kind, values in (("tok_s", rates), ("cpu_tok_s", cpu_rates)):
                        median = statistics.median(values[name])
                        record[f"{name}_{kind}_b{b}"] = round(median, 1)
                        record[f"{name}_{kind}_vs_off_b{b}"] = round(
                            median / statistics.median(values["off"]), 3
                        )
                    # What one of its steps costs in plain decode steps (host and device, by wall
                    # clock): off's steps over its own, over its speed-up. (Not tokens per forward
                    # over the speed-up: a row whose draft fails runs on alone at one token per
                    # step, so the steps are more than the tokens per forward imply.)
                    speedup = statistics.median(rates[name]) / statistics.median(rates["off"])
                    fewer = statistics.median(steps["off"]) / max(statistics.median(steps[name]), 1)
                    record[f"{name}_step_cost_vs_off_b{b}"] = round(fewer / speedup, 3)
                    record[f"{name}_decode_steps_b{b}"] = int(statistics.median(steps[name]))
            finally:
                for eng in engines.values():
                    eng.close()
    return record


def main() -> None:
    """Parse arguments, run, print a table and the JSON record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", help="a model dir to measure (default: a random embedded-shaped model)")
    parser.add_argument(
        "--static", action="store_true", help="static-shape steps on a CPU too (reports host µs per token)"
    )
    parser.add_argument(
        "--profile", help="a folder: profile one generation of off and perfect per batch there"
    )
    parser.add_argument("--json", help="also write the record here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    record = run(
        args.batch_sizes,
        args.new_tokens,
        args.prompt_len,
        args.repeats,
        args.temperature,
        args.device,
        args.model,
        args.static,
        args.profile,
    )
    header = (
        "batch",
        "system",
        "tok/fwd",
        "tok/s",
        "vs off",
        "cpu tok/s",
        "vs off",
        "cold tok/s",
        "cold cpu",
        "identical",
        "step cost",
    )
    print("".join(f"{h:>11}" for h in header))
    for b in args.batch_sizes:
        for name in ("off", "perfect", "random"):
            cells = [b, name] + [
                record[f"{name}_{key}_b{b}"]
                for key in (
                    "tokens_per_forward",
                    "tok_s",
                    "tok_s_vs_off",
                    "cpu_tok_s",
                    "cpu_tok_s_vs_off",
                    "cold_tok_s",
                    "cold_cpu_tok_s",
                    "identical",
                    "step_cost_vs_off",
                )
            ]
            print("".join(f"{c:>11}" for c in cells))
    print(json.dumps(record, sort_keys=True))
    if args.json:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
