import re

import gymnasium as gym
import pytest

from srt_agent.env.episode_loop import run_episode
from srt_agent.env.multi_turn import EnvConfigError, oracle_policy
from srt_agent.env.testing import ScriptedPolicy, check_multiturn_env
from srt_agent.envs.guess_number import GuessNumberEnv, guess_reward, last_number, optimal_guesses
from srt_agent.tooling.parser import format_tool_call

ENV_ID = "srt/GuessNumber-v0"


def base(env: gym.Env) -> GuessNumberEnv:
    inner = env.unwrapped
    assert isinstance(inner, GuessNumberEnv)
    return inner


def seed_with_secret(env: gym.Env, ok) -> int:
    """The first seed whose secret satisfies ``ok`` (the env is left reset on it)."""
    for seed in range(1000):
        env.reset(seed=seed)
        if ok(base(env).secret):
            return seed
    raise AssertionError("no such seed")


def turns_left(feedback: str) -> int:
    found = re.search(r"(\d+) turns? left|(\d+) more turns?|remaining: (\d+)", feedback)
    assert found, feedback
    return int(next(g for g in found.groups() if g))


def test_registered_and_passes_env_checks() -> None:
    assert ENV_ID in gym.registry
    check_multiturn_env(gym.make(ENV_ID))
    check_multiturn_env(gym.make(ENV_ID, render_mode="ansi", low=-5, high=5, max_turns=4))


def test_binary_search_oracle_gets_full_reward_on_50_seeds() -> None:
    env = gym.make(ENV_ID)
    turns = set()
    for seed in range(50):
        result = run_episode(env, oracle_policy, seed=seed)
        assert result.total_reward == 1.0 and result.terminated and not result.truncated
        assert result.turns <= optimal_guesses(1, 100) == 7
        assert result.final_info["guess"] == base(env).secret
        turns.add(result.turns)
    assert len(turns) >= 3  # secrets differ, so episode lengths do too


@pytest.mark.parametrize(("low", "high"), [(1, 2), (1, 4), (0, 15), (-8, 8), (1, 1000)])
def test_oracle_is_optimal_on_other_ranges(low: int, high: int) -> None:
    env = gym.make(ENV_ID, low=low, high=high)
    for seed in range(40):
        result = run_episode(env, oracle_policy, seed=seed)
        assert result.total_reward == 1.0 and low <= base(env).secret <= high


def test_optimal_guesses_is_binary_search_worst_case() -> None:
    assert [optimal_guesses(1, n) for n in (1, 2, 3, 4, 7, 8, 100, 1024)] == [1, 2, 2, 3, 3, 4, 7, 11]


def test_shaped_reward_values() -> None:
    assert guess_reward(1, 7, 12) == guess_reward(7, 7, 12) == 1.0
    assert guess_reward(8, 7, 12) == pytest.approx(0.82)
    assert guess_reward(10, 7, 12) == pytest.approx(0.46)
    assert guess_reward(12, 7, 12) == pytest.approx(0.1)


def test_linear_scan_is_paid_less_the_longer_it_takes() -> None:
    env = gym.make(ENV_ID)
    seed = seed_with_secret(env, lambda s: 8 <= s <= 12)
    secret = base(env).secret
    result = run_episode(env, ScriptedPolicy([f"I guess {g}." for g in range(1, secret + 1)]), seed=seed)
    assert result.terminated and result.turns == secret
    assert result.total_reward == pytest.approx(1.0 - 0.9 * (secret - 7) / 5)
    assert result.transcript[-1].content.startswith(f"Correct! The number was {secret}.")


def test_never_found_truncates_with_zero_reward_and_reveals_the_secret() -> None:
    env = gym.make(ENV_ID, max_turns=5)
    seed = seed_with_secret(env, lambda s: s != 1)
    result = run_episode(env, ScriptedPolicy(["1"]), seed=seed)
    assert result.truncated and not result.terminated and result.turns == 5 and result.total_reward == 0.0
    assert f"the number was {base(env).secret}" in result.transcript[-1].content


