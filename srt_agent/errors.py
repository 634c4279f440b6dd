"""The base of every exception srt-agent raises on purpose (as ``gymnasium.error.Error`` is Gymnasium's).

Catch :class:`SrtAgentError` to handle any of them, or a precise subclass. Each subclass also derives
from the built-in exception that describes its kind (``ValueError`` for a bad value, ``RuntimeError``
for a failed run, ``FileExistsError``, ...), so code that caught those before still does. The
subclasses live beside the code that raises them:

* configuration and input: ``srt_agent.config.ConfigError``, ``srt_agent.env.EnvConfigError``,
  ``srt_agent.registration.UnknownEnvError``, ``srt_agent.paths.OutputPathError``,
  ``srt_agent.tool.ToolArgumentsError``, ``srt_agent.contracts.generation.PromptTooLongError``,
  ``srt_agent.chat_format.TemplateContinuityError``;
* files: ``srt_agent.engine.checkpoint.CheckpointError``, ``srt_agent.tree_cache.CacheFileError``,
  ``srt_agent.rollout.trace.TraceFormatError``, ``srt_agent.model.build.BuildDirError``;
* runs: ``srt_agent.train.trainer.TrainError``, ``srt_agent.evaluation.runner.ModelLoadError``,
  ``srt_agent.rollout.episode.EnvContractError``, ``srt_agent.tree_cache.CacheIntegrityError``;
* serving: ``srt_agent.serving.client.EngineConnectionError``, ``srt_agent.serving.wire.WireError``;
* the built-in tools and envs: ``CalculatorError``, ``SearchError``, ``FetchRefused``,
  ``FetchFailed`` (``srt_agent.tools``), ``RetailError`` (``srt_agent.envs.retail``).

``tests/test_errors.py`` fails when a new public exception does not derive from the base.
"""

from __future__ import annotations

__all__ = ["SrtAgentError"]


class SrtAgentError(Exception):
    """Base class of srt-agent's exceptions."""
