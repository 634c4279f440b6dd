import gymnasium as gym
import pytest

import srt_agent
from srt_agent.env.multi_turn import EnvConfigError
from srt_agent.env.registration import UnknownEnvError, register_env, registered_envs
from srt_agent.env.testing import GenericTestEnv


def test_builtins_are_registered_on_import() -> None:
    ids = registered_envs()
    assert {
        "srt/Calculator-v0",
        "srt/Retail-v0",
        "srt/GuessNumber-v0",
        "srt/RetailCopy-v0",
        "srt/RetailLookup-v0",
    } <= set(ids)
    assert all(i in gym.registry for i in ids)


def test_unknown_id_names_the_valid_choices() -> None:
    with pytest.raises(UnknownEnvError) as info:
        srt_agent.make("srt/Calculater-v0")
    msg = str(info.value)
    assert "Did you mean srt/Calculator-v0" in msg and "srt/Retail-v0" in msg and "srt/GuessNumber-v0" in msg


@pytest.mark.parametrize(
    "env_id",
    ["srt/Calculator-v0", "srt/Retail-v0", "srt/GuessNumber-v0", "srt/RetailCopy-v0", "srt/RetailLookup-v0"],
)
def test_bad_kwargs_through_gymnasium_make_name_the_options(env_id: str) -> None:
    with pytest.raises(EnvConfigError) as info:
        gym.make(env_id, not_an_option=1)
    assert "unknown option 'not_an_option'" in str(info.value) and "max_turns: int" in str(info.value)


def test_custom_env_registration_is_idempotent_and_conflicts_are_refused() -> None:
    register_env("mytest/Generic-v0", GenericTestEnv, answer="7")
    register_env("mytest/Generic-v0", GenericTestEnv, answer="7")
    assert "mytest/Generic-v0" in registered_envs()
    env = srt_agent.make("mytest/Generic-v0")
    assert env.unwrapped.config.answer == "7"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="already registered"):
        register_env("mytest/Generic-v0", "srt_agent.envs.calculator:CalculatorEnv")


def test_check_env_checks_options_without_building_the_env() -> None:
    from srt_agent.env.multi_turn import EnvConfigError
    from srt_agent.env.registration import validate_env_options

    assert validate_env_options("srt/Calculator-v0", {"max_turns": 3}) == "srt/Calculator-v0"
    with pytest.raises(EnvConfigError, match="unknown option 'max_turn'"):
        validate_env_options("srt/Calculator-v0", {"max_turn": 3})
