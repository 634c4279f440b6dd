"""Micro-benchmark of the tree cache's hot path: µs per ``draft`` and per ``extend``.

Run: ``python benchmarks/tree_cache_micro.py [--states 64 --group 8 --length 512 --budget 32]
[--json PATH]``.

The cache is filled with GRPO-like groups (samples share prefixes with earlier samples of their
state and reuse common phrases), so each state's tree has thousands of nodes. Each call kind is
then timed in a loop, single-threaded; the table also shows which source served the drafts and
how many nodes they had, so a fast path that returns nothing cannot pass for a fast draft.
``--json PATH`` writes the figures as one flat object: ``<call>_us`` per timed call kind (keys in
:data:`CALLS`), ``insert_tokens_per_s``, ``nodes_per_state``, ``cache_mib`` and the settings.
``--trace TRACE`` (repeatable; an ``srt-agent eval --trace`` file) adds real-trace figures from
``draft_replay.py``'s replay: ``trace_{env}_{mode}_draft_us``, ``..._report_us_per_token`` and
``..._tokens_per_forward`` for the engine's batched path (``cursor``) and the per-row one (``search``).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from srt_agent.contracts.draft import DraftTree
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


def time_calls(fn: Callable[[int], object], n: int) -> tuple[float, list[object]]:
    """Mean µs per call of ``fn(i)`` for ``i < n``, and the results."""
    fn(0)  # warm up
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


def main() -> None:
    """Fill a cache and print µs per call of each hot-path operation."""
    ap = argparse.ArgumentParser(description="Tree cache micro-benchmark: µs per draft / extend.")
    ap.add_argument("--states", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2000)
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
    cache = TreeCache()
    t0 = time.perf_counter()
    for key, task, seqs in data:
        for seq in seqs:
            cache.insert(key, task, seq)
    fill_s = time.perf_counter() - t0
    stats = cache.stats()
    print(
        f"cache: {stats.states} states, {stats.nodes} nodes ({stats.nodes // stats.states} per state), "
        f"{stats.bytes / 2**20:.1f} MiB estimated; insert() {stats.tokens_added / fill_s / 1e3:.0f}k tokens/s"
    )

    rng = random.Random(1)
    picks = [
        (rng.choice(data), rng.randrange(args.group), rng.randrange(64, args.length - 64)) for _ in range(256)
    ]
    b, n = args.budget, args.reps
    rows: list[tuple[str, float, str]] = []

    def run(key: str, fn: Callable[[int], object]) -> None:
        us, results = time_calls(fn, n)
        rows.append((key, us, describe(results)))

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
    run("extend_new", lambda i: cache.extend("fresh", "fresh-state", "task0", fresh[i : i + 1]))
    cache.finish("fresh")
    key, task, seqs = data[1]
    known = seqs[0]

    def extend_known(i: int) -> None:  # a sample retracing an earlier one: counts change only
        j = i % len(known)
        cache.extend(f"again{i - j}", key, task, known[j : j + 1])

    run("extend_existing", extend_known)

    def extend_known8(i: int) -> None:
        j = (8 * i) % 504  # 63 calls retrace the first 504 tokens, then a new stream starts over
        cache.extend(f"eight{8 * i - j}", key, task, known[j : j + 8])

    run("extend_existing8", extend_known8)

    print(f"budget {b} nodes, {n} calls each")
    for key, us, what in rows:
        print(f"  {CALLS[key]:<46} {us:7.1f} µs   {what}")
    cache.check_integrity()
    record: dict[str, float | int] = {f"{key}_us": round(us, 2) for key, us, _ in rows}
    for trace in args.trace:
        record.update(replay_trace(trace))
    if args.json is not None:
        record.update(
            insert_tokens_per_s=round(stats.tokens_added / fill_s),
            nodes_per_state=stats.nodes // stats.states,
            cache_mib=round(stats.bytes / 2**20, 2),
            states=args.states,
            group=args.group,
            length=args.length,
            vocab=args.vocab,
            budget=b,
            reps=n,
        )
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
