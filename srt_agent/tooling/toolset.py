"""Executing tool calls safely: validation, timeouts, and errors returned to the model.

A rollout must never die because a tool misbehaved. Every failure mode (malformed call, unknown
tool, bad arguments, exception, timeout) becomes a :class:`ToolResult` whose content explains the
problem to the model, and the episode continues.

Calls within one turn run in order, one after another: tools may share state (a database that one
call changes and the next reads), and the model wrote them in an order. Concurrency in rollouts
comes from running many episodes at once, not from reordering one turn's calls.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from srt_agent.chat.messages import Message, cap_text, tool_result
from srt_agent.errors import FAULTS, describe_fault, shown
from srt_agent.isolation import CallTimeout, RemoteError, await_in_thread, run_in_process, run_in_thread
from srt_agent.tooling.definition import Tool, ToolArgumentsError
from srt_agent.tooling.parser import MalformedCall, ParsedTurn, ToolCall

_MAX_NAME_CHARS = 64
"""Longest tool name echoed back (valid names are at most 64 characters)."""
ERROR_PREFIX = "Error ("
"""How a failed call's ``tool`` message begins: ``Error (<kind>): <reason>``."""

ErrorKind = Literal[
    "malformed_call", "unknown_tool", "invalid_arguments", "error", "timeout", "too_many_calls"
]


class ToolResult(BaseModel):
    """The outcome of one call.

    Attributes:
        call_id: Id of the call this answers.
        name: Tool name as called (``"invalid"`` for a block that could not be parsed).
        content: Text shown to the model: the output, or ``"Error (<kind>): <reason>"``.
        error: ``None`` on success, else the kind of failure.
        elapsed_s: Wall-clock seconds the call took.
    """

    model_config = ConfigDict(frozen=True)

    call_id: str
    name: str
    content: str
    error: ErrorKind | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the tool ran and returned normally."""
        return self.error is None

    def to_message(self) -> Message:
        """The ``tool`` message that carries this result back to the model."""
        return tool_result(self.content, call_id=self.call_id, name=self.name)


def is_error_message(message: Message) -> bool:
    """Whether ``message`` is a tool's answer to a call that failed (see :class:`ToolResult`)."""
    return message.role == "tool" and message.content.startswith(ERROR_PREFIX)


