"""Loading a :class:`RunConfig`: YAML files, then dotted command-line overrides, then validation.

Errors are collected into one :class:`ConfigError` whose lines each name the full dotted key, the
bad value and what is allowed, e.g.::

    algo.clip_high = -0.1: Input should be greater than or equal to 0 (allowed: >= 0, <= 10)
    algo.clip_hihg = 0.3: unknown key; did you mean algo.clip_high?
    trainer.steps = True: must be an integer (got bool)

Types are strict: an integer field takes only an integer (not ``true``, ``"2"`` or ``2.0``), a
boolean only ``true``/``false``, a string only a string; a number field takes an integer or a
float. YAML's own forms of the other types are read as usual: a string for a path, a list for a
tuple. ``1e-4`` is a float (YAML 1.2; YAML 1.1 would read a string).

Every value a user gave is echoed through :func:`srt_agent.errors.shown` (bounded, whatever its
size), and YAML whose aliases expand past :data:`MAX_YAML_VALUES` values (an alias bomb) is
refused before anything walks it.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from srt_agent.config.run import RunConfig
from srt_agent.errors import SrtAgentError, shown

PathLike = str | Path

MAX_YAML_VALUES = 100_000
"""Most values a YAML document's aliases may add (each use of an alias counts the whole value it
names): a few hundred bytes of nested aliases would otherwise expand to billions of values."""

MAX_YAML_DEPTH = 100
"""Most levels of nesting in a YAML document (a run config has a few)."""

MAX_YAML_ALIAS_CHARS = 10_000_000
"""Most characters of strings a YAML document's aliases may add (a long string named many times)."""


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
    return validate_run_config(data, describe_source(files, overrides))


def describe_source(paths: Sequence[PathLike], overrides: Sequence[str]) -> str:
    """``"a.yaml, override trainer.steps=3"``: where a config came from (long overrides cut short)."""
    return ", ".join([*(str(p) for p in paths), *(f"override {_clipped(o)}" for o in overrides)])


def validate_run_config(data: Mapping[str, Any], source: str = "") -> RunConfig:
    """Validate a run config's mapping (as YAML reads it) with strict types.

    Args:
        data: The sections, as :func:`read_yaml` and :func:`apply_overrides` give them.
        source: Where they came from, for the error message.

    Raises:
        ConfigError: Validation failed (every problem listed).
    """
    try:
        return RunConfig.model_validate(_typed(RunConfig, dict(data)), strict=True)
    except ValidationError as err:
        raise ConfigError(describe_errors(err, data), source) from None


# -- reading YAML -----------------------------------------------------------------------------


