"""Example OpenEnv environments, written against openenv-core's own API.

OpenEnv ships no environments on PyPI (its official ones live in its repository), so these are
three of the kind: a number-guessing game, TextArena single-player games and reasoning-gym
datasets (as OpenEnv's repository wraps them), to play in process or behind ``create_app`` servers
(``guess_app``, ``hanoi_app``).
"""

from __future__ import annotations

import os
import random
import re
from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class TextAction(Action):
    """The agent's message."""

    message: str = Field(..., description="What the agent says.")


class TextObservation(Observation):
    """What the agent sees."""

    text: str = ""


class GuessEnvironment(Environment[TextAction, TextObservation, State]):
    """Guess a number from 1 to 20 ("[7]"); higher/lower hints; reward 1 on a hit, 6 turns."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_turns: int = 6) -> None:
        super().__init__()
        self.max_turns, self.target, self._state = max_turns, 0, State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        self.target = random.Random(seed).randint(1, 20)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return TextObservation(text="Guess my number from 1 to 20. Answer like [7].", reward=0.0)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        self._state.step_count += 1
        found = re.search(r"\[(\d+)\]", action.message)
        if found is None:
            return TextObservation(
                text="Answer like [7].", reward=0.0, done=self._state.step_count >= self.max_turns
            )
        guess = int(found.group(1))
        if guess == self.target:
            return TextObservation(text=f"Correct! It was {guess}.", reward=1.0, done=True)
        hint = "higher" if guess < self.target else "lower"
        return TextObservation(
            text=f"{guess} is wrong: {hint}.", reward=0.0, done=self._state.step_count >= self.max_turns
        )

    @property
    def state(self) -> State:
        return self._state


class TextArenaEnvironment(Environment[TextAction, TextObservation, State]):
    """A TextArena single-player game (``TA_ENV_ID``, default TowerOfHanoi-v0) behind OpenEnv."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, game: str | None = None) -> None:
        super().__init__()
        self.game = game or os.environ.get("TA_ENV_ID", "TowerOfHanoi-v0")
        self._env: Any = None
        self._state = State()

    def _new_text(self) -> str:
        _, msgs = self._env.get_observation()
        return "\n".join(t for _, t, kind in msgs if kind.name != "PLAYER_ACTION")

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        import textarena as ta

        self._env = ta.make(self.game + "-raw")
        self._env.reset(num_players=1, seed=seed)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return TextObservation(text=self._new_text(), reward=0.0)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        self._state.step_count += 1
        done, _ = self._env.step(action.message)
        text, reward = self._new_text(), 0.0
        if done:
            rewards, info = self._env.close()
            value = (rewards or {}).get(0, 0.0)
            reward = float(value) if isinstance(value, int | float) else 0.0
            text = f"{text}\n{info[0].get('reason', '')}".strip()
        return TextObservation(text=text, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state


class ReasoningGymEnvironment(Environment[TextAction, TextObservation, State]):
    """One reasoning-gym question per episode (``RG_DATASET``, default chain_sum), scored by the dataset."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, dataset: str | None = None) -> None:
        super().__init__()
        import reasoning_gym

        self.data = reasoning_gym.create_dataset(
            dataset or os.environ.get("RG_DATASET", "chain_sum"), size=1000, seed=0
        )
        self.entry: dict[str, Any] = {}
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        self.entry = self.data[(seed or 0) % len(self.data)]
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return TextObservation(
            text=self.entry["question"] + "\nAnswer in <answer></answer> tags.", reward=0.0
        )

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        from reasoning_gym.utils import extract_answer

        score = float(self.data.score_answer(extract_answer(action.message), self.entry))
        return TextObservation(text=f"Scored {score}.", reward=score, done=True)

    @property
    def state(self) -> State:
        return self._state


guess_app = create_app(GuessEnvironment, TextAction, TextObservation, env_name="guess", max_concurrent_envs=8)
hanoi_app = create_app(
    TextArenaEnvironment, TextAction, TextObservation, env_name="textarena", max_concurrent_envs=8
)
