"""Replay a rollout trace through the tree cache: tokens per forward and host cost of drafting.

Run: ``python benchmarks/draft_replay.py TRACE [--budget 8 --window 3 --backoff-window 1
--modes cursor,search --mode-bound MODEL --json PATH]``, with a trace written by ``srt-agent eval ...
--trace TRACE`` (``--no-spec`` keeps the sampled text independent of the drafts); the cache's
settings default to the product's (``TreeCacheConfig``).

Each generated turn of the trace is replayed, in file order, as one stream of the cache: from each
position, one draft of at most ``--budget`` nodes is asked for, its longest path that the recorded
text follows is accepted, and the forward emits that plus one more token (what exact verification
accepts when the policy samples the recorded tokens). The emitted tokens are then reported to the
cache, as the engine reports committed tokens. So the cache sees earlier turns of the same task,
earlier tasks, and the turn's own text, as a rollout would (run in sequence, not in lockstep).

Modes (each replays the whole trace on a fresh cache; figures side by side):

* ``cursor``: the engine's path: ``draft_many`` and ``extend_many`` per step, drafting from each
  stream's cursors (incremental matching);
* ``search``: a fresh search per draft (``draft`` with the generated tokens: walk from the state's
  root, suffix matching) and one ``extend`` per row, the cache's per-row path (the engine's path
  before batched drafting; with ``PYTHONPATH`` set to an older checkout, that checkout's code).

``--mode-bound MODEL`` also bounds what the policy's own most likely token (its *mode*, free from
the logits the engine computes anyway) could add as a draft signal if each cache node stored the
mode seen there: the modes come from one teacher-forced forward of MODEL per episode, and at each
forward where the accepted path stops short of the budget, a node whose mode is the token the
policy sampled there would have added one accepted token. ``mode_within_budget``: only where the
draft left a node of its budget free; ``mode_displacing``: also where the mode would have taken the
place of a drafted leaf (an upper bound: the live context's mode, as if stored). Both keep the
default's forwards, so they bound a single mode token per forward, not chains of them.

Printed per mode and env: tokens per forward, the share of empty drafts, drafts and accepted tokens
by source, host microseconds per draft call and per reported token (``time.perf_counter`` around
the cache's calls; the fastest of ``--repeat`` interleaved replays, as this machine's speed
drifts). JSON keys (``--json``, one flat object): ``{mode}_{env}_{figure}`` with figures
``tokens_per_forward``, ``empty_share``, ``draft_us``, ``report_us_per_token``, ``drafts_{source}``,
``accepted_{source}``, and with ``--mode-bound`` ``mode_agreement`` (share of generated tokens that
were the mode), ``mode_within_budget`` and ``mode_displacing`` (tokens per forward);
``{env}`` is the env id's name (``Calculator``), or ``all``; plus ``budget``,
``window``, ``backoff_window``, ``turns``.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from srt_agent.contracts.draft import DraftTree
from srt_agent.output.records import write_record
from srt_agent.rollout.trace import iter_trace
from srt_agent.tree_cache import TreeCache, TreeCacheConfig

try:
    from srt_agent.contracts.draft import DraftQuery, StreamUpdate
except ImportError:  # an older tree (PYTHONPATH=<checkout of it>): only the search mode runs
    DraftQuery = StreamUpdate = None  # type: ignore[assignment,misc]


def accepted_path(draft: DraftTree, text: Sequence[int]) -> int:
    """How many of ``text``'s tokens the draft tree spells from its root (the accepted path)."""
    pairs = zip(draft.token_ids, draft.parents, strict=True)
    children: dict[tuple[int, int], int] = {(p, t): j for j, (t, p) in enumerate(pairs)}
    node, n = -1, 0
    while n < len(text):
        nxt = children.get((node, text[n]))
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n


Turn = tuple[str, str, str, list[int]]  # (env name, state key, task id, generated tokens)


def read_turns(path: Path, key: str = "state") -> list[Turn]:
    """The generated turns of an ``srt-trace/1`` file, in file order, env ids shortened.

    ``key``: ``state`` files each turn under its exact prompt's key (the trace's ``state_key``);
    ``env`` under its environment state's (:func:`env_state_key` of the task and every prompt
    token the policy did not generate, i.e. each turn's ``new_prompt_ids`` so far).
    """
    out: list[Turn] = []
    env_key = ""
    for t in iter_trace(path):
        if key == "env":
            env_key = env_state_key(env_key if t.turn else "", t.new_prompt_ids)
        env = t.env_id.split("/")[-1].split("-")[0]
        out.append((env, env_key or t.state_key, t.task_id, list(t.token_ids)))
    return out


