"""Loading a :class:`RunConfig`: YAML files, then dotted command-line overrides, then validation.

Errors are collected into one :class:`ConfigError` whose lines each name the full dotted key, the
bad value and what is allowed, e.g.::

    algo.clip_high = -0.1: Input should be greater than or equal to 0 (allowed: >= 0, <= 10)
    algo.clip_hihg = 0.3: unknown key; did you mean algo.clip_high?
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types as at
import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from srt_agent.config.run import RunConfig
from srt_agent.errors import SrtAgentError

PathLike = str | Path


class ConfigError(SrtAgentError, ValueError):
    """A run config could not be read or is invalid.

    Attributes:
        problems: One line per problem, each starting with the dotted key it is about.
    """

    def __init__(self, problems: Sequence[str], source: str = "") -> None:
        self.problems = list(problems)
        where = f" ({source})" if source else ""
        super().__init__(f"invalid run config{where}:\n" + "\n".join(f"  {p}" for p in self.problems))


def load_config(
    paths: PathLike | Sequence[PathLike] | None = None, overrides: Sequence[str] = ()
) -> RunConfig:
    """Read YAML files (later ones win, merged key by key), apply overrides, validate.

    Args:
        paths: A YAML file, several, or ``None`` for the defaults.
        overrides: ``"dotted.key=value"`` strings; values are parsed as YAML scalars (or flow
            lists/maps), e.g. ``trainer.steps=30``, ``spec.enabled=false``, ``optim.betas=[0.9,0.95]``.
            A single string is one override.

    Returns:
        The validated config.

    Raises:
        ConfigError: A file is missing or not a YAML mapping, an override is malformed, or
            validation failed (every problem listed).
    """
    files = [] if paths is None else [paths] if isinstance(paths, str | Path) else list(paths)
    overrides = [overrides] if isinstance(overrides, str) else list(overrides)  # one, not its characters
    data: dict[str, Any] = {}
    for path in files:
        data = merge(data, read_yaml(path))
    data = apply_overrides(data, overrides)
    source = ", ".join([*(str(p) for p in files), *(f"override {o}" for o in overrides)])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe_errors(err), source) from None


def read_yaml(path: PathLike) -> dict[str, Any]:
    """A YAML file's top-level mapping (an empty file is ``{}``).

    Raises:
        ConfigError: The file is missing, is not valid YAML, or is not a mapping.
    """
    path = Path(path)
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"]) from None
    except yaml.YAMLError as err:
        raise ConfigError([f"{path}: not valid YAML: {err}"]) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            [f"{path}: the top level must be a mapping of sections, got {type(loaded).__name__}"]
        )
    return loaded


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``update``, recursively for nested mappings (a non-mapping replaces)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``"a.b.c=value"`` into ``(["a", "b", "c"], parsed value)``.

    Raises:
        ConfigError: No ``=``, an empty key part, or a value that is not valid YAML.
    """
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError([f"override {text!r}: expected dotted.key=value, e.g. trainer.steps=30"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError([f"override {text!r}: the value is not valid YAML: {err}"]) from None
    return parts, value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``data`` with each ``dotted.key=value`` override set (missing sections are created).

    Raises:
        ConfigError: An override is malformed or descends into a value that is not a section.
    """
    out = merge({}, data)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError([f"override {text!r}: {where} is a value ({child!r}), not a section"])
            node[part] = child = dict(child)  # never mutate the caller's nested dicts
            node = child
        node[parts[-1]] = value
    return out


# -- error messages ---------------------------------------------------------------------------


def describe_errors(err: ValidationError) -> list[str]:
    """One line per pydantic error: dotted key, bad value, message and what is allowed."""
    lines: list[str] = []
    for error in err.errors(include_url=False):
        lines.extend(_describe(error))
    return lines


def _describe(error: ErrorDetails) -> list[str]:
    loc = [str(part) for part in error["loc"]]
    dotted = ".".join(loc)
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return [f"{dotted} = {_short(error['input'])}: unknown key; {_suggest(loc)}"]
    if not loc:  # a check across sections: its message names its keys
        return msg.splitlines()
    info = _field_at(loc)
    allowed = _allowed(info) if info is not None else ""
    if error["type"] == "literal_error" and allowed:
        msg = f"must be one of {allowed}"
    elif allowed:
        msg = f"{msg} (allowed: {allowed})"
    if error["type"] == "missing":
        return [f"{dotted}: required, but not given" + (f" (allowed: {allowed})" if allowed else "")]
    return [f"{dotted} = {_short(error['input'])}: {line}" for line in msg.splitlines()]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        for arg in get_args(annotation):
            model = _model_of(arg)
            if model is not None:
                return model
    return None


def _section_at(loc: Sequence[str]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = RunConfig
    for part in loc:
        if model is None or part not in model.model_fields:
            return None
        model = _model_of(model.model_fields[part].annotation)
    return model


def _field_at(loc: Sequence[str]) -> FieldInfo | None:
    parent = _section_at(loc[:-1])
    return parent.model_fields.get(loc[-1]) if parent is not None else None


def _dotted_fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, info in model.model_fields.items():
        yield prefix + name
        sub = _model_of(info.annotation)
        if sub is not None:
            yield from _dotted_fields(sub, f"{prefix}{name}.")


def _suggest(loc: Sequence[str]) -> str:
    section = _section_at(loc[:-1])
    prefix = "".join(f"{p}." for p in loc[:-1])
    if section is None:
        return "this section takes no keys"
    close = difflib.get_close_matches(loc[-1], list(section.model_fields), n=1, cutoff=0.6)
    if close:
        return f"did you mean {prefix}{close[0]}?"
    # The key may belong to another section (trainer.lr -> optim.lr).
    everywhere = [f for f in _dotted_fields(RunConfig) if f.rsplit(".", 1)[-1] == loc[-1]]
    if everywhere:
        return f"did you mean {' or '.join(everywhere)}?"
    return f"valid keys{' of ' + prefix[:-1] if prefix else ''}: {', '.join(section.model_fields)}"


def _allowed(info: FieldInfo) -> str:
    choices = _literal_choices(info.annotation)
    if choices:
        return ", ".join(str(c) for c in choices)
    bounds = []
    for meta in info.metadata:
        for kind, symbol in ((at.Ge, ">="), (at.Gt, ">"), (at.Le, "<="), (at.Lt, "<")):
            if isinstance(meta, kind):
                bounds.append(f"{symbol} {getattr(meta, kind.__name__.lower())}")
    if bounds and type(None) in get_args(info.annotation):
        bounds.append("or null")
    return ", ".join(bounds)


def _literal_choices(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    for arg in get_args(annotation):  # Optional[Literal[...]] and tuple[Literal[...], ...]
        choices = _literal_choices(arg)
        if choices:
            return choices
    return ()
