"""TextArena's single-player games as srt-agent envs: ``textarena:<GameId>``.

Install with ``pip install 'srt-agent[textarena]'``.

How a game plays as a multi-turn chat:

* ``reset(seed=s)`` resets the game for one player with seed ``s``; its opening observations (the
  game's prompt and board) are the first user message. The task id is ``textarena/<GameId>/<s>``.
* Each assistant turn is the player's action, passed to the game unchanged except by the game's own
  action wrappers (TextArena's defaults, e.g. bracketing a bare move); the game's answer (hints,
  the board, an invalid-move notice) is the next user message. The game's observation wrappers,
  which re-send the whole history every turn for stateless prompting, are not used: the chat keeps
  the history.
* The episode ends when the game says it is done (its own turn limit included), or at
  ``max_turns``. The reward is the game's reward for the player at its end (1 for a win; games
  give partial credit or -1 for a loss or an invalid move), 0 on the turns before; the episode
  counts as solved at ``success_threshold`` (1).

Seeds: TextArena seeds Python's global ``random`` at reset, so resets here are serialized under a
lock (a seed always gives the same task), one that a reset holding it past ``call_timeout_s`` loses
(:class:`~srt_agent.integrations.ecosystems.foreign.HeldLock`: a hung reset cannot stall the
others; ``env.isolation: process`` keeps each game's ``random`` out of the trainer's process);
randomness a game draws later (2048's new tiles) is not reproducible when episodes run
concurrently. Multi-player games are refused at reset. Games that load data at run time (Wordle's
NLTK ``words`` corpus) fail with an error naming the resource when it cannot be fetched.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from srt_agent.chat.messages import Message, user
from srt_agent.env.multi_turn import Transition
from srt_agent.env.registration import UnknownEnvError, register_env
from srt_agent.integrations.ecosystems.foreign import (
    ForeignEnv,
    ForeignEnvConfig,
    ForeignEnvError,
    HeldLock,
    foreign_reward,
    import_package,
    reraise_foreign,
)

__all__ = ["TextArenaConfig", "TextArenaEnv", "register"]

NAMESPACE = "textarena"

# TextArena seeds the process-wide ``random`` at reset; a hung reset keeps it at most this long.
_RESET_LOCK = HeldLock(hold_s=60.0)


class TextArenaConfig(ForeignEnvConfig):
    """Options of a TextArena game (``gymnasium.make("textarena:<GameId>", **options)``)."""

    game: str = Field(description="The TextArena env id, e.g. GuessTheNumber-v0.")
    max_turns: int = Field(
        200, ge=1, le=10_000, description="Assistant turns before truncation (games also end themselves)."
    )
    game_options: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of the game's registered arguments (e.g. max_turns)."
    )


def _textarena() -> Any:
    return import_package("textarena", "textarena", "textarena")


def _base_and_actions(env: Any, ta: Any) -> Any:
    """The game without its observation wrappers, its action wrappers kept (in their order)."""
    chain = []
    while isinstance(env, ta.Wrapper):
        chain.append(type(env))
        env = env.env
    for wrapper in reversed(chain):
        if issubclass(wrapper, ta.ActionWrapper):
            env = wrapper(env)
    return env


class TextArenaEnv(ForeignEnv):
    """A single-player TextArena game: its observations as user turns, the assistant's turns as its moves.

    Args:
        render_mode: ``None`` or ``"ansi"``.
        **options: :class:`TextArenaConfig` options.
    """

    config_model = TextArenaConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        super().__init__(render_mode=render_mode, **options)
        self.config: TextArenaConfig
        self._ta = _textarena()
        self._game: Any = None

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """A fresh game for one player; its opening observations."""
        if options:
            raise ValueError(f"TextArena games take no reset options, got {sorted(options)}")
        ta, game = self._ta, self.config.game
        seed = self.task_seed()
        what = f"TextArena game {game}"
        try:
            env = _base_and_actions(ta.make(game, **self.config.game_options), ta)
        except Exception as exc:
            raise reraise_foreign(exc, f"{what} (make)") from exc
        _RESET_LOCK.hold_s = self.config.call_timeout_s  # the newest game's setting (one lock per process)
        with _RESET_LOCK.held():
            try:
                env.reset(num_players=1, seed=seed)
            except (AssertionError, ValueError, TypeError) as exc:
                if "player" in str(exc).lower():
                    raise ForeignEnvError(
                        f"{what} is not a single-player game ({exc}); srt-agent plays TextArena's "
                        "single-player games"
                    ) from exc
                raise reraise_foreign(exc, f"{what} at reset") from exc
            except Exception as exc:
                raise reraise_foreign(exc, f"{what} at reset") from exc
        if not isinstance(getattr(env, "state", None), ta.SinglePlayerState):  # a few accept 1 player anyway
            raise ForeignEnvError(
                f"{what} is not a single-player game (its state is "
                f"{type(getattr(env, 'state', None)).__name__}); srt-agent plays the single-player ones"
            )
        self._game = env
        opening = self._observations()
        if not opening:
            raise ForeignEnvError(f"{what} gave no opening observation at reset")
        return f"{NAMESPACE}/{game}/{seed}", [user(opening)]

    def _observations(self) -> str:
        """The game's new observations for the player (drained), its own echoed moves left out."""
        try:
            _, observations = self._game.get_observation()
        except Exception as exc:
            raise reraise_foreign(exc, f"TextArena game {self.config.game} get_observation") from exc
        if isinstance(observations, str):  # a wrapper that renders strings (not expected here)
            return observations.strip()
        lines = []
        for item in observations or ():
            if not isinstance(item, tuple | list) or len(item) < 2:
                raise ForeignEnvError(
                    f"TextArena game {self.config.game}: unreadable observation {str(item)[:200]}"
                )
            text, kind = item[1], item[2] if len(item) > 2 else None
            if getattr(kind, "name", "") == "PLAYER_ACTION":
                continue  # the assistant's own move, already in the chat
            lines.append(str(text).strip())
        return "\n\n".join(line for line in lines if line)

    def on_message(self, text: str) -> Transition:
        """The move: the game's answer as the next user turn, its reward at its end."""
        game = self.config.game
        try:
            done, step_info = self._game.step(text)
        except Exception as exc:
            raise reraise_foreign(exc, f"TextArena game {game} step") from exc
        observation = self._observations()
        if not done:
            messages = (
                [user(observation)]
                if observation
                else [user("(the game has nothing to say; make your move)")]
            )
            return Transition(messages=messages, info={"textarena": _plain(step_info)})
        try:
            rewards, game_info = self._game.close()
        except Exception as exc:
            raise reraise_foreign(exc, f"TextArena game {game} close") from exc
        reward = _player_reward(rewards, game)
        player_info = game_info.get(0, game_info) if isinstance(game_info, dict) else game_info
        info = {"textarena": _plain(player_info)}
        reason = player_info.get("reason") if isinstance(player_info, dict) else None
        closing = "\n\n".join(str(t) for t in (observation, reason) if t)  # the outcome is not observed
        return Transition(
            messages=[user(closing)] if closing else [], reward=reward, terminated=True, info=info
        )


