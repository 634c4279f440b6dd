"""srt-agent's exceptions, and what user code (an env, a tool) may raise and still fail only its own episode.

The base of every exception srt-agent raises on purpose is :class:`SrtAgentError` (as
``gymnasium.error.Error`` is Gymnasium's).

Catch :class:`SrtAgentError` to handle any of them, or a precise subclass. Each subclass also derives
from the built-in exception that describes its kind (``ValueError`` for a bad value, ``RuntimeError``
for a failed run, ``FileExistsError``, ...), so code that caught those before still does. The
subclasses live beside the code that raises them:

* configuration and input: ``srt_agent.config.ConfigError``, ``srt_agent.env.EnvConfigError``,
  ``srt_agent.env.UnknownEnvError``, ``srt_agent.output.paths.OutputPathError``,
  ``srt_agent.tooling.ToolArgumentsError``, ``srt_agent.contracts.generation.PromptTooLongError``,
  ``srt_agent.chat.template.TemplateContinuityError``;
* files: ``srt_agent.engine.hf_checkpoint.CheckpointError``, ``srt_agent.tree_cache.CacheFileError``,
  ``srt_agent.rollout.trace.TraceFormatError``, ``srt_agent.recipe.build.BuildDirError``;
* runs: ``srt_agent.train.trainer.TrainError``, ``srt_agent.evaluation.runner.ModelLoadError``,
  ``srt_agent.rollout.episode.EnvContractError``, ``srt_agent.tree_cache.CacheIntegrityError``;
* serving: ``srt_agent.serving.client.EngineConnectionError``, ``srt_agent.serving.bodies.WireError``;
* the built-in tools and envs: ``CalculatorError``, ``SearchError``, ``FetchRefused``,
  ``FetchFailed`` (``srt_agent.tools``), ``RetailError`` (``srt_agent.envs.retail``).

``tests/test_errors.py`` fails when a new public exception does not derive from the base.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["FAULTS", "SrtAgentError", "describe_fault", "shown"]


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


class _BoundedRepr(reprlib.Repr):
    """``reprlib`` with small limits.

    It looks at a few items per container and a few levels, so rendering costs the same for a
    10-byte value and a 10 GB one (or a YAML alias bomb).
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = 6
        self.maxdeque = self.maxarray = 6
        self.maxstring = self.maxlong = self.maxother = limit

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            text = repr(x)  # a user object's own repr: shortened here, its cost is its own
        except FAULTS:
            return f"<{type(x).__name__}>"
        return text if len(text) <= self.maxother else text[: self.maxother - 3] + "..."


def shown(value: Any, limit: int = 80) -> str:
    """A short, safe rendering of a user value for an error message: at most ``limit`` characters.

    Every message that echoes a value a user (or a model, an env, a tool) gave goes through this, so
    no input makes an error message large or slow: containers are sampled, not walked, and a value
    whose ``repr`` raises is named by its type.
    """
    try:
        text = _BoundedRepr(limit).repr(value)
    except FAULTS:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
