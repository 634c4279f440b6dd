"""Host time of SGLang's SRT corpus per scheduler step: the tree cache on SGLang's hot path.

Run: ``python benchmarks/sglang_corpus.py [--requests 64 --draft-tokens 8 --steps 400]
[--backends python,native] [--json PATH]``.

SGLang's n-gram worker calls its corpus once per decode step for every running request
(``batch_get``: report what each request committed, draft for each, lay the drafts out in its
fixed-width format). This replays that loop without SGLang or a model: ``--requests`` requests in
GRPO groups of 8 (a group shares a prompt), each committing 1-3 tokens a step drawn from a small
phrase book (so later samples retrace earlier ones and drafts hit, as in RL rollouts), finished
requests replaced by new ones. The same steps run on each core, side by side.

``--json PATH`` writes one flat object: ``<backend>_step_us`` (host µs per ``batch_get`` of all
requests), ``<backend>_us_per_request``, ``<backend>_draft_nodes_per_request`` (non-pad draft
slots served), ``native_speedup`` (Python µs / native µs) and the settings.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from srt_agent.integrations.sglang.corpus import TreeCacheCorpus
from srt_agent.output.records import write_record
from srt_agent.tree_cache import TreeCache, TreeCacheConfig


def replay(backend: str, args: argparse.Namespace) -> dict[str, float]:
    """Run ``args.steps`` scheduler steps on ``backend``'s core; µs per step and draft sizes."""
    rng = random.Random(0)
    vocab = 32_000
    phrases = [[rng.randrange(vocab) for _ in range(rng.randrange(2, 10))] for _ in range(300)]
    prompts = [[rng.randrange(vocab) for _ in range(200)] for _ in range(max(1, args.requests // 8) * 4)]
    cache = TreeCache(TreeCacheConfig(backend=backend))  # type: ignore[arg-type]
    corpus = TreeCacheCorpus(cache, args.draft_tokens + 1, vocab)
    contexts: dict[str, list[int]] = {}
    ends: dict[str, int] = {}
    serial = 0
    spent = 0.0
    for _ in range(args.steps):
        while len(contexts) < args.requests:
            rid = f"req-{serial}"
            prompt = prompts[(serial // 8) % len(prompts)]  # groups of 8 share a prompt
            serial += 1
            contexts[rid] = list(prompt)
            ends[rid] = len(prompt) + rng.randrange(100, 400)
            corpus.bind(rid, prompt)
        ids = list(contexts)
        tails = [contexts[r][-(args.draft_tokens + 8) :] for r in ids]
        lens = [len(contexts[r]) for r in ids]
        t0 = time.perf_counter()
        corpus.batch_get(ids, tails, lens)
        spent += time.perf_counter() - t0
        for r in ids:  # what the verify step accepted: 1-3 tokens, mostly phrase text
            phrase = rng.choice(phrases) if rng.random() < 0.9 else [rng.randrange(vocab)]
            contexts[r].extend(phrase[: rng.randrange(1, 4)])
        done = [r for r in ids if len(contexts[r]) >= ends[r]]
        t0 = time.perf_counter()
        corpus.erase_match_state(done)
        spent += time.perf_counter() - t0
        for r in done:
            del contexts[r], ends[r]
    stats = cache.stats()
    calls = args.steps * args.requests
    return {
        "step_us": spent / args.steps * 1e6,
        "us_per_request": spent / calls * 1e6,
        "draft_nodes_per_request": stats.nodes_served / calls,
    }


def main() -> None:
    """Replay the scheduler loop on each core and print host µs per step."""
    ap = argparse.ArgumentParser(description="SGLang corpus host time per scheduler step, both cores.")
    ap.add_argument("--requests", type=int, default=64, help="running requests per step")
    ap.add_argument("--draft-tokens", type=int, default=8, help="draft slots per request (the root excluded)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--backends", default="python,native")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here (flat JSON)")
    args = ap.parse_args()
    record: dict[str, float | int | str] = {}
    for backend in [b for b in args.backends.split(",") if b]:
        fig = replay(backend, args)
        print(
            f"{backend:>7}: {fig['step_us']:8.0f} µs per step ({args.requests} requests), "
            f"{fig['us_per_request']:5.1f} µs per request, "
            f"{fig['draft_nodes_per_request']:.1f} draft nodes each"
        )
        record.update({f"{backend}_{k}": round(v, 2) for k, v in fig.items()})
    if "python_step_us" in record and "native_step_us" in record:
        ratio = float(record["python_step_us"]) / float(record["native_step_us"])
        record["native_speedup"] = round(ratio, 2)
        print(f"native core: {ratio:.1f}x less host time per step")
    if args.json is not None:
        record.update(
            requests=args.requests, draft_tokens=args.draft_tokens, steps=args.steps, backends=args.backends
        )
        write_record(args.json, record)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