def env_state_key(previous: str, new_prompt_ids: Sequence[int]) -> str:
    """Key of an environment state: what the environment said so far, not how the policy said it.

    Chained over an episode's turns from ``previous`` (the previous turn's key, ``""`` on the
    first turn, whose key is then the exact prompt's): turns that reached the same observations
    through differently worded actions share it.
    """
    h = hashlib.blake2b(previous.encode(), digest_size=16)
    for t in new_prompt_ids:
        h.update(int(t).to_bytes(4, "little", signed=False))
    return h.hexdigest()


def policy_modes(path: Path, model_dir: Path) -> list[list[int]]:
    """The policy's most likely token at each generated token of the trace, turn by turn, file order.

    One teacher-forced float32 forward per episode over its prompts and generated text (a turn's
    prompt is the episode so far plus its ``new_prompt_ids``), read at the position that sampled
    each generated token.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    episodes: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # (turn index, start, length)
    texts: dict[str, list[int]] = defaultdict(list)
    n_turns = 0
    for t in iter_trace(path):
        text = texts[t.episode_id]
        text.extend(t.new_prompt_ids)
        episodes[t.episode_id].append((n_turns, len(text), len(t.token_ids)))
        text.extend(t.token_ids)
        n_turns += 1
    out: list[list[int]] = [[] for _ in range(n_turns)]
    with torch.no_grad():
        for eid, spans in episodes.items():
            best = model(torch.tensor([texts[eid]])).logits[0].argmax(-1).tolist()
            for i, start, n in spans:
                out[i] = best[start - 1 : start - 1 + n]
    return out


def replay(
    turns: list[Turn],
    config: TreeCacheConfig,
    budget: int,
    mode: str,
    policy: list[list[int]] | None = None,
) -> dict[str, Counter[str]]:
    """Replay ``(env, state key, task id, tokens)`` turns; per env (and ``all``) the raw counts.

    ``policy``: the policy's mode at each generated token (:func:`policy_modes`), to count the
    mode-signal bounds (see the module's doc).
    """
    cache = TreeCache(config)
    stats: dict[str, Counter[str]] = defaultdict(Counter)
    timing: dict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
    for i, (env, key, task, tokens) in enumerate(turns):
        sid = f"turn{i}"
        pos = 0
        cache.extend(sid, key, task, [])  # the stream starts at the prompt
        while pos < len(tokens):
            left = len(tokens) - pos - 1  # the forward emits one token anyway
            k = min(budget, left)
            start = time.perf_counter()
            if k <= 0:
                draft = DraftTree()
            elif mode == "cursor":
                draft = cache.draft_many([DraftQuery(sid, key, task, (), tokens[:pos], k)])[0]
            else:
                draft = cache.draft(key, task, (), tokens[:pos], k)
            drafted = time.perf_counter()
            n = accepted_path(draft, tokens[pos:]) if draft else 0
            emitted = tokens[pos : pos + n + 1]
            stop = pos + n  # where the draft failed (or ran out): a node's stored mode could go on
            mode_hit = (
                policy is not None and bool(draft) and n < k and stop + 1 < len(tokens)
                and policy[i][stop] == tokens[stop]
            )  # fmt: skip
            if mode == "cursor":
                cache.extend_many([StreamUpdate(sid, key, task, emitted)])
            else:
                cache.extend(sid, key, task, emitted)
            reported = time.perf_counter()
            for scope in (env, "all"):
                s, t = stats[scope], timing[scope]
                s["forwards"] += 1
                s["tokens"] += len(emitted)
                if policy is not None:
                    s["mode_agree"] += sum(
                        m == t for m, t in zip(policy[i][pos : stop + 1], emitted, strict=False)
                    )
                    s["mode_displacing"] += mode_hit
                    s["mode_within_budget"] += mode_hit and len(draft.token_ids) < k
                if k > 0:
                    s["draft_calls"] += 1
                    s[f"drafts_{draft.source}"] += 1
                    s[f"accepted_{draft.source}"] += n
                    t["draft_s"] += drafted - start
                t["report_s"] += reported - drafted
            pos += len(emitted)
        cache.finish(sid)
    for scope, t in timing.items():
        stats[scope]["draft_ns"] = int(1e9 * t["draft_s"])
        stats[scope]["report_ns"] = int(1e9 * t["report_s"])
    return stats


def figures(s: Counter[str]) -> dict[str, float]:
    """The printed figures of one mode and env from its counts."""
    calls = max(1, s["draft_calls"])
    out = {
        "tokens_per_forward": round(s["tokens"] / max(1, s["forwards"]), 3),
        "empty_share": round(s["drafts_none"] / calls, 3),
        "draft_us": round(s["draft_ns"] / 1000 / calls, 2),
        "report_us_per_token": round(s["report_ns"] / 1000 / max(1, s["tokens"]), 3),
    }
    for source in ("exact", "task", "global", "none"):
        out[f"drafts_{source}"] = s[f"drafts_{source}"]
        out[f"accepted_{source}"] = s[f"accepted_{source}"]
    if "mode_agree" in s:
        forwards = max(1, s["forwards"])
        out["mode_agreement"] = round(s["mode_agree"] / max(1, s["tokens"]), 3)
        for bound in ("mode_within_budget", "mode_displacing"):
            out[bound] = round((s["tokens"] + s[bound]) / forwards, 3)
    return out


def main() -> None:
    """Read the trace, replay it in each mode, print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--budget", type=int, default=8, help="draft nodes per forward")
    defaults = TreeCacheConfig()
    parser.add_argument("--window", type=int, default=defaults.window, help="the tree cache's suffix window")
    parser.add_argument(
        "--backoff-window", type=int, default=defaults.backoff_window, help="the tree cache's back-off window"
    )
    parser.add_argument("--modes", default="cursor,search", help="comma-separated: cursor, search")
    parser.add_argument(
        "--backend", default="auto", choices=["auto", "native", "python"], help="the tree cache's core"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="replays per mode, interleaved; timings are the fastest"
    )
    parser.add_argument(
        "--key", choices=("state", "env"), default="state", help="what a tree is keyed by (see read_turns)"
    )
    parser.add_argument(
        "--mode-bound",
        type=Path,
        default=None,
        metavar="MODEL",
        help="bound the mode signal with this policy",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = sorted(set(modes) - {"cursor", "search"})
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from cursor, search")
    if "cursor" in modes and DraftQuery is None:
        parser.error("this srt_agent has no batched drafting (draft_many): use --modes search")
    config = TreeCacheConfig(window=args.window, backoff_window=args.backoff_window, backend=args.backend)
    turns = read_turns(args.trace, args.key)
    policy = policy_modes(args.trace, args.mode_bound) if args.mode_bound is not None else None
    record: dict[str, float | int] = {
        "budget": args.budget,
        "window": args.window,
        "backoff_window": args.backoff_window,
        "turns": len(turns),
    }
    best: dict[str, dict[str, Counter[str]]] = {}
    for _ in range(max(1, args.repeat)):  # interleaved, so a slow stretch of the machine hits all modes
        for mode in modes:
            got = replay(turns, config, args.budget, mode, policy)
            if mode not in best:
                best[mode] = got
                continue
            for env, counts in got.items():  # the counts are deterministic; keep the fastest timings
                for key in ("draft_ns", "report_ns"):
                    best[mode][env][key] = min(best[mode][env][key], counts[key])
    for mode in modes:
        for env, counts in sorted(best[mode].items()):
            fig = figures(counts)
            hits = " ".join(
                f"{s} {fig[f'drafts_{s}']}/{fig[f'accepted_{s}']}" for s in ("exact", "task", "global")
            )
            print(
                f"{mode:7s} {env:12s} tok/fwd {fig['tokens_per_forward']:.3f}  "
                f"empty {fig['empty_share']:.1%}  draft {fig['draft_us']:.1f} us/call  "
                f"report {fig['report_us_per_token']:.2f} us/token  drafts/accepted by source: {hits}"
            )
            if "mode_agreement" in fig:
                print(
                    f"{'':7s} {env:12s} policy mode = sampled token {fig['mode_agreement']:.1%}; "
                    f"with stored modes tok/fwd <= {fig['mode_within_budget']:.3f} within the budget, "
                    f"<= {fig['mode_displacing']:.3f} displacing a leaf"
                )
            record.update({f"{mode}_{env}_{k}": v for k, v in fig.items()})
    if args.json is not None:
        write_record(args.json, record)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
