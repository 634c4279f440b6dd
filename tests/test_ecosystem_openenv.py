"""OpenEnv environments through ``openenv:<module>:<name>`` (``pytest -m openenv``).

Three environments written against openenv-core's own API (``examples/ecosystems/oe_envs.py``),
played in process (an ``Environment`` subclass) and behind servers srt-agent starts from their
``create_app`` apps (uvicorn, one WebSocket session per env): the env checks, scripted players
through ``srt-agent eval``, a real TorchEngine, and a server that cannot start.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.openenv
pytest.importorskip("openenv.core")
pytest.importorskip("textarena")
pytest.importorskip("reasoning_gym")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "ecosystems"
sys.path.insert(0, str(EXAMPLES))  # the example environments, importable by module name as a user's are

from ecosystem_players import BinarySearch, Hanoi  # noqa: E402
from scripted_engine import ScriptedEngine  # noqa: E402
from test_rollout_support import oracle_responder, tiny_format  # noqa: E402
from train_fixtures import save_tiny_policy  # noqa: E402

from srt_agent.env.registration import make  # noqa: E402
from srt_agent.env.testing import check_multiturn_env  # noqa: E402
from srt_agent.evaluation import run_eval  # noqa: E402
from srt_agent.integrations.ecosystems.foreign import ForeignEnvError  # noqa: E402

IN_PROCESS = ["oe_envs:GuessEnvironment", "oe_envs:TextArenaEnvironment", "oe_envs:ReasoningGymEnvironment"]


@pytest.mark.parametrize("target", IN_PROCESS)
def test_in_process_environments_pass_the_env_checks(target: str) -> None:
    env = make(f"openenv:{target}")
    check_multiturn_env(env)
    opening, info = env.reset(seed=3)
    assert info["task_id"] == f"openenv/{target}/3" and opening[0].content
    env.close()


@pytest.mark.parametrize(
    ("target", "player"), [("oe_envs:GuessEnvironment", BinarySearch()), ("oe_envs:hanoi_app", Hanoi())]
)
def test_scripted_players_win_through_eval_in_process_and_served(target: str, player: object) -> None:
    fmt = tiny_format()
    by_task = {f"openenv/{target}/{seed}": player for seed in range(3)}
    engine = ScriptedEngine(fmt, oracle_responder(fmt, by_task), max_context=1 << 16)  # type: ignore[arg-type]
    report = run_eval(f"openenv:{target}", engine, fmt=fmt, episodes=3, max_new_tokens=4096)
    assert (report.ok, report.failed, report.success_rate) == (3, 0, 1.0), report.reasons


def test_a_served_environment_keeps_one_session_per_env() -> None:
    import random

    low = next(s for s in range(100) if random.Random(s).randint(1, 20) < 10)  # the game's own draw
    high = next(s for s in range(100) if random.Random(s).randint(1, 20) > 10)
    first, second = make("openenv:oe_envs:guess_app"), make("openenv:oe_envs:guess_app")
    first.reset(seed=low)
    second.reset(seed=high)
    assert "lower" in first.step("[10]")[0][0].content and "higher" in second.step("[10]")[0][0].content
    first.close()
    second.close()


def test_episodes_beyond_the_servers_sessions_wait_for_one() -> None:
    """The app admits 8 sessions; 16 episodes at once wait for a free one instead of failing."""
    fmt = tiny_format()
    by_task = {f"openenv/oe_envs:guess_app/{seed}": BinarySearch() for seed in range(16)}
    engine = ScriptedEngine(fmt, oracle_responder(fmt, by_task), max_context=1 << 16)  # type: ignore[arg-type]
    report = run_eval("openenv:oe_envs:guess_app", engine, fmt=fmt, episodes=16, max_concurrent=16)
    assert (report.ok, report.failed, report.success_rate) == (16, 0, 1.0), report.reasons


def test_a_real_engine_plays_three_environments(tmp_path: Path) -> None:
    model = save_tiny_policy(tmp_path / "policy")
    for target in IN_PROCESS:
        report = run_eval(
            f"openenv:{target}", model, episodes=2, max_new_tokens=12, max_concurrent=2, max_turns=3
        )
        assert report.failed == 0 and report.episodes == 2 and report.tokens_generated > 0, report.reasons


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "oe_broken.py").write_text(  # loads here, dies in the server process
        "import sys\nfrom oe_envs import guess_app as app\n"
        "if 'uvicorn' in ' '.join(sys.argv):\n    raise SystemExit('this server refuses to start')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLES))
    with pytest.raises(ForeignEnvError, match=r"exited with code 1: .*this server refuses to start"):
        make("openenv:oe_broken:app")


def test_the_servers_capacity_refusal_is_recognised_by_the_clients_own_error() -> None:
    """The retry rule against the pinned openenv-core's real refusal, not a message written here."""
    import openenv.core as core

    from srt_agent.integrations.ecosystems.openenv_env import _server, server_busy

    url = _server("oe_envs:guess_app", 120).url
    clients, refused = [], None
    try:
        for _ in range(12):  # the app admits 8 sessions
            client = core.GenericEnvClient(base_url=url).sync()
            try:
                client.__enter__()
                clients.append(client)
                client.reset(seed=0)
            except Exception as exc:  # noqa: BLE001 - the refusal, whatever type openenv-core gives it
                refused = exc
                break
    finally:
        for client in clients:
            client.__exit__(None, None, None)
    assert refused is not None and server_busy(refused), repr(refused)
    assert not server_busy(RuntimeError("Server error: boom (code: EXECUTION_ERROR)"))
    assert not server_busy(ValueError("CAPACITY_REACHED"))  # the code, from the client's error type only
