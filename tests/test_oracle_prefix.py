"""The ``oracle_prefix`` reset option and the reverse curriculum that draws it per training task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from train_fixtures import tiny_config, tiny_settings, write_config
from typer.testing import CliRunner

import srt_agent.envs  # noqa: F401 - registers the built-in envs
from srt_agent.chat.messages import assistant
from srt_agent.cli import app
from srt_agent.env.episode_loop import run_episode
from srt_agent.env.multi_turn import oracle_policy
from srt_agent.env.registration import has_oracle
from srt_agent.train.tasks import oracle_prefix, step_episodes

gym.register("test/NoOracle-v0", entry_point="srt_agent.env.testing:GenericTestEnv")


def _finish_with_oracle(env: gym.Env[Any, str], obs: tuple[Any, ...]) -> tuple[float, int]:
    """Let the oracle play on from ``obs`` (the conversation so far); total reward and turns."""
    policy = oracle_policy(env)
    history, total, done = list(obs), 0.0, False
    while not done:
        action = policy.act(tuple(history))
        obs, reward, terminated, truncated, info = env.step(action)
        assert "oracle_turns" in info  # every step says how much of the episode the oracle played
        history += [assistant(action), *obs]
        total, done = total + float(reward), terminated or truncated
    return total, env.unwrapped.turn  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["cancel", "return", "exchange", "info"])
def test_the_oracle_plays_a_share_of_its_solution_and_the_task_is_the_same(kind: str) -> None:
    env = gym.make("srt/Retail-v0")
    full = run_episode(env, oracle_policy, seed=7, options={"task_kind": kind})
    assert full.total_reward == 1.0
    solution = [m.content for m in full.transcript if m.role == "assistant"]
    for share in (0.0, 0.3, 0.7, 1.0):
        obs, info = env.reset(seed=7, options={"task_kind": kind, "oracle_prefix": share})
        k = info["oracle_turns"]
        assert k == min(int(share * len(solution)), len(solution) - 1)  # the policy always has a turn
        assert info["task_id"] == full.task_id
        # The observation is the whole conversation so far: the oracle's first k turns, verbatim.
        assert [m.content for m in obs if m.role == "assistant"] == solution[:k]
        assert obs == full.transcript[: len(obs)] and obs[-1].role != "assistant"
        total, turns = _finish_with_oracle(env, obs)
        assert total == 1.0 and turns == len(solution)


def test_without_a_seed_both_plays_draw_the_same_task() -> None:
    env = gym.make("srt/Calculator-v0")
    env.reset(seed=3)
    for _ in range(5):
        obs, info = env.reset(options={"oracle_prefix": 0.9})
        assert info["oracle_turns"] >= 1
        assert _finish_with_oracle(env, obs)[0] == 1.0


def test_no_option_no_oracle_turns_key_and_bad_shares_are_refused() -> None:
    env = gym.make("srt/Retail-v0")
    _, info = env.reset(seed=1)
    assert "oracle_turns" not in info
    for bad in (1.5, -0.1, True, "half"):
        with pytest.raises(ValueError, match=r"oracle_prefix=.*share in \[0, 1\]"):
            env.reset(seed=1, options={"oracle_prefix": bad})
    with pytest.raises(ValueError, match="task_kind"):  # the other options still reach the env
        env.reset(seed=1, options={"oracle_prefix": 0.5, "task_kind": "refund"})


def test_an_env_without_an_oracle_says_so() -> None:
    assert has_oracle("srt/Retail-v0") and has_oracle("srt/Calculator-v0")
    assert not has_oracle("test/NoOracle-v0")
    env = gym.make("test/NoOracle-v0")
    with pytest.raises(NotImplementedError, match="oracle"):
        env.reset(seed=0, options={"oracle_prefix": 0.5})
    _, info = env.reset(seed=0, options={"oracle_prefix": 0})  # nothing to play: no oracle needed
    assert info["oracle_turns"] == 0


def test_the_curriculum_draws_one_share_per_task_and_moves_the_start_back(tmp_path: Path) -> None:
    off = tiny_config(tmp_path / "model", tmp_path / "run", trainer={"steps": 10})
    assert all(e.reset_options is None for e in step_episodes(off, 1))
    cfg = tiny_config(tmp_path / "model", tmp_path / "run", env={"oracle_prefix": 0.8}, trainer={"steps": 10})
    for step in (1, 5, 10):
        episodes = step_episodes(cfg, step)
        shares = {e.seed: e.reset_options["oracle_prefix"] for e in episodes if e.reset_options}
        assert len(shares) == cfg.rollout.prompts_per_step and len(episodes) == len(shares) * cfg.rollout.n
        for e in episodes:  # a group's samples start from the same state
            assert e.reset_options == {"oracle_prefix": shares[e.seed]}
        top = 0.8 * (1 - (step - 1) / 10)
        assert all(0 <= s <= top for s in shares.values())
        assert shares == {s: oracle_prefix(cfg, step, s) for s in shares}  # a pure function (resume)
    draws = [oracle_prefix(cfg, 1, seed) for seed in range(2000)]
    assert 0.35 < sum(draws) / len(draws) < 0.45  # uniform on [0, 0.8] at the first step
    assert max(oracle_prefix(cfg, 10, seed) or 0 for seed in range(2000)) <= 0.08


def test_train_refuses_the_curriculum_on_an_env_without_an_oracle(tmp_path: Path) -> None:
    settings = tiny_settings(tmp_path / "model", tmp_path / "run", env={"id": "test/NoOracle-v0"})
    config = write_config(tmp_path / "tiny.yaml", settings)
    result = CliRunner().invoke(app, ["train", str(config), "env.oracle_prefix=0.5"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "env.oracle_prefix=0.5: test/NoOracle-v0 has no oracle" in result.output
    assert "set env.oracle_prefix=0" in result.output and not (tmp_path / "run").exists()
