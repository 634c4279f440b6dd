import re
import warnings
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest

from srt_agent.chat.messages import Message, assistant, tool_result
from srt_agent.env.episode_loop import run_episode
from srt_agent.env.multi_turn import EnvConfigError, oracle_policy
from srt_agent.env.testing import ScriptedPolicy, check_multiturn_env
from srt_agent.envs.calculator import CalculatorEnv, find_answer, parse_number
from srt_agent.envs.calculator_families import FAMILIES, MAX_STEPS, MIN_STEPS, generate_problem
from srt_agent.tooling.parser import format_tool_call
from srt_agent.tools.calculator import CalculatorError, evaluate, format_number

ENV_ID = "srt/Calculator-v0"


def base(env: gym.Env) -> CalculatorEnv:
    inner = env.unwrapped
    assert isinstance(inner, CalculatorEnv)
    return inner


def test_registered_and_passes_env_checks() -> None:
    assert ENV_ID in gym.registry
    check_multiturn_env(gym.make(ENV_ID))
    check_multiturn_env(gym.make(ENV_ID, render_mode="ansi", max_turns=3))


def test_oracle_solves_50_seeds_with_one_call_per_turn() -> None:
    env = gym.make(ENV_ID)
    for seed in range(50):
        result = run_episode(env, oracle_policy, seed=seed)
        steps = base(env).problem.steps
        assert result.total_reward == 1.0 and result.terminated and not result.truncated, result.task_id
        tools = [m for m in result.transcript if m.role == "tool"]
        assert len(tools) >= 2 and len(tools) == len(steps)
        assert all(m.name == "calculator" and parse_number(m.content) is not None for m in tools)
        turns = [m.content for m in result.transcript if m.role == "assistant"]
        assert result.turns == len(steps) + 1 == len(turns)
        assert all(t.count("<tool_call>") == 1 for t in turns[:-1]) and "<tool_call>" not in turns[-1]
        assert find_answer(turns[-1]) == tools[-1].content


def test_oracle_solves_every_family_and_step_count() -> None:
    env = gym.make(ENV_ID)
    for family in FAMILIES:
        for steps in range(MIN_STEPS, MAX_STEPS + 1):
            for seed in range(3):
                options = {"family": family, "steps": steps}
                result = run_episode(env, oracle_policy, seed=seed, options=options)
                assert result.total_reward == 1.0, (family, steps, seed)
                assert result.task_id.startswith(f"calculator-{family}-{steps}-")
                assert len(base(env).problem.steps) == steps


def test_plans_use_only_numbers_stated_in_the_problem() -> None:
    # Guards against hidden constants: every number an expression uses must be readable from the
    # question, apart from 60 (minutes/seconds per hour or minute), 100 (percent), 2 ("a friend")
    # and growth factors 1 + r/100 for a stated rate r%.
    number = re.compile(r"\d[\d,]*(?:\.\d+)?")
    rng = np.random.default_rng(7)
    for family in FAMILIES:
        for steps in range(MIN_STEPS, MAX_STEPS + 1):
            for _ in range(10):
                problem = generate_problem(rng, family, steps)
                stated = {Fraction(x.replace(",", "")) for x in number.findall(problem.text)}
                allowed = stated | {Fraction(2), Fraction(60), Fraction(100)} | {1 + x / 100 for x in stated}
                for step in problem.steps:
                    consts = number.findall(re.sub(r"\{\d+\}", "", step.expr))
                    assert {Fraction(c) for c in consts} <= allowed, (problem.text, step.expr)
                # The plan's outputs are what the calculator returns for the filled-in expressions.
                for i, step in enumerate(problem.steps):
                    assert format_number(evaluate(step.fill(problem.outputs[:i]))) == problem.outputs[i]


