"""reasoning-gym datasets through ``reasoning_gym:<dataset>`` (``pytest -m reasoning_gym``).

Real datasets of the pinned release: Gymnasium's and srt-agent's env checks, the dataset's own
answers scored 1 through ``srt-agent eval`` (an oracle-driven engine), a real TorchEngine playing
them, the calculator tool, and a ``score_answer`` that misbehaves failing its episode only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.reasoning_gym
reasoning_gym = pytest.importorskip("reasoning_gym")

from scripted_engine import ScriptedEngine  # noqa: E402
from test_rollout_support import oracle_responder, oracles, tiny_format  # noqa: E402
from train_fixtures import save_tiny_policy  # noqa: E402

from srt_agent.env.registration import UnknownEnvError, make, validate_env_options  # noqa: E402
from srt_agent.env.testing import check_multiturn_env  # noqa: E402
from srt_agent.evaluation import run_eval  # noqa: E402
from srt_agent.integrations.ecosystems.foreign import ForeignEnvError  # noqa: E402

DATASETS = ["basic_arithmetic", "chain_sum", "leg_counting", "spell_backward"]


@pytest.mark.parametrize("dataset", DATASETS)
def test_datasets_pass_the_env_checks(dataset: str) -> None:
    env = make(f"reasoning_gym:{dataset}")
    check_multiturn_env(env)
    opening, info = env.reset(seed=7)
    assert info["task_id"] == f"reasoning_gym/{dataset}/0/7" and opening[-1].content
    assert env.reset(seed=7)[0] == opening and env.reset(seed=8)[0] != opening
    env.close()


@pytest.mark.parametrize("dataset", DATASETS)
def test_the_datasets_own_answers_solve_every_task_through_eval(dataset: str) -> None:
    env_id = f"reasoning_gym:{dataset}"
    fmt = tiny_format()
    engine = ScriptedEngine(fmt, oracle_responder(fmt, oracles(env_id, range(4))), max_context=1 << 16)
    report = run_eval(env_id, engine, fmt=fmt, episodes=4, max_new_tokens=4096)
    assert (report.ok, report.failed, report.success_rate, report.mean_reward) == (4, 0, 1.0, 1.0), (
        report.reasons
    )


def test_a_wrong_answer_scores_what_the_dataset_says() -> None:
    env = make("reasoning_gym:basic_arithmetic")
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step("<answer>not a number</answer>")
    assert (reward, terminated, info["score"]) == (0.0, True, 0.0) and info["expected"]


def test_the_calculator_tool_makes_a_multi_turn_episode() -> None:
    env = make("reasoning_gym:basic_arithmetic", tool="calculator", max_turns=4)
    opening, info = env.reset(seed=1)
    assert [t["function"]["name"] for t in info["tools"]] == ["calculator"] and "calculator" in opening[
        0
    ].content
    expression = env.unwrapped.entry["metadata"]["expression"]
    msgs, reward, terminated, _, _ = env.step(
        f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'
    )
    assert msgs[0].role == "tool" and not terminated
    msgs, reward, terminated, _, _ = env.step("I am thinking.")
    assert "answer" in msgs[0].content and not terminated  # a reminder, the episode goes on
    _, reward, terminated, _, _ = env.step(f"<answer>{msgs and env.unwrapped.entry['answer']}</answer>")
    assert (reward, terminated) == (1.0, True)


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "chain_sum"])
def test_calculator_demonstrations_for_a_build(dataset: str) -> None:
    from srt_agent.recipe.demos import collect_demos, demo_seeds

    options = {"tool": "calculator", "max_turns": 4}
    seeds = demo_seeds(6, 0)
    tool_users = collect_demos(f"reasoning_gym:{dataset}", 6, options=options)
    answers = collect_demos(
        f"reasoning_gym:{dataset}", 6, seeds=seeds, demonstrator="mental", options=options
    )
    assert len(tool_users) == len(answers) == 6  # every demonstration solved
    env = make(f"reasoning_gym:{dataset}", **options)
    for tool_user, answer, seed in zip(tool_users, answers, seeds, strict=True):
        env.reset(seed=seed)
        expression = env.unwrapped.entry["metadata"]["expression"]
        call, final = (t.action for t in tool_user.turns)
        assert '"name": "calculator"' in call and expression in call  # the whole expression, once
        assert final == answer.turns[0].action == f"<answer>{env.unwrapped.entry['answer']}</answer>"
        assert len(answer.turns) == 1
    # Without the tool, or on an entry with no expression, the oracle answers at once.
    assert all(len(d.turns) == 1 for d in collect_demos(f"reasoning_gym:{dataset}", 3))
    assert all(len(d.turns) == 1 for d in collect_demos("reasoning_gym:leg_counting", 3, options=options))


def test_the_reasoning_gym_preset_builds_from_its_demonstrations(tmp_path: Path) -> None:
    import json
    from dataclasses import replace

    from model_fixtures import TINY

    from srt_agent.recipe.build import BUILD_FILE, build_model, preset_config

    preset = preset_config("reasoning-gym")
    few = tuple(source._replace(episodes=10) for source in preset.demos)  # its sources, fewer episodes
    build_model(tmp_path / "m", config=replace(TINY, demos=few), show_progress=False)
    meta = json.loads((tmp_path / "m" / BUILD_FILE).read_text())
    assert meta["demos"] == {
        "reasoning_gym:basic_arithmetic": 10,
        "reasoning_gym:basic_arithmetic/mental": 10,
    }
    options = dict(preset.demos[0].options or {})
    report = run_eval(
        "reasoning_gym:basic_arithmetic", tmp_path / "m", episodes=2, max_new_tokens=16, env_options=options
    )
    assert report.failed == 0 and report.episodes == 2, report.reasons


def test_a_real_engine_plays_the_datasets(tmp_path: Path) -> None:
    model = save_tiny_policy(tmp_path / "policy")
    for dataset in DATASETS[:3]:
        report = run_eval(f"reasoning_gym:{dataset}", model, episodes=2, max_new_tokens=16, max_concurrent=2)
        assert report.failed == 0 and report.episodes == 2 and report.tokens_generated > 0, report.reasons


def test_a_misbehaving_score_fails_its_episode_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make("reasoning_gym:chain_sum")
    env.reset(seed=0)
    monkeypatch.setattr(type(env.unwrapped.data), "score_answer", lambda self, answer, entry: "yes")
    with pytest.raises(ForeignEnvError, match="score_answer: got str 'yes', not a number"):
        env.step("<answer>1</answer>")
    env.reset(seed=0)

    def unreadable(self: object, answer: object, entry: object) -> float:
        raise ValueError(f"cannot read {answer!r}")

    monkeypatch.setattr(type(env.unwrapped.data), "score_answer", unreadable)
    _, reward, terminated, _, info = env.step("<answer>many</answer>")  # a wrong answer, not a failure
    assert (reward, terminated) == (0.0, True) and "cannot read 'many'" in info["score_error"]


def test_unknown_datasets_and_options_are_clear_errors() -> None:
    with pytest.raises(UnknownEnvError, match="Did you mean basic_arithmetic"):
        validate_env_options("reasoning_gym:basic_arithmetc")
    with pytest.raises(ValueError, match="tool"):
        validate_env_options("reasoning_gym:chain_sum", {"tool": "abacus"})
    assert (
        validate_env_options("reasoning_gym/chain_sum") == "reasoning_gym/chain_sum"
    )  # the resolved id works too


def test_the_openrlhf_executor_plays_a_dataset() -> None:
    import asyncio
    from types import SimpleNamespace

    from srt_agent.integrations.openrlhf.samples import episode_prompt, play_episode

    env_id, options = "reasoning_gym:chain_sum", {"tool": "calculator", "max_turns": 3}
    fmt = tiny_format()
    engine = ScriptedEngine(
        fmt, oracle_responder(fmt, oracles(env_id, range(2), **options)), max_context=1 << 16
    )
    params = SimpleNamespace(temperature=1.0, max_tokens=None)  # the vLLM fields OpenRLHF sets that srt reads
    for seed in range(2):
        prompt = episode_prompt(env_id, seed=seed, options=options)
        sample = asyncio.run(
            play_episode(prompt, "", params, 1 << 16, fmt.tokenizer, engine, max_new_tokens=256)
        )
        assert sample["reward"] == 1.0 and sample["extra_logs"]["srt_turns"] == 2.0  # the call, the answer
        assert sample["extra_logs"]["srt_failed"] == 0.0


def test_ray_env_workers_play_a_dataset_as_one_process_does(tmp_path: Path) -> None:
    """Each env worker is another process: the prefix resolves there on first use."""
    ray = pytest.importorskip("ray")
    from srt_agent.distributed.ray_config import RayConfig
    from srt_agent.rollout.config import EpisodeRequest, RolloutConfig
    from srt_agent.rollout.scheduler import rollout_sync
    from srt_agent.runtime import build_runtime
    from srt_agent.tree_cache import TreeCache

    model = save_tiny_policy(tmp_path / "policy")
    specs = [
        EpisodeRequest(
            "reasoning_gym:chain_sum", seed=s, trial=t, env_options={"tool": "calculator", "max_turns": 2}
        )
        for s in range(3)
        for t in range(2)
    ]

    def tokens(ray_config: RayConfig | None) -> list[tuple[int, ...]]:
        rollout = RolloutConfig(max_concurrent=6, max_new_tokens=8, seed=3)
        runtime = build_runtime(model, rollout, draft_source=TreeCache(), ray=ray_config)
        try:
            batch = rollout_sync(runtime.scheduler, specs)
        finally:
            runtime.close()
        assert all(t.status in ("ok", "truncated") for t in batch.trajectories), [
            t.error for t in batch.trajectories
        ]
        return [tuple(t.token_ids) for t in batch.trajectories]

    local = tokens(None)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        assert tokens(RayConfig(replicas=1, env_workers=2)) == local
    finally:
        ray.shutdown()
