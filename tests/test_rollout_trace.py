"""The srt-trace/1 JSONL export: round trip, token reconstruction, schema checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_engine import ScriptedEngine
from test_rollout_support import SCRIPT_ENV, tiny_format, turn_of

from srt_agent.contracts.generation import state_key
from srt_agent.rollout import (
    TRACE_SCHEMA,
    EpisodeRequest,
    TraceFormatError,
    Trajectory,
    episode_prefix,
    read_trace,
    run_rollouts,
    trace_turns,
    write_trace,
)
from srt_agent.tooling.parser import format_tool_call


@pytest.fixture(scope="module")
def trajectories() -> list[Trajectory]:
    turns = [format_tool_call("nap", {"seconds": 0.0}), "one", "DONE"]
    engine = ScriptedEngine(tiny_format(), lambda req: turns[min(turn_of(req), 2)])
    specs = [
        EpisodeRequest(SCRIPT_ENV, seed=0),
        EpisodeRequest(SCRIPT_ENV, seed=1, env_options={"max_turns": 2}),  # truncated after 2 turns
        EpisodeRequest(SCRIPT_ENV, seed=2, env_options={"fail_in": "reset"}),  # no turns, no lines
    ]
    return run_rollouts(engine, tiny_format(), specs)


def test_trace_round_trips_and_has_one_line_per_turn(tmp_path: Path, trajectories: list[Trajectory]) -> None:
    path = tmp_path / "sub" / "trace.jsonl"
    assert write_trace(path, trajectories) == 3 + 2 + 0
    lines = path.read_text().splitlines()
    assert all(json.loads(line)["schema"] == TRACE_SCHEMA for line in lines)
    loaded = read_trace(path)
    assert loaded == [t for traj in trajectories for t in trace_turns(traj)]
    first = loaded[0]
    ok = trajectories[0]
    assert (first.episode_id, first.env_id, first.task_id, first.seed, first.trial) == (
        ok.episode_id, ok.env_id, ok.task_id, 0, 0,
    )  # fmt: skip
    assert [t.reward for t in loaded[:3]] == [0.5, 0.25, 1.0] and [t.last for t in loaded[:3]] == [
        False,
        False,
        True,
    ]
    assert {t.episode_status for t in loaded[3:]} == {"truncated"} and not loaded[3].episode_success
    # append=True adds lines instead of replacing the file.
    assert write_trace(path, trajectories[:1], append=True) == 3 and len(read_trace(path)) == 8


def test_trace_lines_rebuild_the_exact_tokens_and_state_keys(trajectories: list[Trajectory]) -> None:
    for traj in trajectories[:2]:
        turns = trace_turns(traj)
        rebuilt = episode_prefix(turns)
        assert rebuilt == traj.token_ids[: traj.turns[-1].end]
        for t in turns:
            prefix = rebuilt[: t.prefix_len]
            assert t.state_key == state_key(prefix)
            assert rebuilt[t.prefix_len : t.prefix_len + len(t.token_ids)] == t.token_ids
            s, e = traj.turns[t.turn].start, traj.turns[t.turn].end
            assert t.logprobs == traj.logprobs[s:e] and all(lp < 0 for lp in t.logprobs)
        assert turns[0].new_prompt_ids == traj.token_ids[: traj.prompt_len]
    with pytest.raises(ValueError, match="expected turn 0"):
        episode_prefix(trace_turns(trajectories[0])[1:])


def test_reader_rejects_other_schemas_and_ignores_unknown_keys(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    record = json.loads(trace_turns(trajectories[0])[0].to_json())
    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps({**record, "added_in_a_later_minor": 1}) + "\n\n")
    assert read_trace(newer) == trace_turns(trajectories[0])[:1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(record) + "\n" + json.dumps({**record, "schema": "srt-trace/2"}) + "\n")
    with pytest.raises(TraceFormatError, match=r"bad.jsonl:2: schema is 'srt-trace/2'"):
        read_trace(bad)
    missing = {k: v for k, v in record.items() if k != "state_key"}
    bad.write_text(json.dumps(missing) + "\n")
    with pytest.raises(TraceFormatError, match=r"missing keys \['state_key'\]"):
        read_trace(bad)
    bad.write_text("{not json\n")
    with pytest.raises(TraceFormatError, match="not JSON"):
        read_trace(bad)