def test_oracle_reads_intermediate_values_from_the_transcript() -> None:
    env = base(gym.make(ENV_ID))
    opening, _ = env.reset(seed=0, options={"family": "savings", "steps": 2})
    policy = env.oracle()
    history: list[Message] = list(opening)
    first = policy.act(history)
    assert '"expression": "' in first and "<answer>" not in first
    # Feed a result the oracle could not have computed itself: it must build on it.
    history += [assistant(first), tool_result("777", call_id="t1_call_0", name="calculator")]
    second = policy.act(history)
    assert "777 * (100 + " in second
    history += [assistant(second), tool_result("888.5", call_id="t2_call_0", name="calculator")]
    assert find_answer(policy.act(history)) == "888.5"


def test_wrong_answer_scores_zero_and_ends_the_episode() -> None:
    env = gym.make(ENV_ID)
    env.reset(seed=3)
    expected = base(env).problem.answer
    _, reward, terminated, truncated, info = env.step(f"<answer>{format_number(expected + 1)}</answer>")
    assert reward == 0.0 and terminated and not truncated
    assert info["correct"] is False and info["expected"] == format_number(expected)


@pytest.mark.parametrize(
    "fmt",
    [
        lambda x: f"${float(x):,.2f}",
        lambda x: f"{format_number(x)} dollars",
        lambda x: f" {format_number(x)} ",
        lambda x: f"{float(x):,.2f}",
    ],
)
def test_answer_formats_are_accepted(fmt) -> None:
    env = gym.make(ENV_ID)
    # A balance over $1,000 with cents, so the separators and the "$" are exercised.
    seed = next(s for s in range(100) if _has_big_cents_answer(env, s))
    env.reset(seed=seed, options={"family": "savings", "steps": 2})
    expected = base(env).problem.answer
    _, reward, terminated, _, info = env.step(f"The answer is <answer>{fmt(expected)}</answer>")
    assert reward == 1.0 and terminated and info["correct"] is True


def _has_big_cents_answer(env: gym.Env, seed: int) -> bool:
    env.reset(seed=seed, options={"family": "savings", "steps": 2})
    answer = base(env).problem.answer
    return answer > 1000 and answer.denominator != 1


def test_a_number_glued_to_a_keyword_is_a_quiet_syntax_error() -> None:
    # The parser only warns about "1050in 3" (it would print to stderr mid-run); the tool says why.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning that escapes fails the test
        with pytest.raises(CalculatorError, match="syntax error"):
            evaluate("1050in 3")
    assert evaluate("1e3 + 1") == 1001


def test_answer_parsing_helpers() -> None:
    assert parse_number("$1,234.50") == Fraction("1234.5")
    assert parse_number("1234.5 dollars") == Fraction("1234.5")
    assert parse_number("3/4 cup") == Fraction(3, 4)
    assert parse_number("-2.5 km") == Fraction(-5, 2)
    assert parse_number("none") is None and parse_number("1/0") is None
    # A decimal over a whole number was a valid match but not a valid Fraction literal (it crashed step()).
    assert parse_number("74.65/78") == Fraction("74.65") / 78
    assert find_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert find_answer("so: <answer> 42") == "42"
    assert find_answer("no tag here") is None


def test_turn_without_call_or_answer_is_nudged_and_truncates_at_max_turns() -> None:
    env = gym.make(ENV_ID, max_turns=3)
    env.reset(seed=0)
    seen = set()
    for turn in range(1, 4):
        obs, reward, terminated, truncated, info = env.step("Hmm, let me think about this problem.")
        assert len(obs) == 1 and obs[0].role == "user" and "<answer>" in obs[0].content
        assert reward == 0.0 and not terminated and info["nudged"] is True
        assert truncated == (turn == 3)
        seen.add(obs[0].content)
    assert info["truncation_reason"] == "max_turns=3 reached"
    # The nudges vary across episodes.
    for seed in range(10):
        env.reset(seed=seed)
        seen.add(env.step("thinking...")[0][0].content)
    assert len(seen) >= 3