class _TooManyValues(yaml.YAMLError):
    """A document too costly to read: its aliases loop or expand too far, or it nests too deep."""


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that reads ``1e-4`` as a float and refuses alias bombs.

    The check runs on the composed node graph, before any Python value is built: an alias is
    the same node as its anchor, so each node's expanded size is computed once.
    """

    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        # PyYAML composes recursively, and slowly near Python's recursion limit: stop well before.
        if self.depth >= MAX_YAML_DEPTH:
            raise _TooManyValues(f"the YAML is nested more than {MAX_YAML_DEPTH} levels deep")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node, MAX_YAML_VALUES)
        return node


# YAML 1.1 (PyYAML) needs a dot and a signed exponent: 1e-4 and 1.0e5 would be strings.
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _check_expansion(root: yaml.Node, limit: int) -> None:
    """Raise :class:`_TooManyValues` if aliases form a loop or expand too far.

    Too far: more than ``limit`` values, or more than :data:`MAX_YAML_ALIAS_CHARS` characters (one
    long string named many times), beyond those written out.
    """
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, characters) it expands to
    written = [0, 0]  # the values and characters written out (each node once)
    path: set[int] = set()  # the nodes being expanded (a child among them is a loop)
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            chars = len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            written[0], written[1] = written[0] + 1, written[1] + chars
            values = 1
            for child in _children(node):
                values, chars = values + sizes[id(child)][0], chars + sizes[id(child)][1]
            sizes[id(node)] = values, chars
            path.discard(id(node))
            continue
        if id(node) in sizes:
            continue
        if id(node) in path:
            raise _TooManyValues(
                "a YAML alias is used inside the value it names (a loop); write the values out"
            )
        path.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node))
    values, chars = sizes[id(root)]  # a written-out document costs what it weighs: count what aliases add
    if values - written[0] > limit:
        raise _TooManyValues(
            f"YAML aliases expand to more than {limit} values (an alias bomb?); write the values out"
        )
    if chars - written[1] > MAX_YAML_ALIAS_CHARS:
        raise _TooManyValues(
            f"YAML aliases expand to more than {MAX_YAML_ALIAS_CHARS} characters of strings (an alias "
            "bomb?); write the values out"
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    return []


def _load_yaml(text: str) -> Any:
    """One YAML document, as :class:`_ConfigLoader` reads it.

    Raises:
        yaml.YAMLError: Not valid YAML, or too many values (:class:`_TooManyValues`).
    """
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # a SafeLoader
    except RecursionError:
        raise _TooManyValues(f"the YAML is nested more than {MAX_YAML_DEPTH} levels deep") from None


def read_yaml(path: PathLike) -> dict[str, Any]:
    """A YAML file's top-level mapping (an empty file is ``{}``).

    Raises:
        ConfigError: The file is missing, is not valid YAML, or is not a mapping.
    """
    path = Path(path)
    try:
        loaded = _load_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"]) from None
    except _TooManyValues as err:
        raise ConfigError([f"{path}: {err}"]) from None
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
        raise ConfigError([f"override {shown(text)}: expected dotted.key=value, e.g. trainer.steps=30"])
    try:
        value = _load_yaml(raw) if raw.strip() else None
    except _TooManyValues as err:
        raise ConfigError([f"override {shown(text)}: {err}"]) from None
    except yaml.YAMLError as err:
        raise ConfigError([f"override {shown(text)}: the value is not valid YAML: {err}"]) from None
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
                raise ConfigError(
                    [f"override {shown(text)}: {where} is a value ({shown(child)}), not a section"]
                )
            node[part] = child = dict(child)  # never mutate the caller's nested dicts
            node = child
        node[parts[-1]] = value
    return out


# -- error messages ---------------------------------------------------------------------------


def describe_errors(err: ValidationError, data: Mapping[str, Any] | None = None) -> list[str]:
    """One line per pydantic error: dotted key, bad value, message and what is allowed.

    Args:
        err: The error of validating ``data``.
        data: The values as given (before :func:`validate_run_config` made YAML's lists tuples and
            its strings paths): a bad value is echoed as the user wrote it.
    """
    lines: list[str] = []
    for error in err.errors(include_url=False):
        if data is not None:
            error["input"] = _given(data, error["loc"], error["input"])
        lines.extend(_describe(error))
    return lines


def _given(data: Mapping[str, Any], loc: Sequence[int | str], fallback: Any) -> Any:
    """The value at ``loc`` in ``data`` as given, or ``fallback`` where ``data`` has none there."""
    node: Any = data
    for part in loc:
        if isinstance(node, Mapping):
            found = part in node
        else:
            found = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if not found:
            return fallback
        node = node[part]
    return node


def _describe(error: ErrorDetails) -> list[str]:
    loc = [str(part) for part in error["loc"]]
    dotted = ".".join(loc)
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return [f"{dotted} = {shown(error['input'])}: unknown key; {_suggest(loc)}"]
    if not loc:  # a check across sections: its message names its keys
        return [_clipped(line, _MAX_LINE) for line in msg.splitlines()]
    info = _field_at(loc)
    if error["type"] in _EXPECTED:
        return [f"{dotted} = {shown(error['input'])}: {_type_message(error, info)}"]
    allowed = _allowed(info) if info is not None else ""
    if error["type"] == "literal_error" and allowed:
        msg = f"must be one of {allowed}"
    elif allowed:
        msg = f"{msg} (allowed: {allowed})"
    if error["type"] == "missing":
        return [f"{dotted}: required, but not given" + (f" (allowed: {allowed})" if allowed else "")]
    return [f"{dotted} = {shown(error['input'])}: {_clipped(line, _MAX_LINE)}" for line in msg.splitlines()]


_MAX_LINE = 500
"""Longest message line kept from a validator (its message may quote a user's value)."""

_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean (true or false)",
    "string_type": "a string",
    "tuple_type": "a list",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "is_instance_of": "",  # named by its class below
}
"""What a strict type error's field takes, by pydantic's error type."""


def _type_message(error: ErrorDetails, info: FieldInfo | None) -> str:
    """``must be an integer (got bool)``: what the field takes, and what it was given."""
    expected = _EXPECTED[error["type"]]
    if error["type"] == "is_instance_of":
        cls = str((error.get("ctx") or {}).get("class", "value"))
        expected = "a path" if cls.endswith("Path") else f"a {cls}"
    if info is not None and type(None) in get_args(info.annotation):
        expected += " or null"
    given = error["input"]
    got = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "mapping"}.get(
        type(given), "null" if given is None else type(given).__name__
    )
    return f"must be {expected} (got {got})"


def _clipped(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (for text quoted as it is, not as a ``repr``)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _typed(annotation: Any, value: Any) -> Any:
    """``value`` (as YAML reads it) in the types strict validation takes where YAML lacks them.

    A string for a path field becomes a ``Path``, a list for a tuple field a tuple.

    Follows nested sections, tuples, lists and mappings by the field annotations; everything else
    (and anything that does not fit the annotation) is left for validation to judge. Costs one
    pass over the typed fields only: values of ``Any`` fields (``env.options``) are not walked.
    """
    if annotation is Any:
        return value
    origin = get_origin(annotation)
    if origin is Annotated:
        return _typed(get_args(annotation)[0], value)
    if origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            converted = _typed(arg, value)
            if converted is not value:
                return converted
        return value
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(value, dict):
        fields = annotation.model_fields
        return {k: _typed(fields[k].annotation, v) if k in fields else v for k, v in value.items()}
    if isinstance(annotation, type) and issubclass(annotation, PurePath) and isinstance(value, str):
        return annotation(value)
    args = get_args(annotation)
    if origin is tuple and isinstance(value, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(args[0], item) for item in value)
        if len(args) == len(value):
            return tuple(_typed(arg, item) for arg, item in zip(args, value, strict=True))
        return tuple(value)  # validation reports the length
    if origin is list and isinstance(value, list) and args:
        return [_typed(args[0], item) for item in value]
    if origin in (dict, Mapping) and isinstance(value, dict) and len(args) == 2 and args[1] is not Any:
        return {k: _typed(args[1], v) for k, v in value.items()}
    return value


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
