"""How many tokens per forward could any draft reach on a workload? An oracle bound from a trace.

Run: ``python benchmarks/draft_ceiling.py TRACE [--model runs/embedded-model --max-draft 8
--episodes 40 --json PATH]``, with a trace written by ``srt-agent eval ... --trace TRACE``.

Each episode of the trace is rebuilt as one token sequence and teacher-forced through the model
(HF, float32, temperature 1). At every generated position it records the probability of the token
that was sampled and of the model's most likely token (``p_max``). An oracle that drafts the
policy's own mode chain of up to ``--max-draft`` tokens has each drafted token accepted with
probability ``p_max`` (the exact rule accepts a drafted token with its target probability), so
from position ``i`` it expects ``sum_k prod_{j<k} p_max[i+j]`` accepted tokens; the bound printed is
one plus their mean over positions. It uses the sampled path's ``p_max`` for the mode path's (an
approximation that is exact where the two agree, which is where acceptance happens) and ignores
that a tree could hedge between siblings, so it is a guide to what drafting can reach, not a
proof. JSON keys (``--json``): ``tokens``, ``episodes``, ``mean_p_sampled``, ``mean_p_max``,
``oracle_tokens_per_forward``, ``max_draft``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from srt_agent.output.records import write_record


def mode_chain_gain(p_max: Sequence[float], max_draft: int) -> list[float]:
    """Per position of one turn, the expected tokens a mode-chain draft of ``max_draft`` accepts.

    The draft can only cover tokens the turn still has after the one the forward emits anyway.
    """
    n = len(p_max)
    out = []
    for i in range(n):
        expected, reach = 0.0, 1.0
        for k in range(min(max_draft, n - i - 1)):
            reach *= p_max[i + k]
            expected += reach
        out.append(expected)
    return out


def main() -> None:
    """Teacher-force the trace's episodes and print the oracle bound."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--model", default="runs/embedded-model")
    parser.add_argument("--max-draft", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=40, help="episodes of the trace to read")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(args.model)
    model.eval()
    episodes: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in args.trace.read_text().splitlines():
        turn = json.loads(line)
        episodes[turn["episode_id"]].append(turn)
    sampled: list[float] = []
    best: list[float] = []
    gains: list[float] = []
    for turns in list(episodes.values())[: args.episodes]:
        turns.sort(key=lambda t: t["turn"])
        seq: list[int] = []
        spans = []
        for t in turns:  # the episode's one growing sequence: new prompt tokens, then the turn's
            seq += t["new_prompt_ids"]
            spans.append((len(seq), len(t["token_ids"])))
            seq += t["token_ids"]
        with torch.no_grad():
            probs = model(torch.tensor([seq])).logits[0].float().softmax(-1)
        for start, length in spans:
            rows = probs[start - 1 : start - 1 + length]  # position p is predicted at p - 1
            p_max = rows.max(-1).values.tolist()
            best += p_max
            sampled += rows.gather(1, torch.tensor(seq[start : start + length])[:, None])[:, 0].tolist()
            gains += mode_chain_gain(p_max, args.max_draft)
    record = {
        "tokens": len(best),
        "episodes": min(len(episodes), args.episodes),
        "mean_p_sampled": round(sum(sampled) / len(sampled), 4),
        "mean_p_max": round(sum(best) / len(best), 4),
        "oracle_tokens_per_forward": round(1 + sum(gains) / len(gains), 3),
        "max_draft": args.max_draft,
    }
    for key, value in record.items():
        print(f"{key:28s} {value}")
    if args.json is not None:
        write_record(args.json, record)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