def test_tool_errors_mid_episode_are_reported_and_the_episode_continues() -> None:
    env = gym.make(ENV_ID)

    def solve(history):
        return base(env).oracle().act(history)

    calc = format_tool_call("calculator", {"expression": "1 / 0"})
    policy = ScriptedPolicy(
        [solve, '<tool_call>{"name": "calculator", "arguments": {</tool_call>', calc, solve]
    )
    result = run_episode(env, policy, seed=5)
    tools = [m.content for m in result.transcript if m.role == "tool"]
    assert tools[1].startswith("Error (malformed_call)")
    assert tools[2].startswith("Error (error)") and "division by zero" in tools[2]
    assert result.total_reward == 1.0 and result.terminated
    assert result.turns == len(base(env).problem.steps) + 3


def test_answer_in_the_same_turn_as_a_tool_call_is_graded() -> None:
    env = gym.make(ENV_ID)
    env.reset(seed=2)
    answer = base(env).problem.outputs[-1]
    call = format_tool_call("calculator", {"expression": "2 + 2"})
    obs, reward, terminated, _, _ = env.step(f"{call}\n<answer>{answer}</answer>")
    assert reward == 1.0 and terminated and obs[0].role == "tool" and obs[0].content == "4"


def test_determinism_and_variety() -> None:
    env = gym.make(ENV_ID)
    first, info = env.reset(seed=42)
    again, info_again = env.reset(seed=42)
    assert first == again and info["task_id"] == info_again["task_id"]
    texts, families = set(), set()
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        texts.add(obs[-1].content)
        families.add(info["task_id"].split("-")[1])
    assert len(texts) == 30
    assert len(families) >= 4


def test_config_restricts_families_and_steps() -> None:
    env = gym.make(ENV_ID, families=["travel", "bill"], min_steps=3, max_steps=3)
    for seed in range(10):
        _, info = env.reset(seed=seed)
        assert info["task_id"].split("-")[1] in {"travel", "bill"}
        assert len(base(env).problem.steps) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"foo": 1}, "unknown option 'foo'"),
        ({"min_steps": 4, "max_steps": 3}, "max_steps (3) must be >= min_steps (4)"),
        ({"max_steps": 6}, "max_steps"),
        ({"families": ["nope"]}, "unknown families ['nope']"),
    ],
)
def test_bad_options_name_the_valid_ones(options, message) -> None:
    with pytest.raises(EnvConfigError) as err:
        gym.make(ENV_ID, **options)
    assert message in str(err.value)
    assert "Valid options:" in str(err.value) and "min_steps" in str(err.value)


def test_bad_reset_options_are_rejected() -> None:
    env = gym.make(ENV_ID)
    with pytest.raises(ValueError, match="valid options: 'family', 'steps'"):
        env.reset(seed=0, options={"level": 3})
    with pytest.raises(ValueError, match="choose from shopping"):
        env.reset(seed=0, options={"family": "chess"})
    with pytest.raises(ValueError, match="n_steps must be from 2 to 5"):
        env.reset(seed=0, options={"steps": 9})


def test_oversized_actions_and_huge_powers_cost_nothing() -> None:
    import time

    from srt_agent.env.registration import make
    from srt_agent.tooling.parser import format_tool_call

    env = make("srt/Calculator-v0", max_action_chars=300)
    env.reset(seed=0)
    obs, reward, terminated, _, _ = env.step(
        "x" * 400 + format_tool_call("calculator", {"expression": "1+1"})
    )
    assert not terminated and reward == 0.0
    assert "481 characters, over this environment's limit of 300" in obs[0].content
    env.close()
    env = make("srt/Calculator-v0")
    env.reset(seed=0)
    powers = [f"{b}**{e}" for b, e in [("99999", 1000), ("(10**999)", 999), ("2", 1000), ("7", 999)]] * 2
    t0 = time.perf_counter()
    obs, *_ = env.step("".join(format_tool_call("calculator", {"expression": p}) for p in powers))
    assert time.perf_counter() - t0 < 2  # each refused before computing (it took seconds each)
    assert sum("too large" in m.content for m in obs) == 4  # 2**1000 and 7**999 are fine
    env.close()