def _player_reward(rewards: Any, game: str) -> float:
    """Player 0's reward from the game's ``{player: reward}``, or :class:`ForeignEnvError`."""
    if not isinstance(rewards, dict) or 0 not in rewards:
        raise ForeignEnvError(
            f"TextArena game {game} ended without a reward for the player: {str(rewards)[:200]}"
        )
    # TextArena 0.7.4's Countdown, Cryptarithm, Slitherlink and ThreeCardMonte pass their reason
    # where the reward goes when a game ends on invalid moves: the reward is that text.
    return foreign_reward(rewards[0], f"TextArena game {game}'s reward for the player")


def _plain(value: Any) -> Any:
    """``value`` with anything that is not JSON-like turned into text (infos cross processes)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def register(name: str) -> str:
    """Register ``textarena:<name>``; its Gymnasium id (``textarena/<name>``).

    Raises:
        UnknownEnvError: textarena is not installed, or has no env ``name``.
    """
    _textarena()
    from textarena.envs.registration import ENV_REGISTRY

    if name not in ENV_REGISTRY:
        close = difflib.get_close_matches(name, list(ENV_REGISTRY), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownEnvError(
            f"TextArena has no env {name!r}.{hint} (textarena.envs.registration.ENV_REGISTRY lists its "
            f"{len(ENV_REGISTRY)} ids; srt-agent plays the single-player ones)"
        )
    env_id = f"{NAMESPACE}/{name}"
    register_env(env_id, TextArenaEnv, game=name)
    return env_id
