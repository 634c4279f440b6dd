"""Micro-benchmark of the native core against its Python twins, per call of one engine step.

The workload is one verify step at batch 32 with 8-node chain drafts (budget 8, as the default
configuration drafts) and a 16-position tree bucket: the step's inputs (``tree_layout``), the cost
model's ranking of every row's draft (``rank``) and its acceptance evidence (``depth_sums``), and
the acceptance walks over the drawn tokens (``walk``). Each figure is the median over repeats of
µs per step, for both backends in the same run, and their ratio.

Run: ``python benchmarks/native_micro.py [--rows 32] [--repeats 7] [--json PATH]``.
JSON keys: ``{name}_python_us``, ``{name}_native_us``, ``{name}_speedup`` for each name above, and
``rows``, ``nodes``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable

from srt_agent import native
from srt_agent.contracts.draft import DraftTree
from srt_agent.engine.speculation.budget import CostModel, _depth_sums
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.engine.speculation.speculator import _walk_drawn
from srt_agent.engine.step_graphs import StepGraphs
from srt_agent.output.records import write_record


class _Buffers:
    """Just the two host buffers that :meth:`StepGraphs._fill` writes."""

    def __init__(self, rows: int, width: int) -> None:
        import numpy as np

        self._ints_np = np.zeros(3 * rows * width + 8 * rows, dtype=np.int64)
        self._floats_np = np.zeros(rows * width + 4 * rows, dtype=np.float32)

    def _fill_params(self, *args: object) -> None:
        """The parameters' tail is the same Python code on both paths: left out of the timing."""


def _time(fn: Callable[[], object], repeats: int, inner: int = 200) -> float:
    """Median µs per call of ``fn`` over ``repeats`` batches of ``inner`` calls."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner * 1e6)
    return statistics.median(samples)


def run(rows: int, nodes: int, repeats: int) -> dict[str, float | int]:
    """Time each step function with both backends; returns the flat record."""
    from srt_agent.contracts.generation import SamplingParams

    rng = random.Random(0)
    drafts = [
        DraftTree(
            tuple(rng.randrange(4096) for _ in range(nodes)),
            tuple(range(-1, nodes - 1)),
            tuple(0.9 ** (k + 1) for k in range(nodes)),
        )
        for _ in range(rows)
    ]
    width = nodes + 1
    tb = 1 << (width - 1).bit_length()
    ids = [[7, *d.token_ids] for d in drafts]
    parents = [[-1, *(p + 1 if p >= 0 else 0 for p in d.parents)] for d in drafts]
    uniforms = [[rng.random() for _ in range(width)] for _ in drafts]
    prefix = [rng.randrange(1000) for _ in drafts]
    params = [SamplingParams()] * rows
    # Draws that accept about half of each chain.
    drawn = [[*d.token_ids[: nodes // 2], 1, *([0] * (width - nodes // 2 - 1))] for d in drafts]
    logprobs = [[-0.5] * width for _ in drafts]
    accepted = [list(range(nodes // 2)) for _ in drafts]
    buffers = _Buffers(rows, tb)
    model = CostModel(SpecConfig())
    groups = [""] * rows
    fill = StepGraphs._fill
    steps: dict[str, Callable[[], object]] = {
        "tree_layout": lambda: fill(buffers, ids, prefix, parents, uniforms, params, rows, tb),  # type: ignore[arg-type]
        "rank": lambda: model._rank_all(drafts, groups),
        "depth_sums": lambda: [_depth_sums(d, a) for d, a in zip(drafts, accepted, strict=True)],
        "walk": lambda: _walk_drawn(drafts, drawn, logprobs),
    }
    record: dict[str, float | int] = {"rows": rows, "nodes": nodes}
    core = native.core
    if core is None:
        raise SystemExit("the native core is not built: reinstall with a C++17 compiler (pip install -e .)")
    try:
        for name, fn in steps.items():
            for label, backend in (("native", core), ("python", None)):
                native.core = backend
                record[f"{name}_{label}_us"] = round(_time(fn, repeats), 2)
            record[f"{name}_speedup"] = round(record[f"{name}_python_us"] / record[f"{name}_native_us"], 2)
    finally:
        native.core = core
    return record


def main() -> None:
    """Run from the command line: print the table and the JSON record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the record here")
    args = parser.parse_args()
    record = run(args.rows, args.nodes, args.repeats)
    print(f"{'step part':>12} {'python µs':>10} {'native µs':>10} {'speedup':>8}")
    for name in ("tree_layout", "rank", "depth_sums", "walk"):
        print(
            f"{name:>12} {record[f'{name}_python_us']:>10} {record[f'{name}_native_us']:>10} "
            f"{record[f'{name}_speedup']:>7}x"
        )
    print(json.dumps(record, sort_keys=True))
    if args.json:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
