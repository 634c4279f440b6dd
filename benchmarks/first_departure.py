"""Where a model's own episodes first leave the env's oracle: a trace replayed, the oracle asked each turn.

Run: ``python benchmarks/first_departure.py --trace T --model DIR [-o KEY=VALUE ...] [--examples 3]
[--json PATH]``, with ``T`` from ``srt-agent eval --env ENV --model DIR --trace T`` (same ``-o``).

``benchmarks/turn_probe.py`` asks which oracle turns a model reproduces on the oracle's own
conversations; this asks where the model's *own* conversations first go another way, which is
where an episode is lost when one mistake derails the rest (:mod:`srt_agent.evaluation.departures`).
It prints, per turn index, how many episodes first departed there and what the oracle would have
done against what the model did (by kind: the tool called, ``text``, or ``malformed``); then, over
every replayed turn (the replay goes on after a departure with the model's turns), how often the
model departed per kind of oracle turn, since a first departure may be harmless (a greeting with
the wrong first name) and the one that loses the episode come later; then a few examples.
Seconds for a few hundred episodes (env steps only, no model).

JSON keys (``--json``, one flat object): ``episodes``, ``replayed`` (episodes the env answered as
traced), ``departed`` (replayed episodes with a departure), ``departed_solved`` (of those, solved
anyway), ``departure_turn_mean``, ``turn_<t>`` (episodes that first departed at turn ``t``),
``expected_<kind>`` and ``actual_<kind>`` (the oracle's and the model's turn kinds there),
``<kind>_turns`` and ``<kind>_departed`` (every replayed turn whose oracle turn is of that kind).
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from rich.console import Console
from rich.table import Table

from srt_agent.chat.template import ChatFormat
from srt_agent.cli.app import parse_env_options
from srt_agent.evaluation.departures import action_kind, first_departures
from srt_agent.output.records import write_record
from srt_agent.rollout.trace import iter_trace


def _short(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def main() -> None:
    """Parse arguments, replay the trace, print the table and examples, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="An eval trace (srt-agent eval --trace).")
    parser.add_argument("--model", type=Path, required=True, help="The model that wrote it (its tokenizer).")
    parser.add_argument("-o", "--option", action="append", help="An env option the eval used, KEY=VALUE.")
    parser.add_argument("--examples", type=int, default=3, help="Departures to print in full.")
    parser.add_argument("--json", type=Path, help="Write the figures here (one flat JSON object).")
    args = parser.parse_args()
    fmt = ChatFormat.from_pretrained(args.model)
    found = first_departures(iter_trace(args.trace), fmt, parse_env_options(args.option))
    replayed = [d for d in found if d.replayed]
    departed = [d for d in replayed if d.turn is not None]
    by_turn: dict[int, list[tuple[str, str]]] = collections.defaultdict(list)  # (oracle's, model's) kinds
    for d in departed:
        assert d.turn is not None
        by_turn[d.turn].append((action_kind(d.expected), action_kind(d.actual)))
    table = Table(
        title=f"{args.trace}: first departure from the oracle ({len(departed)} of {len(replayed)} episodes)"
    )
    table.add_column("turn", justify="right")
    table.add_column("episodes", justify="right")
    table.add_column("oracle -> model (most common)")
    for turn in sorted(by_turn):
        common = collections.Counter(by_turn[turn]).most_common(3)
        table.add_row(
            str(turn), str(len(by_turn[turn])), ", ".join(f"{e} -> {a} ({n})" for (e, a), n in common)
        )
    console = Console()
    console.print(table)
    turns_of: collections.Counter[str] = collections.Counter()
    departed_of: collections.Counter[str] = collections.Counter()
    for d in replayed:
        for kind, off in d.steps:
            turns_of[kind] += 1
            departed_of[kind] += off
    every = Table(title="every replayed turn, by the oracle's turn kind")
    every.add_column("oracle's turn")
    every.add_column("model departed", justify="right")
    for kind in sorted(turns_of):
        every.add_row(
            kind, f"{departed_of[kind]} / {turns_of[kind]} ({departed_of[kind] / turns_of[kind]:.0%})"
        )
    console.print(every)
    if len(replayed) < len(found):
        console.print(
            f"{len(found) - len(replayed)} episodes answered otherwise than traced (other env options? "
            "pass them with -o) and were left out"
        )
    for d in departed[: args.examples]:
        console.print(f"\n[bold]{d.episode_id}[/] turn {d.turn} (solved: {d.success})", highlight=False)
        console.print(f"  oracle: {_short(d.expected)}", markup=False, highlight=False)
        console.print(f"  model:  {_short(d.actual)}", markup=False, highlight=False)
    record: dict[str, float | int] = {
        "episodes": len(found),
        "replayed": len(replayed),
        "departed": len(departed),
        "departed_solved": sum(d.success for d in departed),
        "departure_turn_mean": round(sum(d.turn or 0 for d in departed) / max(len(departed), 1), 3),
    }
    for turn in sorted(by_turn):
        record[f"turn_{turn}"] = len(by_turn[turn])
    for kind in sorted(turns_of):
        record[f"{kind}_turns"], record[f"{kind}_departed"] = turns_of[kind], departed_of[kind]
    for side, index in (("expected", 0), ("actual", 1)):
        kinds = collections.Counter(pair[index] for pairs in by_turn.values() for pair in pairs)
        record.update({f"{side}_{kind}": n for kind, n in sorted(kinds.items())})
    if args.json:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
