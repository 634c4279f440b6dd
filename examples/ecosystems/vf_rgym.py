"""verifiers' own ``ReasoningGymEnv`` (shipped with verifiers) over reasoning-gym's basic_arithmetic."""

from __future__ import annotations

from typing import Any

import verifiers as vf


def load_environment(**kwargs: Any) -> Any:
    """``vf.ReasoningGymEnv(gym="basic_arithmetic")``: reward is reasoning-gym's score of the answer."""
    return vf.ReasoningGymEnv(
        gym="basic_arithmetic", num_train_examples=50, num_eval_examples=10, seed=0, **kwargs
    )
