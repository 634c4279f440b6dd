"""Which oracle turns a model reproduces: greedy decoding of every assistant turn, teacher-forced.

Run: ``python benchmarks/turn_probe.py --model DIR [--env srt/Retail-v0] [--episodes 30] [--json PATH]``.

The env's oracle plays held-out tasks (env seeds 0, 1, 2, ...). For each of its assistant turns,
the model gets the oracle's conversation so far and decodes greedily; the turn counts as reproduced
when the model's tokens equal the oracle's, end of turn included. Turns are grouped by kind: the
tool the oracle called, or ``text``. Why: on a multi-turn task one wrong copy derails the rest of
the episode, so held-out success says little about which skill is missing; this says which turn
kind fails (on Retail: the copy of an order id, the look-up of a product id) on the same
conversations, without sampling noise, in about a minute on a CPU.

It also counts the ids the oracle writes (runs of six or more digits: item, product and order
ids), teacher-forced in one forward pass per conversation: an id is right when the model's most
likely next token is the oracle's at each of its tokens, given the oracle's tokens before it. The
first token is where a model picks which record's id to write; the rest continue a copy. Ids are
grouped by turn kind and the word before them (``text/item`` for "... (item 2309139583)",
``get_product_details/value`` for a JSON string value, ``text/W`` for an order id ``#W5104998``),
which on Retail separates the item ids of a proposal from the ids of calls.

JSON keys (``--json``, one flat object): ``<kind>_reproduced`` and ``<kind>_turns`` per turn kind
(``text`` or the tool's name), ``reproduced_share`` (all kinds), ``turns``, ``episodes``,
``seconds``; per id group ``ids_<kind>_<word>`` (ids seen), ``ids_<kind>_<word>_first_right`` and
``ids_<kind>_<word>_right``.
"""

from __future__ import annotations

import argparse
import collections
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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


_ID = re.compile(r"\d{6,}")
"""An id: six or more digits (Retail's item, product and order ids; never a price or a zip code)."""


@dataclass
class Counts:
    """What :func:`probe` counted: turns per turn kind, ids per id group."""

    turns_seen: collections.Counter[str] = field(default_factory=collections.Counter)
    turns_reproduced: collections.Counter[str] = field(default_factory=collections.Counter)
    ids_seen: collections.Counter[str] = field(default_factory=collections.Counter)
    ids_first_right: collections.Counter[str] = field(default_factory=collections.Counter)
    ids_right: collections.Counter[str] = field(default_factory=collections.Counter)


def id_group(kind: str, text: str, start: int) -> str:
    """The group of the id at ``text[start:]``: the turn kind and the word written before it."""
    before = text[:start]
    if before.endswith('"'):
        return f"{kind}/value"
    words = re.findall(r"[A-Za-z_]+", before[-24:])
    return f"{kind}/{words[-1] if words else 'start'}"


def count_ids(counts: Counts, kind: str, pieces: Sequence[str], right: Sequence[bool]) -> None:
    """Count the ids of one turn: ``pieces`` its tokens' text, ``right`` whether each was predicted."""
    text = "".join(pieces)
    ends = [0]
    for p in pieces:
        ends.append(ends[-1] + len(p))
    for match in _ID.finditer(text):
        # The tokens that hold a character of the id.
        covering = [i for i in range(len(pieces)) if ends[i] < match.end() and ends[i + 1] > match.start()]
        group = id_group(kind, text, match.start())
        counts.ids_seen[group] += 1
        counts.ids_first_right[group] += right[covering[0]]
        counts.ids_right[group] += all(right[i] for i in covering)


def probe(model_dir: Path, env_id: str, episodes: int) -> Counts:
    """Per turn kind, the oracle turns reproduced exactly; per id group, the ids predicted."""
    fmt = ChatFormat.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.nn.Module.eval(model)  # (transformers leaves PreTrainedModel.eval untyped)
    eot = fmt.stop_token_ids[0]
    counts = Counts()
    for demo in collect_demos(env_id, episodes, seeds=range(episodes)):
        # The sequence exactly as SFT trains on it; each span is one oracle turn, end of turn included.
        transcript = to_transcript(fmt, demo)
        tokens = transcript.token_ids
        with torch.inference_mode():
            predicted = model(torch.tensor([tokens])).logits[0].argmax(-1).tolist()
        for turn, (start, end) in zip(demo.turns, transcript.turn_spans, strict=True):
            context = torch.tensor([tokens[:start]])
            with torch.inference_mode():
                out = model.generate(
                    context, max_new_tokens=end - start, do_sample=False, eos_token_id=eot, pad_token_id=eot
                )
            kind = turn_kind(turn.action)
            counts.turns_seen[kind] += 1
            counts.turns_reproduced[kind] += tuple(out[0, start:].tolist()) == tokens[start:end]
            pieces = [str(fmt.tokenizer.decode([t], skip_special_tokens=False)) for t in tokens[start:end]]
            right = [predicted[i - 1] == tokens[i] for i in range(start, end)]
            count_ids(counts, kind, pieces, right)
    return counts


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
    counts = probe(args.model, args.env, args.episodes)
    seconds = time.perf_counter() - t0
    seen, hits = counts.turns_seen, counts.turns_reproduced
    table = Table(title=f"{args.env}: oracle turns reproduced by {args.model} (greedy, teacher-forced)")
    table.add_column("turn kind")
    table.add_column("reproduced", justify="right")
    for kind in sorted(seen):
        table.add_row(kind, f"{hits[kind]} / {seen[kind]}")
    total, reproduced = sum(seen.values()), sum(hits.values())
    table.add_row("all", f"{reproduced} / {total} ({reproduced / max(total, 1):.0%})")
    Console().print(table)
    ids = Table(title="ids the oracle wrote, teacher-forced: first token right, every token right")
    for column in ("turn kind / word before", "ids", "first token", "whole id"):
        ids.add_column(column, justify="left" if column.startswith("turn") else "right")
    for group in sorted(counts.ids_seen):
        n = counts.ids_seen[group]
        ids.add_row(group, str(n), str(counts.ids_first_right[group]), str(counts.ids_right[group]))
    if counts.ids_seen:
        Console().print(ids)
    record: dict[str, float | int | str] = {
        "episodes": args.episodes,
        "turns": total,
        "seconds": round(seconds, 1),
    }
    record["reproduced_share"] = round(reproduced / max(total, 1), 4)
    for kind in sorted(seen):
        record[f"{kind}_reproduced"] = hits[kind]
        record[f"{kind}_turns"] = seen[kind]
    for group in sorted(counts.ids_seen):
        key = "ids_" + group.replace("/", "_")
        record[key] = counts.ids_seen[group]
        record[f"{key}_first_right"] = counts.ids_first_right[group]
        record[f"{key}_right"] = counts.ids_right[group]
    if args.json:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
