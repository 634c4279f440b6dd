"""The rollout scheduler: token-in/token-out exactness, reward crediting, limits, seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scripted_engine import ScriptedEngine, position_logprob
from test_rollout_support import SCRIPT_ENV, episode_of, tiny_format, turn_of

from srt_agent.chat.messages import user
from srt_agent.contracts.generation import GenerationRequest, state_key
from srt_agent.env.registration import make
from srt_agent.rollout import (
    EpisodeRequest,
    RolloutConfig,
    Trajectory,
    json_safe,
    run_rollouts,
    sampling_seed,
)
from srt_agent.tooling.parser import format_tool_call

NAP = format_tool_call("nap", {"seconds": 0.0})
UNKNOWN = format_tool_call("nosuch", {})


def scripted(turns: list[str]) -> ScriptedEngine:
    """An engine that plays ``turns`` in order in every episode (the last one repeats)."""
    return ScriptedEngine(tiny_format(), lambda req: turns[min(turn_of(req), len(turns) - 1)])


def test_tokens_are_prompt_plus_verbatim_generations_with_logprobs_and_mask() -> None:
    fmt = tiny_format()
    # The last turn uses an unusual but valid split of "hello DONE" (one byte-level token per letter
    # of "hello"): re-tokenizing the text would give other ids, so equality proves they were kept.
    vocab = fmt.tokenizer.get_vocab()
    odd = [vocab[c] for c in "hello"] + fmt.encode(" DONE")
    assert fmt.decode(odd) == "hello DONE" and odd != fmt.encode("hello DONE")
    odd_done = [*odd, fmt.stop_token_ids[0]]
    sent: dict[str, list[int]] = {}

    def respond(req: GenerationRequest) -> list[int]:
        text = NAP if turn_of(req) == 0 else "one two"
        ids = odd_done if turn_of(req) == 2 else [*fmt.encode(text), fmt.stop_token_ids[0]]
        sent[req.request_id] = ids
        return ids

    engine = ScriptedEngine(fmt, respond)
    [traj] = run_rollouts(engine, fmt, [EpisodeRequest(SCRIPT_ENV, seed=3)])
    assert traj.status == "ok" and traj.num_turns == 3
    requests = {c.request.request_id: c.request for c in engine.calls}
    for turn in traj.turns:
        req = requests[f"{SCRIPT_ENV}/3/0#{turn.index}"]
        # Token in: the engine saw exactly the trajectory's prefix; token out: kept verbatim.
        assert req.prompt_ids == traj.token_ids[: turn.start] and turn.prefix_len == turn.start
        assert list(traj.token_ids[turn.start : turn.end]) == sent[req.request_id]
        assert turn.state_key == req.state_key == state_key(traj.token_ids[: turn.start])
    spans = {i for s, e in traj.turn_spans for i in range(s, e)}
    assert [i for i, m in enumerate(traj.loss_mask) if m] == sorted(spans)
    assert traj.generated_tokens == sum(traj.loss_mask) == sum(len(v) for v in sent.values())
    for i, (lp, m) in enumerate(zip(traj.logprobs, traj.loss_mask, strict=True)):
        assert lp == (position_logprob(i) if m else 0.0)
    # The first prompt is the chat format's rendering of the env's opening, tools included.
    env = make(SCRIPT_ENV)
    opening, info = env.reset(seed=3)
    assert traj.token_ids[: traj.prompt_len] == fmt.start(opening, info["tools"]).token_ids
    roles = ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "user"]
    assert [m.role for m in traj.messages] == roles
    assert traj.messages[-1].content == "Well done." and traj.messages[-2].content == "hello DONE"


def test_each_step_reward_is_credited_to_the_turn_that_caused_it() -> None:
    engine = scripted([NAP, UNKNOWN, "one", "DONE"])
    [traj] = run_rollouts(engine, tiny_format(), [EpisodeRequest(SCRIPT_ENV, seed=0)])
    assert traj.turn_rewards == (0.5, 0.5, 0.25, 1.0) and traj.total_reward == 2.25
    assert traj.success and traj.terminated and not traj.truncated and traj.reason == ""
    assert traj.tool_calls == 2 and traj.tool_errors == 1  # the unknown tool is a tool error
    assert traj.final_info == {"task_id": traj.task_id, "turn": 4, "tool_calls": 0, "tool_errors": [], "n": 1}
    assert all(t.finish_reason == "stop" and t.forward_passes == t.end - t.start for t in traj.turns)
    assert traj.forward_passes == traj.generated_tokens
    assert traj.generation_s > 0 and traj.env_s > 0 and traj.wall_s >= traj.env_s


def test_env_turn_limit_and_rollout_turn_cap_truncate_with_reasons() -> None:
    fmt = tiny_format()
    specs = [
        EpisodeRequest(SCRIPT_ENV, seed=0, env_options={"max_turns": 2}),
        EpisodeRequest(SCRIPT_ENV, seed=1),
    ]
    by_env, by_cap = run_rollouts(scripted(["one"]), fmt, specs, max_turns=3)
    assert by_env.status == "truncated" and by_env.truncated and not by_env.terminated
    assert by_env.reason == "env truncated: max_turns=2 reached" and by_env.num_turns == 2
    assert by_env.turn_rewards == (0.25, 0.25) and not by_env.success
    assert by_cap.status == "truncated" and by_cap.reason.startswith("max_turns: 3") and by_cap.num_turns == 3
    # The transcript ends with the observation and the next generation prompt (mask 0).
    assert by_cap.loss_mask[-1] == 0 and by_cap.messages[-1].content == "Go on."


def test_context_limit_truncates_and_clamps_max_new_tokens() -> None:
    fmt = tiny_format()
    prompt_len = len(run_rollouts(scripted(["DONE"]), fmt, [EpisodeRequest(SCRIPT_ENV, seed=0)])[0].token_ids)
    # Room for the first turn's answer but not for a second turn after the observation.
    engine = ScriptedEngine(fmt, lambda req: "one two one two", max_context=prompt_len + 12)
    config = RolloutConfig(max_new_tokens=100, min_room_tokens=8)
    [traj] = run_rollouts(engine, fmt, [EpisodeRequest(SCRIPT_ENV, seed=0)], config)
    assert traj.status == "truncated" and traj.truncated and traj.num_turns == 1
    assert traj.reason.startswith(f"context limit: {prompt_len + 12} tokens")
    assert traj.reason.endswith("a turn needs 8 more)")  # min(min_room_tokens, max_new_tokens)
    [call] = engine.calls
    assert call.request.params.max_new_tokens == engine.max_context - len(call.request.prompt_ids) < 100
    # The only request fits the context (the turn after it was never sent).
    assert len(call.request.prompt_ids) + call.request.params.max_new_tokens <= engine.max_context


def test_sampling_seeds_are_derived_from_base_episode_and_turn_whatever_the_concurrency() -> None:
    specs = [EpisodeRequest(SCRIPT_ENV, seed=s, trial=j) for s in range(3) for j in range(2)]

    def seeds(**overrides: object) -> dict[str, int | None]:
        engine = scripted([NAP, "DONE"])
        run_rollouts(engine, tiny_format(), specs, **overrides)  # type: ignore[arg-type]
        return {c.request.request_id: c.request.params.seed for c in engine.calls}

    one, many = seeds(max_concurrent=1, seed=7), seeds(max_concurrent=6, seed=7)
    assert one == many and len(one) == 12
    for rid, value in one.items():
        ep, turn = rid.rsplit("#", 1)
        assert value == sampling_seed(7, ep, int(turn))
    assert len(set(one.values())) == 12  # trials of a task and turns of an episode all differ
    assert seeds(seed=8) != one and set(seeds(seed=None).values()) == {None}


def test_requests_carry_task_id_stop_tokens_and_sampling_options() -> None:
    fmt = tiny_format()
    engine = scripted(["DONE"])
    config = RolloutConfig(temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=64)
    [traj] = run_rollouts(engine, fmt, [EpisodeRequest(SCRIPT_ENV, seed=2, episode_id="ep-a")], config)
    [call] = engine.calls
    req = call.request
    assert req.task_id == traj.task_id and req.request_id == "ep-a#0" and episode_of(req) == "ep-a"
    p = req.params
    assert (p.temperature, p.top_p, p.top_k, p.max_new_tokens) == (0.7, 0.9, 5, 64)
    assert p.stop_token_ids == fmt.stop_token_ids


def test_duplicate_episode_ids_are_rejected_and_trajectories_validate() -> None:
    with pytest.raises(ValueError, match="duplicate episode_id"):
        run_rollouts(scripted(["DONE"]), tiny_format(), [EpisodeRequest(SCRIPT_ENV, seed=0)] * 2)
    with pytest.raises(ValueError, match="same length"):
        Trajectory(
            episode_id="x", env_id="e", task_id="t", seed=0, trial=0, token_ids=(1, 2), loss_mask=(0,),
            logprobs=(0.0, 0.0), turns=(), total_reward=0.0, success=False, terminated=False,
            truncated=False, status="ok", reason="", tool_calls=0, tool_errors=0, messages=(),
        )  # fmt: skip


def test_final_info_is_made_json_safe() -> None:
    info = {"n": np.int64(3), "x": np.float32(0.5), "t": (1, {2: "a"}), "m": user("hi"), "nan": float("nan")}
    safe = json_safe(info)
    assert safe == {"n": 3, "x": 0.5, "t": [1, {"2": "a"}], "m": {"role": "user", "content": "hi",
                    "tool_call_id": None, "name": None}, "nan": "nan"}  # fmt: skip
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe
    assert isinstance(safe["n"], int) and json_safe({"o": object()})["o"].startswith("<object")
