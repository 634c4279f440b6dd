"""srt-agent's exceptions, and what user code (an env, a tool) may raise and still fail only its own episode.

The base of every exception srt-agent raises on purpose is :class:`SrtAgentError` (as
``gymnasium.error.Error`` is Gymnasium's).

Catch :class:`SrtAgentError` to handle any of them, or a precise subclass. Each subclass also derives
from the built-in exception that describes its kind (``ValueError`` for a bad value, ``RuntimeError``
for a failed run, ``FileExistsError``, ...), so code that caught those before still does. The
subclasses live beside the code that raises them:

* configuration and input: ``srt_agent.config.ConfigError``, ``srt_agent.env.EnvConfigError``,
  ``srt_agent.env.UnknownEnvError``, ``srt_agent.output.paths.OutputPathError``,
  ``srt_agent.tool.ToolArgumentsError``, ``srt_agent.contracts.generation.PromptTooLongError``,
  ``srt_agent.chat.template.TemplateContinuityError``;
* files: ``srt_agent.engine.hf_checkpoint.CheckpointError``, ``srt_agent.tree_cache.CacheFileError``,
  ``srt_agent.rollout.trace.TraceFormatError``, ``srt_agent.recipe.build.BuildDirError``;
* runs: ``srt_agent.train.trainer.TrainError``, ``srt_agent.evaluation.runner.ModelLoadError``,
  ``srt_agent.rollout.episode.EnvContractError``, ``srt_agent.tree_cache.CacheIntegrityError``;
* serving: ``srt_agent.serving.client.EngineConnectionError``, ``srt_agent.serving.wire.WireError``;
* the built-in tools and envs: ``CalculatorError``, ``SearchError``, ``FetchRefused``,
  ``FetchFailed`` (``srt_agent.tools``), ``RetailError`` (``srt_agent.envs.retail``).

``tests/test_errors.py`` fails when a new public exception does not derive from the base.
"""

from __future__ import annotations

__all__ = ["FAULTS", "SrtAgentError", "describe_fault"]


class SrtAgentError(Exception):
    """Base class of srt-agent's exceptions."""


FAULTS: tuple[type[BaseException], ...] = (Exception, SystemExit, KeyboardInterrupt)
"""Caught around env and tool code. ``SystemExit`` and ``KeyboardInterrupt`` raised by that code are
its failures, not the process's: a real Ctrl-C reaches a rollout as the cancellation of its tasks,
which is never caught."""


def describe_fault(exc: BaseException, *, first_line: bool = False) -> str:
    """``"<Type>: <message>"`` of an exception, even one whose ``__str__`` raises.

    Args:
        exc: The exception.
        first_line: Keep only the message's first line (the rest goes to the log).
    """
    try:
        text = str(exc)
    except FAULTS:
        text = "<the exception's message could not be printed>"
    if first_line:
        text = text.strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
