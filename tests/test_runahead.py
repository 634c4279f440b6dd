"""Run-ahead: announced prompts and known tool results feed the tree cache, never the trajectories."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from chat_fixtures import save_tiny_llama
from scripted_engine import ScriptedEngine
from test_rollout_support import tiny_format, turn_of

from srt_agent.chat.messages import tool_result, user
from srt_agent.contracts.generation import GenerationRequest, state_key
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.rollout import (
    EpisodeRequest,
    RolloutConfig,
    RolloutScheduler,
    RunAheadConfig,
    ToolMemo,
    rollout_sync,
)
from srt_agent.tooling.parser import format_tool_call, parse_tool_calls
from srt_agent.tree_cache import TreeCache

CALC = "srt/Calculator-v0"
GUESS = "srt/GuessNumber-v0"
CALL = format_tool_call("calculator", {"expression": "2 + 3"})


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def _calculator_engine() -> ScriptedEngine:
    """Live turns: the same calculator call, then an answer; run-ahead requests get a marker."""

    def respond(req: GenerationRequest) -> str:
        if req.priority == "runahead":
            return "RUNAHEAD MARKER"
        return CALL if turn_of(req) == 0 else "<answer>5</answer>"

    return ScriptedEngine(tiny_format(), respond)


def test_tool_memo_predicts_only_fully_known_turns() -> None:
    memo = ToolMemo()
    calls = parse_tool_calls(
        CALL + format_tool_call("calculator", {"expression": "1"}), id_prefix="t1_"
    ).calls
    obs = [
        tool_result("5", call_id="t1_call_0", name="calculator"),
        tool_result("1", call_id="t1_call_1", name="calculator"),
    ]
    assert not memo.record(CALC, "task", calls, obs[:1])  # one message for two calls: not paired
    assert memo.record(CALC, "task", calls, obs) and len(memo) == 2
    # The same calls with the arguments' keys reordered, in a later turn: ids follow the new turn.
    again = parse_tool_calls(
        '<tool_call>{"arguments": {"expression": "2 + 3"}, "name": "calculator"}</tool_call>', id_prefix="t4_"
    ).calls
    predicted = memo.predict(CALC, "task", again)
    assert predicted == [tool_result("5", call_id="t4_call_0", name="calculator")]
    assert memo.predict(CALC, "other-task", again) is None  # results are per task
    assert (
        memo.predict(
            CALC, "task", parse_tool_calls(format_tool_call("calculator", {"expression": "9"})).calls
        )
        is None
    )
    assert not memo.record(CALC, "task", calls, [user("hi"), obs[1]])  # not tool messages


def test_known_tool_result_runs_ahead_of_the_exact_post_tool_state() -> None:
    fmt = tiny_format()
    specs = [EpisodeRequest(CALC, seed=0, trial=j) for j in range(2)]
    config = RolloutConfig(max_concurrent=1)  # trial 0 (whose call fills the memo) ends before trial 1
    engine = _calculator_engine()
    scheduler = RolloutScheduler(engine, fmt, config, runahead=RunAheadConfig(enabled=True))
    batch = rollout_sync(scheduler, specs)
    ahead = [c.request for c in engine.calls if c.request.priority == "runahead"]
    live = {c.request.request_id: c.request for c in engine.calls if c.request.priority == "live"}
    # Trial 1 repeated trial 0's call, so the post-tool state was rendered and generated ahead,
    # under exactly the state key (and tokens) the live request of trial 1's next turn carried.
    [run] = ahead
    nxt = live[f"{CALC}/0/1#1"]
    assert run.state_key == nxt.state_key == state_key(nxt.prompt_ids) and run.prompt_ids == nxt.prompt_ids
    assert run.task_id == nxt.task_id and run.params.seed != nxt.params.seed
    stats = batch.metrics.runahead
    assert (stats.predicted, stats.prediction_checks, stats.prediction_hits, stats.started) == (1, 1, 1, 1)
    # The run-ahead output is nowhere in the trajectories: they equal a run without run-ahead.
    marker = fmt.encode("RUNAHEAD MARKER")
    for t in batch.trajectories:
        assert t.status == "ok" and "RUNAHEAD" not in fmt.decode(t.token_ids)
        assert all(t.token_ids[i : i + len(marker)] != tuple(marker) for i in range(len(t.token_ids)))
    plain = rollout_sync(RolloutScheduler(_calculator_engine(), fmt, config), specs)
    assert [t.token_ids for t in plain.trajectories] == [t.token_ids for t in batch.trajectories]
    assert [t.logprobs for t in plain.trajectories] == [t.logprobs for t in batch.trajectories]


def test_run_ahead_samples_under_the_tool_call_grammar_of_its_live_requests() -> None:
    """With constrained tool calls, announced and predicted run-ahead requests carry the grammar the
    live requests of their episodes decode under (else their drafts are samples of another policy)."""
    fmt = tiny_format()
    specs = [EpisodeRequest(CALC, seed=0, trial=j) for j in range(2)]
    for constrained in (True, False):
        config = RolloutConfig(max_concurrent=1, constrain_tool_calls=constrained)
        engine = _calculator_engine()
        scheduler = RolloutScheduler(engine, fmt, config, runahead=RunAheadConfig(enabled=True))
        assert scheduler.announce(specs[:1]) == 1
        rollout_sync(scheduler, specs)
        ahead = [c.request for c in engine.calls if c.request.priority == "runahead"]
        live = [c.request for c in engine.calls if c.request.priority == "live"]
        assert len(ahead) == 2  # the announced first turn and the predicted post-tool state
        if constrained:
            assert live[0].tool_grammar is not None
            assert all(r.tool_grammar is live[0].tool_grammar for r in ahead + live)
        else:
            assert all(r.tool_grammar is None for r in ahead + live)


def test_the_live_request_of_the_state_cancels_a_run_ahead_still_running() -> None:
    fmt = tiny_format()
    specs = [EpisodeRequest(CALC, seed=0, trial=j) for j in range(2)]

    def respond(req: GenerationRequest) -> str:
        if req.priority == "runahead":
            return "RUNAHEAD MARKER"
        return CALL if turn_of(req) == 0 else "<answer>5</answer>"

    # The run-ahead takes 10 s, the instant tool returns first: the live request cancels it.
    engine = ScriptedEngine(fmt, respond, delay_s=lambda req: 10.0 if req.priority == "runahead" else 0.0)
    scheduler = RolloutScheduler(
        engine, fmt, RolloutConfig(max_concurrent=1), runahead=RunAheadConfig(enabled=True)
    )
    batch = rollout_sync(scheduler, specs)
    stats = batch.metrics.runahead
    assert (stats.predicted, stats.prediction_hits, stats.started, stats.cancelled) == (1, 1, 1, 1)
    assert stats.completed == 0 and batch.metrics.wall_s < 5


def test_announced_prompts_give_the_later_live_request_exact_run_ahead_drafts(model_dir: Path) -> None:
    fmt = tiny_format()
    cache = TreeCache()
    config = RolloutConfig(max_concurrent=4, temperature=0.0, max_new_tokens=12)
    announced = [EpisodeRequest(GUESS, seed=s, env_options={"max_turns": 1}) for s in (5, 6)]
    with TorchEngine(
        model_dir, max_batch_size=4, draft_source=cache, spec=SpecConfig(adaptive=False, runahead_slowdown=10)
    ) as engine:
        scheduler = RolloutScheduler(engine, fmt, config, runahead=RunAheadConfig(enabled=True))
        assert scheduler.announce(announced) == 2
        # The batch before the announced one: one episode of three turns, while rows are free.
        first = rollout_sync(scheduler, [EpisodeRequest(GUESS, seed=0, env_options={"max_turns": 3})])
        assert first.metrics.runahead.started == first.metrics.runahead.completed == 2
        assert first.metrics.spec.runahead_tokens > 0 and first.metrics.runahead.tokens > 0
        later = rollout_sync(scheduler, announced)
    # The run-ahead was filed under the state key the live first turns then carried...
    keys = {t.turns[0].state_key for t in later.trajectories}
    assert keys <= set(cache.state_keys())
    # ...so those turns drafted from the exact state, with tokens only run-ahead content had.
    spec = later.metrics.spec
    assert spec.drafts_by_source.get("exact", 0) > 0 and spec.runahead_nodes_accepted > 0
    assert later.metrics.runahead_accepted_share > 0


def test_live_requests_preempt_run_ahead_and_trajectories_are_unchanged(model_dir: Path) -> None:
    fmt = tiny_format()
    config = RolloutConfig(max_concurrent=2, temperature=1.0, max_new_tokens=32, seed=7)
    live = [EpisodeRequest(GUESS, seed=s, env_options={"max_turns": 4}) for s in (0, 1)]
    # Run-ahead is told the engine has 6 rows, but it has 2: live requests must take rows back.
    # 24 jobs keep it busy for the whole batch, so every live turn finds run-ahead rows.
    ahead = RunAheadConfig(enabled=True, capacity=6, max_in_flight=4, announce_samples=4)
    with TorchEngine(model_dir, max_batch_size=2, draft_source=TreeCache()) as engine:
        scheduler = RolloutScheduler(engine, fmt, config, runahead=ahead)
        scheduler.announce([EpisodeRequest(GUESS, seed=s) for s in range(10, 16)])
        batch = rollout_sync(scheduler, live)
    with TorchEngine(model_dir, max_batch_size=2) as engine:
        plain = rollout_sync(RolloutScheduler(engine, fmt, config), live)
    assert batch.metrics.spec.preempted >= 1 and batch.metrics.runahead.preempted >= 1
    assert [t.token_ids for t in batch.trajectories] == [t.token_ids for t in plain.trajectories]
    assert all(t.status != "failed" for t in batch.trajectories)


def test_no_runahead_without_config_and_announce_is_a_no_op() -> None:
    scheduler = RolloutScheduler(_calculator_engine(), tiny_format())
    assert scheduler.runahead is None and scheduler.announce([EpisodeRequest(CALC, seed=0)]) == 0
    batch = rollout_sync(scheduler, [EpisodeRequest(CALC, seed=0, trial=j) for j in range(2)])
    assert batch.metrics.runahead.started == 0 and batch.metrics.episodes == 2


def test_auto_runs_ahead_on_a_gpu_engine_or_a_server_and_not_on_a_cpu_engine() -> None:
    # Measured on 2 cores: the rows run-ahead fills make every batched forward dearer there.
    auto = RunAheadConfig()
    assert auto.enabled == "auto"
    assert not auto.runs_on_device("cpu") and not auto.runs_on_device(torch.device("cpu"))
    assert auto.runs_on_device("cuda:0") and auto.runs_on_device(None)
    assert RunAheadConfig(enabled=True).runs_on_device("cpu")
    assert not RunAheadConfig(enabled=False).runs_on_device("cuda")
    from srt_agent.config.sections import SpecSection

    assert SpecSection.model_validate({"run_ahead": "auto"}).run_ahead == auto
