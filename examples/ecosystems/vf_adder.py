"""A verifiers ``ToolEnv``, an example: add with a tool, then answer."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def load_environment(**kwargs: Any) -> Any:
    """Sums to compute with the ``add`` tool; reward 1 when the final reply contains the sum."""

    def correct(completion: Any, answer: str, parser: Any, **_: Any) -> float:
        return 1.0 if answer in (parser.parse_answer(completion) or "") else 0.0

    rows = [
        {"question": f"Use the add tool to compute {a}+{b}.", "answer": str(a + b)}
        for a, b in ((40, 2), (17, 25), (300, 33))
    ]
    return vf.ToolEnv(
        dataset=Dataset.from_list(rows), tools=[add], rubric=vf.Rubric(funcs=[correct]), max_turns=4, **kwargs
    )
