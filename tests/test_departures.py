"""First departures: a trace replayed in its env, the oracle asked at every state the policy reached."""

from __future__ import annotations

from dataclasses import replace

from scripted_engine import ScriptedEngine
from test_rollout_support import oracle_responder, oracles, tiny_format, turn_of

from srt_agent.contracts.generation import GenerationRequest
from srt_agent.evaluation.departures import action_kind, first_departures
from srt_agent.rollout import EpisodeRequest, RolloutConfig, RolloutScheduler, rollout_sync
from srt_agent.rollout.trace import trace_turns

RETAIL = "srt/Retail-v0"
WRONG = "Which items would you like to return?"


def _trace(seeds: range, wrong_turn: dict[int, int]) -> list:
    """Oracle-played Retail episodes as a trace, seed ``s`` saying WRONG at turn ``wrong_turn[s]``."""
    fmt = tiny_format()
    by_task = oracles(RETAIL, seeds)
    seed_of = {task: s for task, s in zip(by_task, seeds, strict=True)}
    oracle = oracle_responder(fmt, by_task)

    def respond(req: GenerationRequest) -> str:
        if wrong_turn.get(seed_of[req.task_id]) == turn_of(req):
            return WRONG
        return oracle(req)

    engine = ScriptedEngine(fmt, respond, max_context=1 << 16)
    specs = [EpisodeRequest(RETAIL, seed=s) for s in seeds]
    batch = rollout_sync(RolloutScheduler(engine, fmt, RolloutConfig(max_concurrent=4)), specs)
    return [t for traj in batch.trajectories for t in trace_turns(traj)]


def test_the_oracles_own_episodes_never_depart_and_a_wrong_turn_is_found_where_it_was_said() -> None:
    fmt = tiny_format()
    turns = _trace(range(4), {1: 3, 2: 0})
    found = {d.seed: d for d in first_departures(turns, fmt)}
    assert all(d.replayed for d in found.values())
    assert found[0].turn is None and found[0].success and found[3].turn is None
    assert found[1].turn == 3 and found[1].actual == WRONG and found[1].expected != WRONG
    assert found[2].turn == 0 and action_kind(found[2].expected) == "text"
    assert action_kind(found[1].expected) in {"get_order_details", "text"}
    # The replay goes on after a departure: every traced turn is a step, the oracle asked at each.
    episode_turns = {s: sum(t.seed == s for t in turns) for s in range(4)}
    assert all(len(d.steps) == episode_turns[s] for s, d in found.items())
    assert not any(off for _, off in found[0].steps)
    assert [off for _, off in found[1].steps].index(True) == 3


def test_an_episode_the_env_answers_otherwise_is_not_replayed() -> None:
    fmt = tiny_format()
    turns = _trace(range(1), {})
    moved = [replace(t, seed=(t.seed or 0) + 1) for t in turns]  # another task under the same turns
    [d] = first_departures(moved, fmt)
    assert not d.replayed and d.turn is None


def test_action_kinds() -> None:
    assert action_kind("hello") == "text"
    assert action_kind('<tool_call>{"name": "get_user_details", "arguments": {}}</tool_call>') == (
        "get_user_details"
    )
    assert action_kind("<tool_call>{not json</tool_call>") == "malformed"
