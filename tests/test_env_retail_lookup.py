import json

import gymnasium as gym
import pytest

from srt_agent.env.episode_loop import run_episode
from srt_agent.env.multi_turn import EnvConfigError, oracle_policy
from srt_agent.env.testing import check_multiturn_env
from srt_agent.envs.retail.lookup_drill import LOOKUP_KINDS, RetailLookupEnv
from srt_agent.tooling.parser import format_tool_call, parse_tool_calls

ENV_ID = "srt/RetailLookup-v0"


def base(env: gym.Env) -> RetailLookupEnv:
    inner = env.unwrapped
    assert isinstance(inner, RetailLookupEnv)
    return inner


def test_registered_and_passes_env_checks() -> None:
    assert ENV_ID in gym.registry
    check_multiturn_env(gym.make(ENV_ID))
    check_multiturn_env(gym.make(ENV_ID, render_mode="ansi", stores=3))


def test_oracle_reads_the_record_then_records_ids_found_in_it_for_every_kind() -> None:
    env = gym.make(ENV_ID)
    kinds = set()
    for seed in range(40):
        result = run_episode(env, oracle_policy, seed=seed)
        assert result.total_reward == 1.0 and result.terminated and result.turns == 2
        kinds.add(base(env).task_id.split("-")[2])
        read, answer = result.transcript[2], result.transcript[3]
        asked = result.transcript[1].content
        call = parse_tool_calls(read.content).calls[0]
        assert next(iter(call.arguments.values())) in asked  # the record the customer named
        record = json.loads(answer.content)  # Retail's JSON for that record
        for value in base(env).values:
            assert value in answer.content and value not in asked  # found only by reading
        assert isinstance(record, dict)
    assert kinds == set(LOOKUP_KINDS)


def test_the_target_is_named_as_retail_customers_name_it() -> None:
    env = gym.make(ENV_ID)
    for seed in range(40):
        env.reset(seed=seed)
        kind, text = base(env).task_id.split("-")[2], base(env).transcript[1].content
        if kind in ("product", "items", "variant"):
            assert "(" in text and ": " in text  # an item as "Name (option: value, ...)"
        else:
            assert "PayPal" in text or "gift card" in text or "credit card ending in" in text


def test_a_wrong_id_scores_zero_and_a_failed_read_does_not_end_the_episode() -> None:
    env = gym.make(ENV_ID)
    env.reset(seed=3)
    _, r, term, _, _ = env.step(format_tool_call("get_order_details", {"order_id": "#W0000000"}))
    assert r == 0.0 and not term and base(env).transcript[-1].content.startswith("Error (")
    wrong = [*base(env).values[:-1], base(env).values[-1][:-1] + "x"]
    _, r, term, _, _ = env.step(format_tool_call("record_values", {"values": wrong}))
    assert r == 0.0 and term


def test_bad_options_and_reset_options_are_named() -> None:
    with pytest.raises(EnvConfigError, match="stores"):
        gym.make(ENV_ID, stores=0)
    with pytest.raises(ValueError, match="takes no options"):
        gym.make(ENV_ID).reset(seed=0, options={"kind": "payment"})
