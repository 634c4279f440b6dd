"""Which oracle turns a model reproduces: greedy decoding of every assistant turn, teacher-forced.

Run: ``python benchmarks/turn_probe.py --model DIR [--env srt/Retail-v0] [--episodes 30] [--json PATH]``.

The env's oracle plays held-out tasks (env seeds 0, 1, 2, ...). For each of its assistant turns,
the model gets the oracle's conversation so far and decodes greedily; the turn counts as reproduced
when the model's tokens equal the oracle's, end of turn included. Turns are grouped by kind: the
tool the oracle called, or ``text``. Why: on a multi-turn task one wrong copy derails the rest of
the episode, so held-out success says little about which skill is missing; this says which turn
kind fails (on Retail: the copy of an order id, the look-up of a product id) on the same
conversations, without sampling noise, in about a minute on a CPU.

JSON keys (``--json``, one flat object): ``<kind>_reproduced`` and ``<kind>_turns`` per turn kind
(``text`` or the tool's name), ``reproduced_share`` (all kinds), ``turns``, ``episodes``, ``seconds``.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM

from srt_agent.chat.template import ChatFormat
from srt_agent.output.records import write_record
from srt_agent.recipe.demos import collect_demos, to_transcript
from srt_agent.tooling.parser import parse_tool_calls


def turn_kind(action: str) -> str:
    """The tool the turn calls first, or ``text`` for a turn without a call."""
    parsed = parse_tool_calls(action)
    return parsed.calls[0].name if parsed.calls else "text"


def probe(model_dir: Path, env_id: str, episodes: int) -> tuple[dict[str, int], dict[str, int]]:
    """Per turn kind, the oracle turns reproduced exactly and the turns seen."""
    fmt = ChatFormat.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.nn.Module.eval(model)  # (transformers leaves PreTrainedModel.eval untyped)
    eot = fmt.stop_token_ids[0]
    hits: collections.Counter[str] = collections.Counter()
    seen: collections.Counter[str] = collections.Counter()
    for demo in collect_demos(env_id, episodes, seeds=range(episodes)):
        # The sequence exactly as SFT trains on it; each span is one oracle turn, end of turn included.
        transcript = to_transcript(fmt, demo)
        tokens = transcript.token_ids
        for turn, (start, end) in zip(demo.turns, transcript.turn_spans, strict=True):
            context = torch.tensor([tokens[:start]])
            with torch.inference_mode():
                out = model.generate(
                    context, max_new_tokens=end - start, do_sample=False, eos_token_id=eot, pad_token_id=eot
                )
            kind = turn_kind(turn.action)
            seen[kind] += 1
            hits[kind] += tuple(out[0, start:].tolist()) == tokens[start:end]
    return dict(hits), dict(seen)


def main() -> None:
    """Parse arguments, probe, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="A model directory (a build's --out).")
    parser.add_argument("--env", default="srt/Retail-v0", help="An env with an oracle.")
    parser.add_argument("--episodes", type=int, default=30, help="Held-out tasks (env seeds 0..N-1).")
    parser.add_argument("--threads", type=int, default=2, help="Torch CPU threads.")
    parser.add_argument("--json", type=Path, help="Write the figures here (one flat JSON object).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    hits, seen = probe(args.model, args.env, args.episodes)
    seconds = time.perf_counter() - t0
    table = Table(title=f"{args.env}: oracle turns reproduced by {args.model} (greedy, teacher-forced)")
    table.add_column("turn kind")
    table.add_column("reproduced", justify="right")
    for kind in sorted(seen):
        table.add_row(kind, f"{hits.get(kind, 0)} / {seen[kind]}")
    total, reproduced = sum(seen.values()), sum(hits.values())
    table.add_row("all", f"{reproduced} / {total} ({reproduced / max(total, 1):.0%})")
    Console().print(table)
    record: dict[str, float | int | str] = {
        "episodes": args.episodes,
        "turns": total,
        "seconds": round(seconds, 1),
    }
    record["reproduced_share"] = round(reproduced / max(total, 1), 4)
    for kind in sorted(seen):
        record[f"{kind}_reproduced"] = hits.get(kind, 0)
        record[f"{kind}_turns"] = seen[kind]
    if args.json:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
