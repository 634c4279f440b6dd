"""verifiers environments through ``verifiers:<module>`` (``pytest -m verifiers``).

Four environments written against verifiers' own API (``examples/ecosystems/vf_*.py``): a
``SingleTurnEnv`` with an XML parser and a format reward, a ``MultiTurnEnv`` with
``env_response`` and ``final_env_response``, a ``ToolEnv`` whose tool verifiers runs, and
verifiers' own ``ReasoningGymEnv``. The env checks, scripted players through ``srt-agent eval``
with the rubric's reward and criteria, a real TorchEngine playing three of them, and an
environment that raises failing its episode only.
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

pytestmark = pytest.mark.verifiers
pytest.importorskip("verifiers")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "ecosystems"
sys.path.insert(0, str(EXAMPLES))  # the example environments, importable by module name as a user's are

from scripted_engine import ScriptedEngine  # noqa: E402
from test_rollout_support import oracle_responder, tiny_format  # noqa: E402
from train_fixtures import save_tiny_policy  # noqa: E402

from srt_agent.chat.messages import Message  # noqa: E402
from srt_agent.env.registration import UnknownEnvError, make, validate_env_options  # noqa: E402
from srt_agent.env.testing import check_multiturn_env  # noqa: E402
from srt_agent.evaluation import run_eval  # noqa: E402
from srt_agent.integrations.ecosystems.foreign import ForeignEnvError  # noqa: E402
from srt_agent.tooling.parser import format_tool_call  # noqa: E402

ENVS = ["vf_arith", "vf_guess", "vf_adder", "vf_rgym"]


class Adder:
    def act(self, history: Sequence[Message]) -> str:
        a, b = (
            int(x)
            for x in re.findall(
                r"(\d+)\+(\d+)", history[-1].content if history[-1].role == "user" else history[1].content
            )[0]
        )
        if history[-1].role == "tool":
            return f"The answer is {history[-1].content}."
        return format_tool_call("add", {"a": a, "b": b})


class Summer:
    def act(self, history: Sequence[Message]) -> str:
        a, b = (int(x) for x in re.findall(r"What is (\d+) \+ (\d+)", history[-1].content)[0])
        return f"<answer>{a + b}</answer>"


class Bisect:
    def act(self, history: Sequence[Message]) -> str:
        lo, hi = 1, 16
        for mine, reply in itertools.pairwise(history):
            if mine.role == "assistant" and mine.content.isdigit():
                guess = int(mine.content)
                lo, hi = (
                    (guess + 1, hi)
                    if reply.content == "higher"
                    else (lo, guess - 1)
                    if reply.content == "lower"
                    else (lo, hi)
                )
        return str((lo + hi) // 2)


class KnowsAnswer:
    def __init__(self, answer: str) -> None:
        self.answer = answer

    def act(self, history: Sequence[Message]) -> str:
        return f"<answer>{self.answer}</answer>"


@pytest.mark.parametrize("module", ENVS)
def test_environments_pass_the_env_checks(module: str) -> None:
    env = make(f"verifiers:{module}")
    check_multiturn_env(env)
    opening, info = env.reset(seed=2)
    assert info["task_id"].startswith(f"verifiers/{module}/train/") and opening[-1].role == "user"
    env.close()


def _players(module: str) -> dict[str, object]:
    if module == "vf_rgym":
        env = make("verifiers:vf_rgym")
        found = {}
        for seed in range(3):
            _, info = env.reset(seed=seed)
            vf_env = env.unwrapped.vf_env  # its rows' answer is an index into its reasoning-gym dataset
            found[info["task_id"]] = KnowsAnswer(
                vf_env.rg_dataset[int(env.unwrapped._state["answer"])]["answer"]
            )
        env.close()
        return found
    player = {"vf_arith": Summer(), "vf_guess": Bisect(), "vf_adder": Adder()}[module]
    env = make(f"verifiers:{module}")
    ids = [env.reset(seed=s)[1]["task_id"] for s in range(3)]
    env.close()
    return dict.fromkeys(ids, player)


@pytest.mark.parametrize(
    ("module", "reward"), [("vf_arith", 1.2), ("vf_guess", 1.0), ("vf_adder", 1.0), ("vf_rgym", 1.0)]
)
def test_scripted_players_solve_them_through_eval(module: str, reward: float) -> None:
    fmt = tiny_format()
    engine = ScriptedEngine(fmt, oracle_responder(fmt, _players(module)), max_context=1 << 16)  # type: ignore[arg-type]
    report = run_eval(f"verifiers:{module}", engine, fmt=fmt, episodes=3, max_new_tokens=4096)
    assert (report.ok, report.failed, report.success_rate) == (3, 0, 1.0), report.reasons
    assert report.mean_reward == pytest.approx(reward)


def test_the_rubrics_criteria_and_the_tool_results_reach_srt_agent() -> None:
    env = make("verifiers:vf_adder")
    _, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["add"]
    msgs, reward, terminated, _, step_info = env.step(format_tool_call("add", {"a": 40, "b": 2}))
    assert [(m.role, m.content, m.name) for m in msgs] == [("tool", "42", "add")] and not terminated
    assert step_info["tool_calls"] == 1  # verifiers ran it; the episode's counts include it
    _, reward, terminated, _, info = env.step("The answer is 42.")
    assert (reward, terminated) == (1.0, True) and info["verifiers_metrics"]["correct"] == 1.0
    env.close()
    arith = make("verifiers:vf_arith")
    arith.reset(seed=0)
    _, reward, _, _, info = arith.step("no idea")
    assert info["verifiers_metrics"]["exact"] == 0.0 and reward < 0.2  # only part of the format reward
    arith.close()


def test_a_real_engine_plays_three_environments(tmp_path: Path) -> None:
    model = save_tiny_policy(tmp_path / "policy")
    for module in ENVS[:3]:
        report = run_eval(f"verifiers:{module}", model, episodes=2, max_new_tokens=12, max_concurrent=2)
        assert report.failed == 0 and report.episodes == 2 and report.tokens_generated > 0, report.reasons


def test_an_environment_that_raises_fails_its_episode_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vf_guess

    async def broken(self: object, messages: object, state: object, **kwargs: object) -> object:
        raise KeyError("target")

    monkeypatch.setattr(vf_guess.GuessEnv, "env_response", broken)
    env = make("verifiers:vf_guess")
    env.reset(seed=0)
    with pytest.raises(ForeignEnvError, match="KeyError"):
        env.step("3")
    env.close()


def test_unknown_modules_are_clear_errors() -> None:
    with pytest.raises(UnknownEnvError, match="no verifiers environment module 'vf_nope'"):
        validate_env_options("verifiers:vf_nope")
