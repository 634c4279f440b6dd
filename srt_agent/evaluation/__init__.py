"""Evaluation: success rate and τ-bench pass^k of a model on any registered env.

:func:`run_eval` plays ``episodes`` tasks ``k`` times each through the rollout scheduler and
returns an :class:`EvalReport` (a rich table and a flat JSON object); :func:`eval_command` is
what ``srt-agent eval`` runs.
"""

from srt_agent.evaluation.report import EVAL_SCHEMA, EvalReport, pass_hat_k, reason_category, summarize
from srt_agent.evaluation.runner import (
    EVAL_SEED_END,
    ModelLoadError,
    eval_command,
    eval_episodes,
    run_eval,
)

__all__ = [
    "EVAL_SCHEMA",
    "EVAL_SEED_END",
    "EvalReport",
    "ModelLoadError",
    "eval_command",
    "eval_episodes",
    "pass_hat_k",
    "reason_category",
    "run_eval",
    "summarize",
]
