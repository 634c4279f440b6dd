"""The embedded default model: a small tokenizer and Llama built from the envs' oracle demonstrations.

``build_model(out_dir)`` trains and saves it (HF format); ``ensure_model(out_dir)`` builds only when
the directory holds no build yet; ``quick_eval`` measures a model directory's success rate on an env.
"""

from srt_agent.recipe.build import (
    BuildConfig,
    BuildDirError,
    BuildReport,
    build_model,
    ensure_model,
    is_model_dir,
)
from srt_agent.recipe.evaluate import EvalResult, quick_eval

__all__ = [
    "BuildConfig",
    "BuildDirError",
    "BuildReport",
    "EvalResult",
    "build_model",
    "ensure_model",
    "is_model_dir",
    "quick_eval",
]
