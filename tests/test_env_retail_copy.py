import json

import gymnasium as gym
import pytest

from srt_agent.env.episode_loop import run_episode
from srt_agent.env.multi_turn import EnvConfigError, oracle_policy
from srt_agent.env.testing import check_multiturn_env
from srt_agent.envs.retail.copy_drill import STYLES, RetailCopyEnv, fixed_store, render_values, store_values
from srt_agent.envs.retail.db import generate_database
from srt_agent.tooling.parser import format_tool_call

ENV_ID = "srt/RetailCopy-v0"


def base(env: gym.Env) -> RetailCopyEnv:
    inner = env.unwrapped
    assert isinstance(inner, RetailCopyEnv)
    return inner


def record(values: list[str]) -> str:
    return format_tool_call("record_values", {"values": values})


def test_registered_and_passes_env_checks() -> None:
    assert ENV_ID in gym.registry
    check_multiturn_env(gym.make(ENV_ID))
    check_multiturn_env(gym.make(ENV_ID, render_mode="ansi", min_values=1, max_values=1))


def test_oracle_solves_every_task_in_one_turn() -> None:
    env = gym.make(ENV_ID)
    sizes = set()
    for seed in range(40):
        result = run_episode(env, oracle_policy, seed=seed)
        assert result.total_reward == 1.0 and result.terminated and result.turns == 1
        sizes.add(len(base(env).values))
    assert sizes == set(range(3, 9))


def test_the_list_is_written_in_the_opening_and_is_retail_values() -> None:
    env = gym.make(ENV_ID)
    styles_seen = set()
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        text, values = obs[-1].content, base(env).values
        assert all(v in text for v in values)
        assert len(set(values)) == len(values)
        if "[" in text:
            assert json.loads(text[text.index("[") :]) == values
            styles_seen.add("json")
        elif " and " in text:
            styles_seen.add("sentence")
        else:
            styles_seen.add("spaces")
    assert styles_seen == set(STYLES)


def test_any_change_to_the_list_scores_zero_and_ends_the_episode() -> None:
    env = gym.make(ENV_ID)
    env.reset(seed=3)
    values = base(env).values
    for wrong in (
        values[::-1],
        values[:-1],
        [*values[:-1], values[-1][:-1] + "0"],
        [v.upper() for v in values],
    ):
        env.reset(seed=3)
        _, reward, terminated, truncated, info = env.step(record(wrong))
        assert (reward, terminated, truncated) == (0.0, True, False)
        assert info["copied"] < len(values) or len(wrong) < len(values)
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step(record(values))
    assert (reward, terminated, info["copied"]) == (1.0, True, len(values))


def test_a_turn_without_the_call_or_with_a_broken_call_is_answered_and_counts() -> None:
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step("Sure, noted.")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "record_values" in obs[-1].content
    obs, reward, terminated, truncated, _ = env.step('<tool_call>{"name": "record_values"</tool_call>')
    assert (reward, terminated, truncated) == (0.0, False, True)  # the second of two turns
    assert obs[-1].content.startswith("Error (")


def test_values_cover_every_kind_of_retail_id() -> None:
    import numpy as np

    db = generate_database(np.random.default_rng(0), 8, 6)
    pool = store_values(db)
    assert set(db.orders) <= set(pool) and all(u in pool for u in db.users)
    assert any(v.startswith("credit_card_") for v in pool) and any("@" in v for v in pool)
    assert any(v.isdigit() and len(v) == 10 for v in pool)  # item ids
    assert render_values(["a", "b", "c"], "sentence") == "a, b and c."
    assert render_values(["a"], "sentence") == "a."
    with pytest.raises(ValueError, match="style='csv'"):
        render_values(["a"], "csv")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_values": 5, "max_values": 4}, "max_values (4) must be >= min_values (5)"),
        ({"values": 3}, "unknown"),
    ],
)
def test_bad_options_name_the_valid_ones(options, message) -> None:
    with pytest.raises(EnvConfigError) as err:
        gym.make(ENV_ID, **options)
    assert message in str(err.value) and "Valid options:" in str(err.value)


def test_reset_takes_no_options() -> None:
    with pytest.raises(ValueError, match="takes no options"):
        gym.make(ENV_ID).reset(seed=0, options={"values": ["x"]})


def test_shared_stores_draw_every_list_from_a_few_fixed_stores() -> None:
    env = gym.make(ENV_ID, stores=2)
    pools = [set(store_values(fixed_store(i))) for i in range(2)]
    used = set()
    for seed in range(20):
        env.reset(seed=seed)
        values = set(base(env).values)
        owners = [i for i, pool in enumerate(pools) if values <= pool]
        assert owners, f"seed {seed}: {values} from no fixed store"
        used.update(owners)
    assert used == {0, 1}
    with pytest.raises(EnvConfigError, match="stores"):
        gym.make(ENV_ID, stores=0)
