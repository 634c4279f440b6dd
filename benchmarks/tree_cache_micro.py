"""Micro-benchmark of the tree cache's hot path: µs per ``draft`` and per ``extend``, both cores.

Run: ``python benchmarks/tree_cache_micro.py [--states 64 --group 8 --length 512 --budget 32]
[--backends python,native] [--json PATH]``.

The cache is filled with GRPO-like groups (samples share prefixes with earlier samples of their
state and reuse common phrases), so each state's tree has thousands of nodes. Each call kind is
then timed in a loop, single-threaded, once per core (native C++ and the Python reference, side
by side); the table also shows which source served the drafts and how many nodes they had, so a
fast path that returns nothing cannot pass for a fast draft. The ``batch_*`` calls are the
engine's: one ``draft_many`` or ``extend_many`` for ``--rows`` rows, reported per row (drafts) or
per token (extends). ``--json PATH`` writes the figures as one flat object:
``<backend>_<call>_us`` per timed call kind (keys in :data:`CALLS`), ``<backend>_insert_tokens_per_s``,
``<backend>_cache_mib``, ``native_speedup_<call>`` (Python µs / native µs), ``nodes_per_state`` and
the settings.
``--trace TRACE`` (repeatable; an ``srt-agent eval --trace`` file) adds real-trace figures from
``draft_replay.py``'s replay: ``trace_{env}_{mode}_draft_us``, ``..._report_us_per_token`` and
``..._tokens_per_forward`` for the engine's batched path (``cursor``) and the per-row one (``search``).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from srt_agent.contracts.draft import DraftQuery, DraftTree, StreamUpdate
from srt_agent.output.records import write_record
from srt_agent.tree_cache import TreeCache, TreeCacheConfig

Groups = list[tuple[str, str, list[list[int]]]]

# Timed call kinds: JSON key -> table label.
CALLS = {
    "draft_exact_root": "draft exact, walk from root (64..448 tokens)",
    "draft_exact_stream": "draft exact, stream head start (300 tokens)",
    "draft_task_fallback": "draft task fallback (suffix match)",
    "draft_global_fallback": "draft global fallback (suffix match)",
    "draft_miss": "draft miss (nothing matches)",
    "extend_new": "extend 1 token, new node",
    "extend_existing": "extend 1 token, existing node",
    "extend_existing8": "extend 8 tokens, existing nodes",
    "batch_draft_exact": "draft_many, per row: stream cursors",
    "batch_draft_fallback": "draft_many, per row: task fallbacks",
    "batch_extend_new": "extend_many, per token: new nodes",
    "batch_extend_existing": "extend_many, per token: existing nodes",
}


def replay_trace(path: Path, budget: int = 8, repeat: int = 3) -> dict[str, float]:
    """Real-trace figures from ``benchmarks/draft_replay.py``'s replay of ``path``.

    Both the engine's batched path (``cursor``) and the per-row one (``search``), as
    ``trace_{env}_{mode}_{figure}``. For the code before a change, run ``draft_replay.py TRACE
    --modes search`` with ``PYTHONPATH`` set to a checkout of it.
    """
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import draft_replay  # a sibling script

    turns = draft_replay.read_turns(path)
    out: dict[str, float] = {}
    for mode in ("cursor", "search"):
        best: dict[str, Counter[str]] = {}
        for _ in range(repeat):
            for env, counts in draft_replay.replay(turns, TreeCacheConfig(), budget, mode).items():
                kept = best.setdefault(env, counts)
                for key in ("draft_ns", "report_ns"):
                    kept[key] = min(kept[key], counts[key])
        for env, counts in best.items():
            if env == "all":  # a trace of one env: the same figures again
                continue
            fig = draft_replay.figures(counts)
            print(
                f"  trace {path.name} {env:11s} {mode:6s} {fig['draft_us']:6.1f} µs/draft  "
                f"{fig['report_us_per_token']:5.2f} µs/token  {fig['tokens_per_forward']:.2f} tok/fwd"
            )
            for key in ("draft_us", "report_us_per_token", "tokens_per_forward"):
                out[f"trace_{env}_{mode}_{key}"] = fig[key]
    return out


def make_groups(states: int, group: int, length: int, vocab: int, seed: int = 0) -> Groups:
    """``states`` states (16 tasks), each with ``group`` samples of ``length`` tokens."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(vocab) for _ in range(rng.randrange(3, 12))] for _ in range(200)]
    out = []
    for s in range(states):
        seqs: list[list[int]] = []
        for _ in range(group):
            seq = list(rng.choice(seqs)[: rng.randrange(length)]) if seqs and rng.random() < 0.7 else []
            while len(seq) < length:
                seq.extend(rng.choice(phrases) if rng.random() < 0.5 else [rng.randrange(vocab)])
            seqs.append(seq[:length])
        out.append((f"state{s}", f"task{s % 16}", seqs))
    return out


