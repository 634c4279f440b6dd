"""Per-batch rollout metrics: the time split, speculation figures, flat JSON, and eval's --spec."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_fixtures import save_tiny_llama
from scripted_engine import ScriptedEngine
from test_rollout_support import SCRIPT_ENV, tiny_format, turn_of

from srt_agent.config.sections import SpecSection
from srt_agent.contracts.generation import GenerationRequest
from srt_agent.contracts.speculation import SpecStats, spec_delta
from srt_agent.evaluation import run_eval
from srt_agent.rollout import EpisodeRequest, RolloutConfig, RolloutScheduler, rollout_sync, run_rollouts
from srt_agent.rollout.metrics import Timeline
from srt_agent.tooling.parser import format_tool_call

NAP_S = 0.5
"""Long against a cold first tool call (0.3 s seen on a clean clone), short against three in a row."""


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def test_time_split_adds_up_to_the_wall_clock_and_sees_tool_waits() -> None:
    def respond(req: GenerationRequest) -> str:
        return format_tool_call("nap", {"seconds": NAP_S}) if turn_of(req) == 0 else "DONE"

    engine = ScriptedEngine(tiny_format(), respond, delay_s=0.05)
    specs = [EpisodeRequest(SCRIPT_ENV, seed=s) for s in range(3)]
    batch = rollout_sync(RolloutScheduler(engine, tiny_format(), RolloutConfig()), specs)
    m = batch.metrics
    assert m.generation_s + m.tool_wait_s + m.idle_s == pytest.approx(m.wall_s, rel=0.05)
    # All three nap at once for NAP_S while nothing generates (in a row they would take 3 x NAP_S);
    # each turn generates for 0.05 s.
    assert NAP_S * 0.9 < m.tool_wait_s < NAP_S * 2 and 0.09 < m.generation_s < 0.5
    assert (m.episodes, m.turns) == (3, 6) and m.live_tokens == sum(
        t.generated_tokens for t in batch.trajectories
    )
    assert m.tokens_per_forward == 1.0 and m.spec == SpecStats()  # a scripted engine has no counters
    flat = m.flat()
    assert all(isinstance(v, int | float) and not isinstance(v, bool) for v in flat.values())
    keys = {
        "tokens_per_forward", "acceptance_rate", "mean_accepted", "hit_rate_exact", "hit_rate_task",
        "hit_rate_global", "runahead_accepted_share", "runahead_tokens", "runahead_started",
        "runahead_preempted", "generation_s", "tool_wait_s", "idle_s", "draft_s", "verify_s",
    }  # fmt: skip
    assert keys <= set(flat)
    # The old entry point still returns a plain list of trajectories.
    again = run_rollouts(ScriptedEngine(tiny_format(), respond), tiny_format(), specs)
    assert [t.token_ids for t in again] == [t.token_ids for t in batch.trajectories]


def test_timeline_phases() -> None:
    line = Timeline()
    line.enter("env")
    line.enter("live")  # generation wins over a tool wait
    line.leave("live")
    line.leave("env")
    split = line.split()
    assert set(split) == {"generation", "tool_wait", "idle"} and all(v >= 0 for v in split.values())
    assert line.live == 0


def test_spec_delta_subtracts_every_counter() -> None:
    before = SpecStats(tokens=5, nodes_drafted=4, acceptance_histogram=(2, 1), drafts_by_source={"exact": 3})
    after = SpecStats(
        tokens=12, runahead_tokens=2, nodes_drafted=10, nodes_accepted=3,
        acceptance_histogram=(3, 1, 1), drafts_by_source={"exact": 4, "task": 2}, draft_s=0.5,
    )  # fmt: skip
    d = spec_delta(after, before)
    assert (d.tokens, d.runahead_tokens, d.nodes_drafted, d.nodes_accepted) == (7, 2, 6, 3)
    assert d.acceptance_histogram == (1, 0, 1) and d.drafts_by_source == {"exact": 1, "task": 2}
    assert d.draft_s == 0.5


def test_eval_reports_speculation_figures_with_spec_on_and_off(model_dir: Path) -> None:
    kwargs = {"episodes": 2, "k": 3, "max_new_tokens": 12, "seed": 1, "env_options": {"max_turns": 3}}
    on = run_eval("srt/GuessNumber-v0", model_dir, speculate=True, max_concurrent=6, **kwargs)  # type: ignore[arg-type]
    off = run_eval("srt/GuessNumber-v0", model_dir, speculate=False, max_concurrent=6, **kwargs)  # type: ignore[arg-type]
    # Exact verification with per-request seeds: the same tokens whether the engine speculates or not.
    assert [t.token_ids for t in on.trajectories] == [t.token_ids for t in off.trajectories]
    f_on, f_off = on.flat(), off.flat()
    assert f_on["spec"] is True and f_off["spec"] is False
    assert f_off["acceptance_rate"] == 0 and f_off["tokens_per_forward"] == 1.0
    assert f_off["verify_forwards"] == 0
    assert {f"draft_hit_rate_{s}" for s in ("exact", "task", "global")} <= set(f_on)
    rows = [str(c) for c in on.table().columns[0].cells]
    assert "draft acceptance" in rows and "draft hits" in rows
    # Greedy, one episode at a time: each repeat of a task replays the earlier one's turns, so the
    # tree cache drafts them from the exact state and the drafts are accepted (fewer forwards).
    # Drafts of a fixed size: the adaptive cost model sizes them by measured forward times, so on a
    # loaded machine it may draft nothing (a clean-clone CI run read 1.02 tokens per forward).
    greedy = {**kwargs, "temperature": 0.0, "max_concurrent": 1}
    fixed = SpecSection(adaptive=False, run_ahead=False)
    g_on = run_eval("srt/GuessNumber-v0", model_dir, speculate=True, spec_options=fixed, **greedy).flat()  # type: ignore[arg-type]
    g_off = run_eval("srt/GuessNumber-v0", model_dir, speculate=False, **greedy)  # type: ignore[arg-type]
    assert g_on["tokens_per_forward"] > 2 and g_on["acceptance_rate"] > 0.5  # type: ignore[operator]
    assert g_on["draft_hit_rate_exact"] > 0 and g_on["verify_forwards"] > 0  # type: ignore[operator]
    assert g_off.flat()["tokens_per_forward"] == 1.0
