"""Tools: typed Python functions the model can call.

``@tool`` reads a function's signature and Google-style docstring and builds a pydantic model of its
arguments. That model gives both the JSON schema shown to the model (OpenAI/Hermes function format)
and the validation applied to every call, so a schema can never drift from what the function accepts.
Executing calls (timeouts, error reports) is :mod:`srt_agent.tooling.toolset`'s job.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from srt_agent.errors import SrtAgentError, shown

Isolation = Literal["thread", "process"]
"""Where a call runs: a thread of its own (cheap; abandoned at the timeout), or a process of its own
(~10-30 ms a call; killed at the timeout, even inside native code)."""

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")


class ToolArgumentsError(SrtAgentError, ValueError):
    """A tool call's arguments do not match the tool's signature."""


@dataclass(frozen=True)
class Tool:
    """A callable tool with a validated argument model.

    Build one with :func:`tool`. Calling the object calls the function directly (no timeout);
    rollouts go through :class:`~srt_agent.tooling.toolset.ToolSet`, which adds timeouts and error capture.

    Attributes:
        name: The name the model uses in ``<tool_call>{"name": ...}``.
        description: What the tool does (first paragraph of the docstring by default).
        fn: The wrapped function, sync or ``async``.
        args_model: Pydantic model of the arguments (extra keys forbidden).
        timeout: Wall-clock seconds a call may take before it is abandoned.
        isolation: ``"thread"`` (default) or ``"process"``, for code that must not be trusted with a
            thread: CPU-bound or native work a thread cannot be stopped in. A process call passes the
            function by name, so it must be a module-level function.
    """

    name: str
    description: str
    fn: Callable[..., Any]
    args_model: type[BaseModel]
    timeout: float = 10.0
    isolation: Isolation = "thread"
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(
                f"invalid tool name {self.name!r}: use 1-64 letters, digits, '_' or '-', "
                "starting with a letter or '_'"
            )
        if not self.timeout > 0:
            raise ValueError(f"tool {self.name!r}: timeout must be > 0 seconds, got {self.timeout}")
        if self.isolation not in ("thread", "process"):
            raise ValueError(
                f"tool {self.name!r}: isolation must be 'thread' or 'process', got {self.isolation!r}"
            )
        where = f"{getattr(self.fn, '__module__', '')}.{getattr(self.fn, '__qualname__', '')}"
        if self.isolation == "process" and (where.startswith("__main__.") or "<" in where):
            raise ValueError(
                f"tool {self.name!r}: isolation='process' runs the function by its import path, and "
                f"{where!r} has none; define it at the top level of an importable module"
            )
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly (no validation, no timeout)."""
        return self.fn(*args, **kwargs)

    def schema(self) -> dict[str, Any]:
        """The tool's JSON schema in the OpenAI/Hermes ``{"type": "function", ...}`` shape (a fresh copy)."""
        # Envs announce their tools on every reset; pydantic's schema generation is ~0.5 ms a tool.
        return copy.deepcopy(self._schema())

    @functools.cache  # noqa: B019 - a tool lives as long as its toolset; the cache holds one dict
    def _schema(self) -> dict[str, Any]:
        params = self.args_model.model_json_schema()
        params.pop("title", None)
        for prop in params.get("properties", {}).values():
            prop.pop("title", None)
        params.setdefault("properties", {})
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Check call arguments against the signature.

        Args:
            arguments: The ``arguments`` object of a parsed call.

        Returns:
            Keyword arguments for the function, of the annotated types (validated strictly: JSON
            types must match; an integer is accepted for a float, an array for a tuple).

        Raises:
            ToolArgumentsError: With one line per problem, naming the argument and the expected type.
        """
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(f"arguments must be a JSON object, got {type(arguments).__name__}")
        # Strict JSON-mode validation: types as JSON has them, nothing coerced ("5", true and 5.0 are
        # not integers, "yes" is not a boolean); a JSON array still fills a tuple, an integer a float.
        try:
            text = json.dumps(arguments, allow_nan=False)
        except (ValueError, RecursionError) as exc:
            raise ToolArgumentsError(f"invalid arguments for '{self.name}': not plain JSON ({exc})") from None
        try:
            model = self.args_model.model_validate_json(text, strict=True)
        except ValidationError as exc:
            raise ToolArgumentsError(_describe_validation_error(self.name, exc)) from None
        return {k: getattr(model, k) for k in type(model).model_fields}


def _describe_validation_error(tool_name: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "arguments"
        if err["type"] == "extra_forbidden":
            problems.append(f"unexpected argument {shown(loc, 64)}")
        elif err["type"] == "missing":
            problems.append(f"missing required argument '{loc}'")
        else:
            problems.append(f"argument {shown(loc, 64)}: {err['msg']} (got {shown(err.get('input'))})")
    return f"invalid arguments for '{tool_name}': " + "; ".join(problems)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its summary and ``Args:`` descriptions."""
    doc = inspect.cleandoc(doc)
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    match = re.search(r"^Args:\s*\n((?:[ \t]+.*\n?|\n)+)", doc, flags=re.MULTILINE)
    if match:
        current = None
        for line in match.group(1).splitlines():
            m = re.match(r"^\s+(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
            if m and (current is None or len(line) - len(line.lstrip()) <= _indent_of(match.group(1))):
                current = m.group(1).lstrip("*")
                params[current] = m.group(2).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
    return summary, params


def _indent_of(block: str) -> int:
    first = next((ln for ln in block.splitlines() if ln.strip()), "")
    return len(first) - len(first.lstrip())


def _build_args_model(fn: Callable[..., Any], name: str, docs: dict[str, str]) -> type[BaseModel]:
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    fields: dict[str, Any] = {}
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args/**kwargs are not supported (parameter {pname!r})")
        if pname not in hints:
            raise TypeError(f"tool {name!r}: parameter {pname!r} needs a type annotation")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints[pname], Field(default, description=docs.get(pname)))
    model_name = "".join(p.capitalize() for p in re.split(r"[_\-]", name)) + "Args"
    model: type[BaseModel] = create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)
    return model


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = 10.0,
    isolation: Isolation = "thread",
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = 10.0,
    isolation: Isolation = "thread",
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function (sync or ``async``) into a :class:`Tool`.

    Every parameter needs a type annotation; the docstring's summary becomes the description and its
    ``Args:`` entries the parameter descriptions.

    Example:
        >>> @tool(timeout=2.0)
        ... def add(a: int, b: int) -> int:
        ...     '''Add two integers.
        ...
        ...     Args:
        ...         a: First addend.
        ...         b: Second addend.
        ...     '''
        ...     return a + b
        >>> add.schema()["function"]["parameters"]["required"]
        ['a', 'b']

    Args:
        fn: The function (when used as a bare ``@tool``).
        name: Tool name; the function's name by default.
        description: Description; the docstring's first paragraph by default.
        timeout: Seconds a call may run before it is abandoned with a timeout error.
        isolation: ``"process"`` runs each call in a process killed at the timeout (see :class:`Tool`).

    Returns:
        The tool, or a decorator producing it.

    Raises:
        TypeError: A parameter lacks an annotation or is ``*args``/``**kwargs``.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        tool_name = name or f.__name__
        summary, docs = _parse_docstring(f.__doc__ or "")
        desc = description or summary
        if not desc:
            raise TypeError(f"tool {tool_name!r} needs a docstring or description= to explain itself")
        return Tool(
            name=tool_name,
            description=desc,
            fn=f,
            args_model=_build_args_model(f, tool_name, docs),
            timeout=timeout,
            isolation=isolation,
        )

    return wrap(fn) if fn is not None else wrap
