"""run_eval and eval_command end to end, with scripted engines (oracles, custom envs, failures)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from scripted_engine import Response, ScriptedEngine
from test_rollout_support import episode_of, oracle_responder, oracles, tiny_format

from srt_agent.contracts.generation import GenerationOutput, GenerationRequest
from srt_agent.env.registration import UnknownEnvError, register_env
from srt_agent.env.testing import GenericTestEnv
from srt_agent.evaluation import EvalReport, ModelLoadError, eval_command, run_eval
from srt_agent.rollout import read_trace

register_env("test-eval/Generic-v0", GenericTestEnv, answer="42", max_turns=2)


@pytest.mark.parametrize("env_id", ["srt/Calculator-v0", "srt/GuessNumber-v0", "srt/Retail-v0"])
def test_oracle_driven_engine_solves_every_built_in_env(env_id: str) -> None:
    # The engine reads the conversation back from the prompt tokens and lets the task's oracle
    # answer: every episode goes through the real env, tools and chat format, token in/token out.
    fmt = tiny_format()
    engine = ScriptedEngine(fmt, oracle_responder(fmt, oracles(env_id, range(3))), max_context=1 << 16)
    r = run_eval(env_id, engine, fmt=fmt, episodes=3, k=2, max_new_tokens=4096, seed=1)
    assert (r.episodes, r.tasks, r.ok, r.failed, r.truncated) == (6, 3, 6, 0, 0), r.reasons
    assert r.success_rate == 1.0 and r.pass_hat == (1.0, 1.0) and r.model == "ScriptedEngine"
    assert r.mean_turns >= 2 and r.tokens_generated > 0 and r.tokens_per_s > 0
    if env_id != "srt/GuessNumber-v0":
        assert r.tool_calls > 0
    assert not engine.closed  # an engine passed in stays open for the caller


def test_an_eval_can_start_each_task_part_way_through_its_oracles_solution() -> None:
    fmt = tiny_format()

    def run(prefix: float | None) -> EvalReport:
        engine = ScriptedEngine(
            fmt, oracle_responder(fmt, oracles("srt/Retail-v0", range(4))), max_context=1 << 16
        )
        return run_eval(
            "srt/Retail-v0", engine, fmt=fmt, episodes=4, max_new_tokens=4096, oracle_prefix=prefix
        )

    whole, late = run(None), run(0.7)
    assert whole.success_rate == late.success_rate == 1.0  # the oracle finishes what it started
    assert whole.oracle_prefix is None and late.oracle_prefix == 0.7 and late.flat()["oracle_prefix"] == 0.7
    played = [t.final_info["oracle_turns"] for t in late.trajectories]
    assert all(p >= 1 for p in played)
    assert late.mean_turns == pytest.approx(whole.mean_turns - sum(played) / 4)  # the policy's turns only
    assert late.assistant_turns == sum(t.num_turns for t in late.trajectories)  # garbled-turn base too
    with pytest.raises(ValueError, match="has no oracle"):
        run_eval("test-eval/Generic-v0", ScriptedEngine(fmt, custom_responder), fmt=fmt, oracle_prefix=0.5)


def custom_responder(req: GenerationRequest) -> Response:
    # Episode ids are "<env>/<seed>/<trial>": seed 1 fails its 2nd trial, seed 2 its 1st.
    seed, trial = (int(x) for x in episode_of(req).rsplit("/", 2)[1:])
    return "no idea" if (seed, trial) in {(1, 1), (2, 0)} else "It is 42."


def test_custom_registered_env_gets_success_rate_and_pass_k() -> None:
    fmt = tiny_format()
    r = run_eval("test-eval/Generic-v0", ScriptedEngine(fmt, custom_responder), fmt=fmt, episodes=4, k=2)
    assert r.success_rate == 0.75 and r.pass_hat == (0.75, 0.5)
    assert r.truncated == 2 and r.reasons == {"env truncated": 2} and r.first_env_seed == 0
    assert [t.seed for t in r.trajectories] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_same_seed_same_requests_and_bad_arguments_fail_fast() -> None:
    fmt = tiny_format()

    def seeds(seed: int) -> list[int]:
        engine = ScriptedEngine(fmt, custom_responder)
        run_eval("test-eval/Generic-v0", engine, fmt=fmt, episodes=2, k=2, seed=seed)
        return sorted((c.request.params.seed or 0) for c in engine.calls)

    assert seeds(3) == seeds(3) != seeds(4)
    engine = ScriptedEngine(fmt, custom_responder)
    with pytest.raises(UnknownEnvError, match="srt/Calculator-v0"):
        run_eval("srt/Calculater-v0", engine, fmt=fmt)
    with pytest.raises(ValueError, match="needs fmt"):
        run_eval("srt/Calculator-v0", engine)
    with pytest.raises(ModelLoadError, match="does not exist"):
        run_eval("srt/Calculator-v0", "/nonexistent/model")
    assert engine.calls == []


def test_eval_command_prints_writes_json_and_trace_and_returns_exit_codes(tmp_path: Path) -> None:
    fmt = tiny_format()

    def respond(req: GenerationRequest) -> Response:
        if episode_of(req).endswith("/3/1"):
            return GenerationOutput(req.request_id, (), (), "abort", error="cancelled")
        return custom_responder(req)

    out = io.StringIO()
    json_path, trace_path = tmp_path / "out" / "eval.json", tmp_path / "trace.jsonl"
    code = eval_command(
        "test-eval/Generic-v0", ScriptedEngine(fmt, respond), fmt=fmt, episodes=4, k=2,
        json_path=json_path, trace_path=trace_path, console=Console(file=out, width=120),
    )  # fmt: skip
    assert code == 1  # an episode failed (engine abort)
    flat = json.loads(json_path.read_text())
    assert flat["failed"] == 1 and flat["episodes"] == 8 and flat["pass_hat_2"] == 0.25
    assert all(not isinstance(v, dict | list) for v in flat.values())
    trace = read_trace(trace_path)
    assert len(trace) == 5 * 1 + 2 * 2  # 5 solved in one turn, 2 truncated after two, 1 aborted: none
    assert "success rate" in out.getvalue() and "1 episode(s) failed" in out.getvalue()

    out = io.StringIO()
    bad = eval_command("srt/Nope-v0", "/nonexistent", console=Console(file=out, width=200))
    assert bad == 2 and "unknown env id 'srt/Nope-v0'" in out.getvalue()
    ok = eval_command(
        "test-eval/Generic-v0",
        ScriptedEngine(fmt, lambda r: "42"),
        fmt=fmt,
        episodes=1,
        console=Console(file=out),
    )
    assert ok == 0
