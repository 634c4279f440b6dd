"""A custom multi-turn, tool-using env in ~30 lines: unit conversion with a lookup tool.

Run: python examples/custom_env.py
"""

from collections.abc import Sequence
from typing import Any

import srt_agent
from srt_agent import Message, MultiTurnEnv, ToolSet, Transition, tool
from srt_agent.chat.messages import format_transcript, system, user

RATES = {"kilometer": 1000.0, "mile": 1609.344, "yard": 0.9144}


@tool
def meters_per(unit: str) -> float:
    """How many meters one unit is.

    Args:
        unit: One of kilometer, mile, yard.
    """
    return RATES[unit]


class ConvertEnv(MultiTurnEnv):
    """Convert a distance to meters; answer with a bare number."""

    def build_tools(self) -> ToolSet:
        return ToolSet([meters_per])

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        self.unit = str(self.np_random.choice(list(RATES)))
        self.amount = int(self.np_random.integers(2, 50))
        prompt = f"How many meters are {self.amount} {self.unit}s? Reply with just the number."
        return f"convert-{self.amount}-{self.unit}", [system("Use tools when useful."), user(prompt)]

    def on_message(self, text: str) -> Transition:
        try:
            correct = abs(float(text.strip()) - self.amount * RATES[self.unit]) < 1e-6
        except ValueError:
            return Transition([user("Please reply with just a number.")])
        return Transition(reward=float(correct), terminated=True)


srt_agent.register_env("example/Convert-v0", ConvertEnv, max_turns=4)

if __name__ == "__main__":
    from srt_agent.env.testing import ScriptedPolicy, check_multiturn_env

    env = srt_agent.make("example/Convert-v0")
    check_multiturn_env(env)  # gymnasium's check_env plus the multi-turn contract
    obs, info = env.reset(seed=0)
    unit, amount = env.unwrapped.unit, env.unwrapped.amount  # type: ignore[attr-defined]
    policy = ScriptedPolicy(
        [
            f'<tool_call>{{"name": "meters_per", "arguments": {{"unit": "{unit}"}}}}</tool_call>',
            lambda history: str(amount * float(history[-1].content)),
        ]
    )
    result = srt_agent.run_episode(env, policy, seed=0)
    print(format_transcript(result.transcript))
    print(f"reward={result.total_reward} turns={result.turns}")
