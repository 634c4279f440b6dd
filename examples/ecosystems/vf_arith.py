"""A verifiers ``SingleTurnEnv``, an example: sums answered in ``<answer>`` tags.

Written against verifiers' own API as a published environment would be (``load_environment``),
with its data built in code so it runs offline.
"""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


def load_environment(n: int = 20, **kwargs: Any) -> Any:
    """Single-turn sums ``a + b``; reward 1 for the exact sum, plus 0.2 for the answer format."""
    parser = vf.XMLParser(fields=["answer"], answer_field="answer")

    def exact(completion: Any, answer: str, **_: Any) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rows = [
        {"question": f"What is {a} + {b}? Reply with <answer>N</answer>.", "answer": str(a + b)}
        for a, b in ((i * 7 % 50, i * 13 % 40) for i in range(n))
    ]
    rubric = vf.Rubric(funcs=[exact, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        system_prompt="You add numbers.",
        parser=parser,
        rubric=rubric,
        **kwargs,
    )
