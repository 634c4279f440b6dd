"""The embedded default model: a small tokenizer and Llama built from the envs' oracle demonstrations.

``build_model(out_dir)`` trains and saves it (HF format); ``ensure_model(out_dir)`` builds only when
the directory holds no build yet. ``srt-agent eval`` measures a built model's success rate.
"""

from srt_agent.recipe.build import (
    BuildConfig,
    BuildDirError,
    BuildReport,
    build_model,
    ensure_model,
    is_model_dir,
)

__all__ = [
    "BuildConfig",
    "BuildDirError",
    "BuildReport",
    "build_model",
    "ensure_model",
    "is_model_dir",
]
