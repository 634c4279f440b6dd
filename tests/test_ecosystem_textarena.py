"""TextArena's single-player games through ``textarena:<GameId>`` (``pytest -m textarena``).

Real games of the pinned release: the env checks, scripted players that win through ``srt-agent
eval`` (an engine that lets them answer), a real TorchEngine playing three games, a game that needs
a download failing with the resource named, and a multi-player game refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.textarena
textarena = pytest.importorskip("textarena")

from ecosystem_players import BinarySearch, Hanoi  # noqa: E402
from scripted_engine import ScriptedEngine  # noqa: E402
from test_rollout_support import oracle_responder, tiny_format  # noqa: E402
from train_fixtures import save_tiny_policy  # noqa: E402

from srt_agent.env.registration import UnknownEnvError, make, validate_env_options  # noqa: E402
from srt_agent.env.testing import check_multiturn_env  # noqa: E402
from srt_agent.evaluation import run_eval  # noqa: E402
from srt_agent.integrations.ecosystems.foreign import ForeignEnvError, MissingResourceError  # noqa: E402

GAMES = ["GuessTheNumber-v0", "TowerOfHanoi-v0", "Minesweeper-v0"]


@pytest.mark.parametrize("game", GAMES)
def test_games_pass_the_env_checks(game: str) -> None:
    env = make(f"textarena:{game}")
    check_multiturn_env(env)
    opening, info = env.reset(seed=5)
    assert info["task_id"] == f"textarena/{game}/5" and opening[0].role == "user" and opening[0].content
    env.close()


@pytest.mark.parametrize(
    ("game", "player"), [("GuessTheNumber-v0", BinarySearch()), ("TowerOfHanoi-v0", Hanoi())]
)
def test_scripted_players_win_through_eval(game: str, player: object) -> None:
    fmt = tiny_format()
    by_task = {f"textarena/{game}/{seed}": player for seed in range(3)}
    engine = ScriptedEngine(fmt, oracle_responder(fmt, by_task), max_context=1 << 16)  # type: ignore[arg-type]
    report = run_eval(f"textarena:{game}", engine, fmt=fmt, episodes=3, max_new_tokens=4096)
    assert (report.ok, report.failed, report.success_rate) == (3, 0, 1.0), report.reasons
    assert report.mean_turns > 1


def test_the_same_seed_is_the_same_game() -> None:
    env = make("textarena:GuessTheNumber-v0")
    env.reset(seed=11)
    first = [env.step(f"[{g}]")[0][0].content for g in (10, 15)]
    env.reset(seed=11)
    assert [env.step(f"[{g}]")[0][0].content for g in (10, 15)] == first


def test_a_real_engine_plays_three_games(tmp_path: Path) -> None:
    model = save_tiny_policy(tmp_path / "policy")
    for game in GAMES:
        report = run_eval(
            f"textarena:{game}", model, episodes=2, max_new_tokens=12, max_concurrent=2, max_turns=3
        )
        assert report.failed == 0 and report.episodes == 2 and report.tokens_generated > 0, report.reasons


def test_a_game_that_needs_a_download_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NLTK_DATA", str(Path("/nonexistent")))
    monkeypatch.setattr("nltk.download", lambda *args, **kwargs: False)  # as on a machine without network
    env = make("textarena:Wordle-v0")
    with pytest.raises(MissingResourceError, match="download"):
        env.reset(seed=0)


def test_multi_player_games_and_unknown_ids_are_clear_errors() -> None:
    env = make("textarena:TicTacToe-v0")
    with pytest.raises(ForeignEnvError, match="not a single-player game"):
        env.reset(seed=0)
    with pytest.raises(UnknownEnvError, match="Did you mean GuessTheNumber-v0"):
        validate_env_options("textarena:GuessTheNumbr-v0")


def test_a_reset_that_hangs_does_not_hold_up_the_other_games(monkeypatch: pytest.MonkeyPatch) -> None:
    """TextArena resets share a process-wide lock (the global ``random``); a hung one loses it after
    ``call_timeout_s``, so the other episodes wait at most that, and the hung one fails at its deadline."""
    import time

    from srt_agent.integrations.ecosystems import textarena_env
    from srt_agent.rollout import EpisodeRequest, RolloutConfig, run_rollouts

    real = textarena_env._base_and_actions

    def hanging(env: object, ta: object) -> object:
        game = real(env, ta)
        reset = game.reset

        def maybe_hang(num_players: int, seed: int | None = None) -> object:
            if seed == 666:
                time.sleep(20)
            return reset(num_players=num_players, seed=seed)

        game.reset = maybe_hang
        return game

    monkeypatch.setattr(textarena_env, "_base_and_actions", hanging)
    fmt = tiny_format()
    game = "GuessTheNumber-v0"
    by_task = {f"textarena/{game}/{seed}": BinarySearch() for seed in range(6)}
    engine = ScriptedEngine(fmt, oracle_responder(fmt, by_task), max_context=1 << 16)  # type: ignore[arg-type]
    options = {"call_timeout_s": 1.0}
    hung = [EpisodeRequest(f"textarena:{game}", seed=666, episode_id="hung", env_options=options)]
    others = [EpisodeRequest(f"textarena:{game}", seed=s, env_options=options) for s in range(6)]
    config = RolloutConfig(max_concurrent=8, max_new_tokens=4096, env_setup_timeout_s=3.0)
    t0 = time.perf_counter()
    by_id = {t.episode_id: t for t in run_rollouts(engine, fmt, hung + others, config=config)}
    wall = time.perf_counter() - t0
    assert by_id["hung"].status == "failed" and "env reset did not return within 3 s" in by_id["hung"].reason
    assert all(by_id[s.episode_id].success for s in others)
    # The others waited for the lock at most its 1 s, not the 20 s hang; the run ends at the hung deadline.
    assert wall < 3.0 + 2.0, wall
    assert max(by_id[s.episode_id].setup_s for s in others) < 1.0 + 1.0