def test_feedback_says_higher_or_lower_and_counts_turns_left() -> None:
    env = gym.make(ENV_ID)
    seed_with_secret(env, lambda s: 10 < s < 90)
    secret = base(env).secret
    obs, reward, terminated, _, info = env.step(f"Maybe {secret - 5}?")
    assert re.search(r"\bhigher\b", obs[0].content, re.I) and not re.search(r"\blower\b", obs[0].content)
    assert (
        turns_left(obs[0].content) == 11 and reward == 0.0 and not terminated and info["guess"] == secret - 5
    )
    obs, *_ = env.step(f"Then {secret + 3}.")
    assert re.search(r"\blower\b", obs[0].content, re.I) and turns_left(obs[0].content) == 10


def test_the_last_number_in_the_reply_is_the_guess() -> None:
    assert last_number("Between 51 and 75, so I'll try 62.") == 62
    assert last_number("I think 30, no wait, 70") == 70
    assert last_number("range 1-100: -3") == -3
    assert last_number("nothing here") is None
    env = gym.make(ENV_ID)
    seed_with_secret(env, lambda s: s not in (30, 70))
    *_, info = env.step("I think 30, no wait, 70")
    assert info["guess"] == 70


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("I have no idea!", "couldn't find a number"),
        ("150", "outside the range"),
        ("50.5", "not a whole number"),
    ],
)
def test_invalid_guesses_get_a_correction_and_use_a_turn(reply: str, expected: str) -> None:
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(reply)
    assert expected in obs[0].content and "whole number from 1 to 100" in obs[0].content
    assert turns_left(obs[0].content) == 11
    assert info["guess"] is None
    assert reward == 0.0 and not terminated and not truncated and base(env).turn == 1
    assert not re.search(r"\b(higher|lower)\b", obs[0].content)


def test_tool_calls_get_the_unknown_tool_error_and_count_as_turns() -> None:
    env = gym.make(ENV_ID, max_turns=2)
    _, info = env.reset(seed=0)
    assert info["tools"] == []
    call = format_tool_call("calculator", {"expression": "1 + 1"})
    obs, reward, terminated, truncated, info = env.step(call)
    assert obs[0].role == "tool" and obs[0].content.startswith("Error (unknown_tool)")
    assert "no tools" in obs[0].content and info["tool_errors"] == ["unknown_tool"]
    assert reward == 0.0 and not terminated and not truncated and base(env).turn == 1
    *_, truncated, _ = env.step(call)
    assert truncated


def test_determinism_and_variety() -> None:
    env = gym.make(ENV_ID)
    first, info = env.reset(seed=9)
    again, info_again = env.reset(seed=9)
    assert first == again and info["task_id"] == info_again["task_id"]
    secrets, openings = set(), set()
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        secrets.add(base(env).secret)
        openings.add(obs[-1].content)
    assert len(secrets) >= 15 and len(openings) >= 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"low": 10, "high": 10}, "high (10) must be greater than low (10)"),
        ({"low": 50, "high": 3}, "must be greater than low"),
        ({"hi": 3}, "unknown option 'hi'"),
        ({"max_turns": 0}, "max_turns"),
    ],
)
def test_bad_options_name_the_valid_ones(options, message) -> None:
    with pytest.raises(EnvConfigError) as err:
        gym.make(ENV_ID, **options)
    assert message in str(err.value) and "Valid options:" in str(err.value)
    assert "low: int = 1" in str(err.value) and "high: int = 100" in str(err.value)


def test_reset_takes_no_options() -> None:
    with pytest.raises(ValueError, match="takes no options"):
        gym.make(ENV_ID).reset(seed=0, options={"secret": 4})


def test_success_means_found_at_any_speed() -> None:
    env = base(gym.make(ENV_ID))
    assert env.is_success(0.1, {}) and env.is_success(1.0, {}) and not env.is_success(0.0, {})