def _run_coroutine(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run an async tool to completion on an event loop of its own (in the calling thread).

    Async tools run in their own thread and loop, never on the rollout's loop: a tool that blocks
    (``time.sleep``) or swallows its cancellation would otherwise stall every episode, and no
    timeout could take the loop back from it.
    """
    return asyncio.run(fn(**kwargs))


def _resolve(module: str, qualname: str) -> Callable[..., Any]:
    """The function ``module.qualname`` names; for a ``@tool``-decorated name, the function it wraps."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj.fn if isinstance(obj, Tool) else obj


def _imports(t: Tool) -> tuple[str, ...]:
    """What a worker imports before a process-isolated call's deadline starts."""
    return (__name__, t.fn.__module__)


def _call_in_child(module: str, qualname: str, kwargs: dict[str, Any], is_async: bool, max_chars: int) -> str:
    """A process-isolated call, in the worker: run the tool, return its output rendered.

    Only a bounded string crosses back. The function travels by name: the module attribute of a
    ``@tool`` function is the :class:`Tool`, which does not pickle (its argument model is built at
    run time).
    """
    fn = _resolve(module, qualname)
    value = _run_coroutine(fn, kwargs) if is_async else fn(**kwargs)
    return render_output(value, max_chars)


def _bounded_json(value: Any, max_chars: int) -> str:
    """JSON of ``value``, encoded only as far as ``max_chars`` needs.

    A 10-million-item list costs the same as a short one; the note then says "over", not how much.
    """
    chunks, size = [], 0
    for chunk in json.JSONEncoder(default=str, ensure_ascii=False).iterencode(value):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_chars:
            return (
                f"{''.join(chunks)[:max_chars]}\n[... truncated: the output is over {max_chars} characters]"
            )
    return "".join(chunks)


def render_output(value: Any, max_chars: int) -> str:
    """Turn a tool's return value into text for the model, truncated to ``max_chars``."""
    if isinstance(value, str):
        return cap_text(str.__str__(value), max_chars)  # a str subclass's own __str__ is not trusted
    if value is None:
        return "(no output)"
    if isinstance(value, BaseModel):
        return cap_text(value.model_dump_json(), max_chars)
    try:
        return _bounded_json(value, max_chars)
    except (TypeError, ValueError, RecursionError):
        return cap_text(shown(value, max_chars), max_chars)


class ToolSet:
    """A named collection of tools that executes parsed calls and never raises on bad calls.

    Args:
        tools: The tools; names must be unique.
        max_output_chars: Tool output longer than this is truncated (with a note) before the model
            sees it, so one verbose tool cannot blow the context.
        max_calls_per_turn: Calls of one turn that run; later ones get a ``too_many_calls`` error
            without running, so one turn cannot occupy the env for calls x timeout seconds.
    """

    def __init__(
        self, tools: Iterable[Tool] = (), *, max_output_chars: int = 4000, max_calls_per_turn: int = 16
    ):
        self._tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self._tools:
                raise ValueError(f"duplicate tool name {t.name!r}")
            self._tools[t.name] = t
        if max_output_chars < 16:
            raise ValueError(f"max_output_chars must be >= 16, got {max_output_chars}")
        if max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn must be >= 1, got {max_calls_per_turn}")
        self.max_output_chars = max_output_chars
        self.max_calls_per_turn = max_calls_per_turn

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        """Tool names in registration order."""
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """Fresh copies of every tool's JSON schema (callers may mutate them)."""
        return [copy.deepcopy(t.schema()) for t in self._tools.values()]

    def _error(self, call_id: str, name: str, kind: ErrorKind, reason: str, t0: float) -> ToolResult:
        # Errors are capped like outputs: their reasons quote the model's input (names, arguments).
        return ToolResult(
            call_id=call_id,
            name=name[:_MAX_NAME_CHARS],
            content=cap_text(f"{ERROR_PREFIX}{kind}): {reason}", self.max_output_chars),
            error=kind,
            elapsed_s=time.perf_counter() - t0,
        )

    def _prepare(self, call: ToolCall, t0: float) -> tuple[Tool, dict[str, Any]] | ToolResult:
        found = self._tools.get(call.name)
        if found is None:
            available = ", ".join(self.names) or "none (this environment has no tools)"
            return self._error(
                call.id,
                call.name,
                "unknown_tool",
                f"no tool named {shown(call.name, _MAX_NAME_CHARS)}; available: {available}",
                t0,
            )
        try:
            return found, found.validate(call.arguments)
        except ToolArgumentsError as exc:
            return self._error(call.id, call.name, "invalid_arguments", str(exc), t0)

    def _finish(self, call: ToolCall, value: Any, t0: float) -> ToolResult:
        try:
            content = render_output(value, self.max_output_chars)
        except FAULTS as exc:  # a result whose __str__ (or JSON hook) raises
            what = type(value).__name__
            reason = f"the tool returned a {what} that could not be shown as text ({describe_fault(exc)})"
            return self._error(call.id, call.name, "error", reason, t0)
        elapsed = time.perf_counter() - t0
        return ToolResult(call_id=call.id, name=call.name, content=content, elapsed_s=elapsed)

    def _failure(self, call: ToolCall, t: Tool, exc: BaseException, t0: float) -> ToolResult:
        if isinstance(exc, CallTimeout):
            return self._error(
                call.id, call.name, "timeout", f"tool {t.name!r} did not finish within {t.timeout:g} s", t0
            )
        if isinstance(exc, RemoteError):  # already "<Type>: <message>" of the child's error
            return self._error(call.id, call.name, "error", str(exc), t0)
        return self._error(call.id, call.name, "error", describe_fault(exc), t0)

    def call(self, call: ToolCall) -> ToolResult:
        """Execute one call synchronously (with its tool's timeout)."""
        t0 = time.perf_counter()
        prepared = self._prepare(call, t0)
        if isinstance(prepared, ToolResult):
            return prepared
        t, kwargs = prepared
        try:
            if t.isolation == "process":
                value = run_in_process(self._child_call(t, kwargs), t.timeout, imports=_imports(t))
            else:
                value = run_in_thread(self._thunk(t, kwargs), t.timeout, name="srt-tool")
        except FAULTS as exc:  # every tool failure becomes a message
            return self._failure(call, t, exc, t0)
        return self._finish(call, value, t0)

    async def acall(self, call: ToolCall) -> ToolResult:
        """Execute one call without blocking the event loop (with its tool's timeout)."""
        t0 = time.perf_counter()
        prepared = self._prepare(call, t0)
        if isinstance(prepared, ToolResult):
            return prepared
        t, kwargs = prepared
        try:
            if t.isolation == "process":  # the wait is bounded (the child is killed): a plain thread
                call_in_child = functools.partial(run_in_process, imports=_imports(t))
                value = await asyncio.to_thread(call_in_child, self._child_call(t, kwargs), t.timeout)
            else:
                value = await await_in_thread(self._thunk(t, kwargs), t.timeout, name="srt-tool")
        except FAULTS as exc:  # every tool failure becomes a message
            return self._failure(call, t, exc, t0)
        return self._finish(call, value, t0)

    def _child_call(self, t: Tool, kwargs: dict[str, Any]) -> Callable[[], str]:
        """The call to run in a child process (see :func:`_call_in_child`)."""
        fn = t.fn
        return functools.partial(
            _call_in_child, fn.__module__, fn.__qualname__, kwargs, t.is_async, self.max_output_chars
        )

    @staticmethod
    def _thunk(t: Tool, kwargs: dict[str, Any]) -> Callable[[], Any]:
        """The call to run in a tool thread (an async tool gets an event loop of its own there)."""
        if t.is_async:
            return functools.partial(_run_coroutine, t.fn, kwargs)
        return functools.partial(t.fn, **kwargs)

    def _malformed(self, err: MalformedCall) -> ToolResult:
        return self._error(err.id, "invalid", "malformed_call", err.reason, time.perf_counter())

    def _over_cap(self, call: ToolCall | MalformedCall, n: int) -> ToolResult:
        name = call.name if isinstance(call, ToolCall) else "invalid"
        reason = (
            f"this turn made {n} tool calls and at most {self.max_calls_per_turn} run per turn, so this "
            "one did not run; make fewer calls per turn"
        )
        return self._error(call.id, name, "too_many_calls", reason, time.perf_counter())

    def _ordered(self, turn: ParsedTurn) -> list[ToolCall | MalformedCall]:
        def index(c: ToolCall | MalformedCall) -> int:
            return int(c.id.rsplit("_", 1)[-1])

        return sorted([*turn.calls, *turn.errors], key=index)

    def execute(self, turn: ParsedTurn) -> list[ToolResult]:
        """Execute every call of a turn in order; malformed blocks yield error results in place.

        Calls past :attr:`max_calls_per_turn` do not run (each gets a ``too_many_calls`` error).
        """
        calls = self._ordered(turn)
        return [
            self._over_cap(c, len(calls))
            if i >= self.max_calls_per_turn
            else self.call(c)
            if isinstance(c, ToolCall)
            else self._malformed(c)
            for i, c in enumerate(calls)
        ]

    async def aexecute(self, turn: ParsedTurn) -> list[ToolResult]:
        """Async :meth:`execute`."""
        calls = self._ordered(turn)
        out = []
        for i, c in enumerate(calls):
            if i >= self.max_calls_per_turn:
                out.append(self._over_cap(c, len(calls)))
            else:
                out.append(await self.acall(c) if isinstance(c, ToolCall) else self._malformed(c))
        return out
