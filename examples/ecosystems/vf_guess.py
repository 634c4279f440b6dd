"""A verifiers ``MultiTurnEnv``, an example: guess a number from higher/lower replies."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


class GuessEnv(vf.MultiTurnEnv):  # type: ignore[misc]
    """The user answers each guess with higher or lower; a right guess ends the game."""

    async def setup_state(self, state: Any) -> Any:
        state["target"] = int(state["answer"])
        state["guesses"] = []
        return state

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        text = messages[-1].content or ""
        digits = "".join(c for c in text if c.isdigit())
        if not digits:
            return [vf.UserMessage(content="Please answer with a whole number.")]
        guess = int(digits)
        state["guesses"].append(guess)
        if guess == state["target"]:
            state["final_env_response"] = [vf.UserMessage(content="Correct!")]
            return state["final_env_response"]
        return [vf.UserMessage(content="higher" if guess < state["target"] else "lower")]


def load_environment(**kwargs: Any) -> Any:
    """Targets 1 to 16; reward 1 for finding it, a ``turns`` metric (weight 0)."""

    def won(state: Any, **_: Any) -> float:
        return 1.0 if state.get("guesses") and state["guesses"][-1] == state["target"] else 0.0

    def turns(state: Any, **_: Any) -> float:
        return float(len(state["trajectory"]))

    rows = [
        {"question": "Guess my number, from 1 to 16. Reply with the number only.", "answer": str(t)}
        for t in range(1, 17)
    ]
    return GuessEnv(
        dataset=Dataset.from_list(rows),
        rubric=vf.Rubric(funcs=[won, turns], weights=[1.0, 0.0]),
        max_turns=8,
        **kwargs,
    )