def time_calls(fn: Callable[[int], object], n: int, warmup: bool = True) -> tuple[float, list[object]]:
    """Mean µs per call of ``fn(i)`` for ``i < n``, and the results.

    ``warmup``: call ``fn(0)`` once untimed first (not for calls that must not be repeated, such as
    a stream's next tokens: reporting them twice would make the rest of its path new nodes).
    """
    if warmup:
        fn(0)
    out: list[object] = []
    t0 = time.perf_counter()
    for i in range(n):
        out.append(fn(i))
    return (time.perf_counter() - t0) / n * 1e6, out


def describe(results: list[object]) -> str:
    """Sources and mean size of the drafts among ``results``."""
    drafts = [r for r in results if isinstance(r, DraftTree)]
    if not drafts:
        return ""
    sources = Counter(d.source for d in drafts)
    mix = ", ".join(f"{s} {c / len(drafts):.0%}" for s, c in sources.most_common())
    return f"{mix}; {sum(len(d) for d in drafts) / len(drafts):.1f} nodes"


def measure(
    backend: str, data: Groups, args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, float], str]:
    """Fill a cache with ``backend``'s core and time every call kind.

    Returns:
        µs per call kind, fill figures, and a description of each call's drafts.
    """
    cache = TreeCache(TreeCacheConfig(backend=backend))  # type: ignore[arg-type]
    t0 = time.perf_counter()
    for key, task, seqs in data:
        for seq in seqs:
            cache.insert(key, task, seq)
    fill_s = time.perf_counter() - t0
    stats = cache.stats()
    print(
        f"{backend} cache: {stats.states} states, {stats.nodes} nodes "
        f"({stats.nodes // stats.states} per state), {stats.bytes / 2**20:.1f} MiB estimated; "
        f"insert() {stats.tokens_added / fill_s / 1e3:.0f}k tokens/s"
    )
    fill = {
        "insert_tokens_per_s": round(stats.tokens_added / fill_s),
        "cache_mib": round(stats.bytes / 2**20, 2),
        "nodes_per_state": stats.nodes // stats.states,
    }
    rng = random.Random(1)
    picks = [
        (rng.choice(data), rng.randrange(args.group), rng.randrange(64, args.length - 64)) for _ in range(256)
    ]
    b, n = args.budget, args.reps
    us: dict[str, float] = {}
    what: dict[str, str] = {}

    def run(name: str, fn: Callable[[int], object], per: int = 1, reps: int = n, warmup: bool = True) -> None:
        gc.collect()  # not the other core's garbage: each call kind pays only for its own
        mean, results = time_calls(fn, reps, warmup)
        us[name] = mean / per
        flat = [d for r in results for d in (r if isinstance(r, list) else [r])]
        what[name] = describe(flat)

    def exact_walk(i: int) -> object:  # no stream of this state: walk `generated` from the root
        (key, task, seqs), g, cut = picks[i % len(picks)]
        return cache.draft(key, task, (), seqs[g][:cut], b)

    run("draft_exact_root", exact_walk)

    # The engine's pattern: a stream extended as it generates, drafted for at every step.
    key, task, seqs = data[0]
    cache.extend("bench", key, task, seqs[0][:300])
    gen = list(seqs[0][:300])
    run("draft_exact_stream", lambda i: cache.draft(key, task, (), gen, b))
    cache.finish("bench")

    def task_fallback(i: int) -> object:  # a new state of a known task, mid-generation
        (_, task, seqs), g, cut = picks[i % len(picks)]
        return cache.draft("new-state", task, (), seqs[g][cut - 20 : cut], b)

    def global_fallback(i: int) -> object:
        (_, _, seqs), g, cut = picks[i % len(picks)]
        return cache.draft("new-state", "new-task", (), seqs[g][cut - 20 : cut], b)

    run("draft_task_fallback", task_fallback)
    run("draft_global_fallback", global_fallback)
    misses = [[rng.randrange(args.vocab, 2 * args.vocab) for _ in range(20)] for _ in range(64)]
    run("draft_miss", lambda i: cache.draft("new-state", "new-task", (), misses[i % 64], b))

    fresh = [rng.randrange(args.vocab) for _ in range(n + 1)]
    run("extend_new", lambda i: cache.extend("fresh", "fresh-state", "task0", fresh[i : i + 1]), warmup=False)
    cache.finish("fresh")
    key, task, seqs = data[1]
    known = seqs[0]

    def extend_known(i: int) -> None:  # a sample retracing an earlier one: counts change only
        j = i % len(known)
        cache.extend(f"again{i - j}", key, task, known[j : j + 1])

    run("extend_existing", extend_known, warmup=False)

    def extend_known8(i: int) -> None:
        j = (8 * i) % 504  # 63 calls retrace the first 504 tokens, then a new stream starts over
        cache.extend(f"eight{8 * i - j}", key, task, known[j : j + 8])

    run("extend_existing8", extend_known8, warmup=False)

    # The engine's calls: every row of a step at once. Rows retrace earlier samples of their states
    # (a GRPO group's later samples), so the cursors serve exact drafts, or are new states of known
    # tasks (the fallback search).
    rows, steps = args.rows, max(8, n // args.rows)
    lanes = [picks[r % len(picks)] for r in range(rows)]
    texts = [seqs_[g] for (_, _, seqs_), g, _ in lanes]
    ids = [f"row{r}" for r in range(rows)]
    for r, ((key_, task_, _), _, cut) in enumerate(lanes):
        cache.extend(ids[r], key_, task_, texts[r][:cut])
    # Each row's stream has reported its text up to `cut`: its query is served from the cursor.
    ex_queries = [
        DraftQuery(ids[r], lanes[r][0][0], lanes[r][0][1], (), texts[r][: lanes[r][2]], b)
        for r in range(rows)
    ]
    run("batch_draft_exact", lambda i: cache.draft_many(ex_queries), per=rows, reps=steps)
    fb = [
        DraftQuery(f"nobody{r}", "new-state", lanes[r][0][1], (), texts[r][lanes[r][2] - 20 : lanes[r][2]], b)
        for r in range(rows)
    ]
    run("batch_draft_fallback", lambda i: cache.draft_many(fb), per=rows, reps=steps)
    for r in range(rows):
        cache.finish(ids[r])
    # The updates are built before timing (the engine has them at hand); each step one token per row,
    # for enough steps that starting the rows' streams is amortised as over a generation.
    ext_steps = max(8, n // 10)
    new_ups = [
        [
            StreamUpdate(f"new{r}", f"new-state{r}", f"task{r % 16}", [rng.randrange(args.vocab)])
            for r in range(rows)
        ]
        for _ in range(ext_steps + 1)
    ]
    run("batch_extend_new", lambda i: cache.extend_many(new_ups[i]), per=rows, reps=ext_steps, warmup=False)
    old_ups = [
        [
            StreamUpdate(
                f"old{r}/{i // 400}", lanes[r][0][0], lanes[r][0][1], texts[r][i % 400 : i % 400 + 1]
            )
            for r in range(rows)
        ]
        for i in range(ext_steps + 1)
    ]
    run(
        "batch_extend_existing",
        lambda i: cache.extend_many(old_ups[i]),
        per=rows,
        reps=ext_steps,
        warmup=False,
    )
    cache.check_integrity()
    return us, fill, "; ".join(f"{k}: {v}" for k, v in what.items() if v and k.startswith("batch"))


def main() -> None:
    """Fill a cache per core and print µs per call of each hot-path operation, side by side."""
    ap = argparse.ArgumentParser(description="Tree cache micro-benchmark: µs per draft / extend, both cores.")
    ap.add_argument("--states", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--rows", type=int, default=128, help="rows per batched call (an engine step's batch)")
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--backends", default="python,native", help="cores to time, comma-separated")
    ap.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=[],
        help="also replay this eval trace (repeatable): µs per draft call and per reported token",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here (flat JSON)")
    args = ap.parse_args()

    data = make_groups(args.states, args.group, args.length, args.vocab)
    backends = [x for x in args.backends.split(",") if x]
    results = {backend: measure(backend, data, args) for backend in backends}
    record: dict[str, float | int | str] = {}
    print(f"budget {args.budget} nodes, {args.reps} calls each, batched calls {args.rows} rows")
    print(
        f"  {'call':<46} "
        + " ".join(f"{x:>9}" for x in backends)
        + ("   speedup" if len(backends) > 1 else "")
    )
    for call, label in CALLS.items():
        cells = [results[x][0][call] for x in backends]
        line = f"  {label:<46} " + " ".join(f"{c:7.2f}µs" for c in cells)
        if "python" in results and "native" in results:
            ratio = results["python"][0][call] / max(results["native"][0][call], 1e-9)
            record[f"native_speedup_{call}"] = round(ratio, 1)
            line += f"  {ratio:7.1f}x"
        print(line)
    for backend, (us, fill, what) in results.items():
        print(f"  {backend} batched drafts: {what}")
        record.update({f"{backend}_{call}_us": round(v, 3) for call, v in us.items()})
        record[f"{backend}_insert_tokens_per_s"] = fill["insert_tokens_per_s"]
        record[f"{backend}_cache_mib"] = fill["cache_mib"]
        record["nodes_per_state"] = fill["nodes_per_state"]
    for trace in args.trace:
        record.update(replay_trace(trace))
    if args.json is not None:
        record.update(
            states=args.states,
            group=args.group,
            length=args.length,
            vocab=args.vocab,
            budget=args.budget,
            rows=args.rows,
            reps=args.reps,
            backends=args.backends,
        )
        write_record(args.json, record)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
