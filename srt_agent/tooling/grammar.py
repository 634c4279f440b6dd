"""The grammar of a tool-call block: which characters may come next after ``<tool_call>``.

Constrained decoding of tool calls (as vLLM's and SGLang's structured outputs do for JSON) needs,
at every position inside a call, the set of characters that keep the text a prefix of a valid
call. :class:`ToolCallGrammar` is that automaton for the canonical form :func:`format_tool_call`
writes, over the tools an env announced::

    {"name": "<a tool's name>", "arguments": {"<key>": <value>, ...}}

* the name is one of the tools' names; each key is one of that tool's parameters, at most once,
  and the object closes only once every required parameter is there;
* values follow the parameter's JSON schema: ``string`` (with ``enum``), ``integer``, ``number``,
  ``boolean``, ``null``, ``array`` of those, and any JSON value where the schema says anything else;
* separators are exactly ``", "`` and ``": "`` (what the demonstrations use): a model never sees
  another spacing, and one spacing keeps the set of states small;
* strings hold no backslash and no control character (no escapes: a value the model copies from
  the conversation never needs one);
* with ``copy_strings``, a string value without an ``enum`` is one of the words or quoted strings
  of the conversation before the turn: ids, names, e-mails and zip codes are copied, never
  invented. The grammar a turn decodes under is then derived from that turn's prompt
  (:mod:`srt_agent.tooling.copying`).

States are immutable and hashable, so the engine can cache one vocabulary mask per state
(:mod:`srt_agent.engine.constraint`): a call visits a few dozen distinct states, the same ones in
every call of a tool, whatever the values' contents.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_INT_PREFIX = re.compile(r"-?(0|[1-9][0-9]*)?")
_INT_FULL = re.compile(r"-?(0|[1-9][0-9]*)")
_NUM_PREFIX = re.compile(r"-?((0|[1-9][0-9]*)(\.[0-9]*)?)?")
_NUM_FULL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


@dataclass(frozen=True)
class ValueSpec:
    """What one JSON value may be.

    Attributes:
        kind: ``string``, ``integer``, ``number``, ``boolean``, ``null``, ``array``, or ``any``.
        items: The items' spec of an ``array``.
        literals: The JSON texts a value may be, when it is one of a fixed set (``enum``,
            ``boolean``, ``null``); empty otherwise.
        copied: ``literals`` are a turn's copy candidates (:mod:`srt_agent.tooling.copying`),
            not the schema's: they change from turn to turn.
    """

    kind: str
    items: ValueSpec | None = None
    literals: tuple[str, ...] = ()
    copied: bool = False

    @property
    def copies(self) -> bool:
        """What this value may be depends on a turn's copy candidates (its own or its items')."""
        return self.copied or (self.items is not None and self.items.copies)

    @classmethod
    def from_schema(cls, schema: Mapping[str, Any]) -> ValueSpec:
        """The spec of a JSON schema (unknown or composite schemas allow any JSON value)."""
        if "enum" in schema and all(
            isinstance(v, str | int | float | bool) or v is None for v in schema["enum"]
        ):
            return cls("literal", literals=tuple(sorted({json.dumps(v) for v in schema["enum"]})))
        kind = schema.get("type")
        if kind == "boolean":
            return cls("literal", literals=("false", "true"))
        if kind == "null":
            return cls("literal", literals=("null",))
        if kind in ("string", "integer", "number"):
            return cls(str(kind))
        if kind == "array":
            items = schema.get("items")
            return cls("array", items=cls.from_schema(items) if isinstance(items, Mapping) else ANY)
        return ANY


ANY = ValueSpec("any")
_STRING = ValueSpec("string")


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the grammar sees it: its parameters and which are required."""

    params: tuple[tuple[str, ValueSpec], ...]
    required: frozenset[str]
    open_keys: bool = False  # the schema allows keys it does not list: any key, any value

    def spec(self, key: str) -> ValueSpec | None:
        """The value spec of ``key`` (``None``: not a parameter)."""
        for name, spec in self.params:
            if name == key:
                return spec
        return ANY if self.open_keys else None


@dataclass(frozen=True)
class Value:
    """The state of one JSON value being written.

    ``phase`` says where in the value the text is; ``text`` is what was typed of a literal or a
    number (numbers are kept in a canonical form so that every number shares a few states);
    ``child`` is the state of an array's item or an object's key/value being written.
    """

    spec: ValueSpec
    phase: str = "start"
    text: str = ""
    child: Value | None = None

    @property
    def complete(self) -> bool:
        """The text so far is a whole value (a number may still go on)."""
        if self.phase == "done":
            return True
        if self.phase == "number":
            pattern = _INT_FULL if self.spec.kind == "integer" else _NUM_FULL
            return pattern.fullmatch(self.text) is not None
        if self.phase == "literal":
            literals = self.spec.literals
            i = bisect.bisect_left(literals, self.text)
            return i < len(literals) and literals[i] == self.text
        return False

    def advance(self, ch: str) -> Value | None:
        """The state after ``ch``, or ``None`` if ``ch`` cannot come next."""
        kind, phase = self.spec.kind, self.phase
        if phase == "start":
            return self._start(ch)
        if phase == "string":
            if ch == '"':
                return Value(self.spec, "done")
            return self if ch != "\\" and ch >= " " else None
        if phase == "literal":
            text = self.text + ch
            return Value(self.spec, "literal", text) if _has_prefix(self.spec.literals, text) else None
        if phase == "number":
            text = self.text + ch
            pattern = _INT_PREFIX if kind == "integer" else _NUM_PREFIX
            return Value(self.spec, "number", _canonical_number(text)) if pattern.fullmatch(text) else None
        if phase in ("array_first", "array_item", "object_first", "object_key", "object_value"):
            return self._inside(ch)
        if phase in ("array_sep", "object_sep"):
            close = "]" if phase == "array_sep" else "}"
            if ch == close:
                return Value(self.spec, "done")
            return Value(self.spec, phase + "_space") if ch == "," else None
        if phase in ("array_sep_space", "object_sep_space"):
            if ch != " ":
                return None
            if phase == "array_sep_space":
                return Value(self.spec, "array_item", child=Value(self._item_spec()))
            return Value(self.spec, "object_key", child=Value(_STRING, "string_open"))
        if phase == "string_open":
            return Value(self.spec, "string") if ch == '"' else None
        if phase == "object_colon":
            return Value(self.spec, "object_colon_space") if ch == ":" else None
        if phase == "object_colon_space":
            return Value(self.spec, "object_value", child=Value(ANY)) if ch == " " else None
        return None  # done: nothing more belongs to this value

    def next_chars(self) -> frozenset[str] | None:
        """A superset of the characters :meth:`advance` accepts, or ``None`` (any may).

        Known where it is small and cheap: a literal being written, alone or as an array's item.
        """
        if self.phase == "literal":
            return None if self.complete else _literal_next(self.spec.literals, self.text)
        if self.phase == "start" and self.spec.kind == "literal":
            return _literal_next(self.spec.literals, "")
        if self.phase == "array_item" and self.child is not None and not self.child.complete:
            return self.child.next_chars()  # an unfinished item takes every character
        return None

    def _item_spec(self) -> ValueSpec:
        return self.spec.items if self.spec.items is not None else ANY

    def _start(self, ch: str) -> Value | None:
        kind = self.spec.kind
        if kind == "literal":
            return Value(self.spec, "literal").advance(ch)  # literals are sorted (bisect)
        if kind == "string":
            return Value(self.spec, "string") if ch == '"' else None
        if kind in ("integer", "number"):
            return Value(self.spec, "number").advance(ch)
        if kind == "array":
            return Value(self.spec, "array_first") if ch == "[" else None
        # any JSON value: pick the kind by its first character
        if ch == '"':
            return Value(_STRING, "string")
        if ch == "[":
            return Value(ValueSpec("array", items=ANY), "array_first")
        if ch == "{":
            return Value(ValueSpec("object"), "object_first")
        if ch == "-" or ch.isdigit():
            return Value(ValueSpec("number"), "number").advance(ch)
        return Value(ValueSpec("literal", literals=("false", "null", "true")), "literal").advance(ch)

    def _inside(self, ch: str) -> Value | None:
        """A character inside an array or an object: to the child, or closing it."""
        phase = self.phase
        if phase == "array_first":
            if ch == "]":
                return Value(self.spec, "done")
            child = Value(self._item_spec()).advance(ch)
            return None if child is None else Value(self.spec, "array_item", child=child)
        if phase == "object_first":
            if ch == "}":
                return Value(self.spec, "done")
            return Value(self.spec, "object_key", child=Value(_STRING, "string")) if ch == '"' else None
        assert self.child is not None
        child = self.child.advance(ch)
        if child is not None:
            if phase == "object_key" and child.phase == "done":
                return Value(self.spec, "object_colon")
            return Value(self.spec, phase, child=child)
        if not self.child.complete or phase == "object_key":
            return None
        # the child ended before ch (a number, or a closed string/array/literal): ch is the parent's
        after = "array_sep" if phase == "array_item" else "object_sep"
        return Value(self.spec, after).advance(ch)


@dataclass(frozen=True)
class CallState:
    """Where the text of a call block is in :class:`ToolCallGrammar`.

    Attributes:
        phase: ``literal`` (``pending`` must come next, then ``then``), ``name``, ``args_first``,
            ``key``, ``value_<key>``, ``args_sep``, or ``end`` (the block is whole: only the closing tag
            may follow).
        tool: The tool named, once its name is closed.
        used: Parameters already written.
        text: What was typed of the name or of the key.
        pending: The rest of a fixed piece of text.
        then: The phase after ``pending``.
        value: The state of the value being written.
    """

    phase: str
    tool: str = ""
    used: frozenset[str] = field(default_factory=frozenset)
    text: str = ""
    pending: str = ""
    then: str = ""
    value: Value | None = None

    @property
    def ended(self) -> bool:
        """The block is a whole call: the closing tag is the only thing that may follow."""
        return self.phase == "end"


_OPEN = '{"name": "'
_ARGS = ', "arguments": {'  # after the name's closing quote


@functools.lru_cache(maxsize=4096)
def _literal_next(literals: tuple[str, ...], text: str) -> frozenset[str]:
    """The characters that follow ``text`` in the sorted ``literals`` that start with it."""
    chars: set[str] = set()
    n = len(text)
    for i in range(bisect.bisect_left(literals, text), len(literals)):
        literal = literals[i]
        if not literal.startswith(text):
            break
        if len(literal) > n:
            chars.add(literal[n])
    return frozenset(chars)


def _has_prefix(literals: Sequence[str], text: str) -> bool:
    """Some literal of the sorted ``literals`` starts with ``text`` (by bisection: copy sets are large)."""
    i = bisect.bisect_left(literals, text)
    return i < len(literals) and literals[i].startswith(text)


def _canonical_number(text: str) -> str:
    """A number prefix in the form its state needs: sign, ``0``/``1`` for the integer part, dot, ``0``.

    What may follow a number prefix depends only on these, so ``12``, ``345`` and ``9`` share a state.
    """
    sign = "-" if text.startswith("-") else ""
    body = text[len(sign) :]
    whole, dot, frac = body.partition(".")
    head = "" if not whole else ("0" if whole == "0" else "1")
    return sign + head + dot + ("0" if frac else "")


@dataclass(frozen=True)
class ToolCallGrammar:
    """The calls a model may write to a given set of tools (see the module docstring).

    Build one with :meth:`from_schemas` from the tools' OpenAI/Hermes schemas (what envs put in
    ``info["tools"]``). Hashable and comparable by its tools, so the engine can key its mask
    cache by grammar.

    Attributes:
        tools: Each tool's name and spec, sorted by name.
        copy_strings: String values (without an ``enum``) must be copied from the conversation:
            a turn decodes under :func:`srt_agent.tooling.copying.turn_grammar` of this grammar
            and its prompt.
    """

    tools: tuple[tuple[str, ToolSpec], ...]
    copy_strings: bool = False
    # The grammar a turn grammar was derived from (None for a schema's own). Not compared: two
    # turns with the same candidates are one grammar wherever they came from.
    origin: ToolCallGrammar | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_schemas(
        cls, schemas: Sequence[Mapping[str, Any]], copy_strings: bool = False
    ) -> ToolCallGrammar:
        """The grammar of calls to the tools ``schemas`` describe.

        Args:
            schemas: ``{"type": "function", "function": {"name", "parameters"}}`` entries, or
                bare ``{"name", "parameters"}`` ones.
            copy_strings: See the class's attribute.

        Raises:
            ValueError: No tools, or an entry without a name (the value is named).
        """
        tools: dict[str, ToolSpec] = {}
        for entry in schemas:
            fn = entry.get("function", entry)
            name = fn.get("name") if isinstance(fn, Mapping) else None
            if not isinstance(name, str) or not name or '"' in name or "\\" in name:
                raise ValueError(f"tool schema without a usable name: {json.dumps(entry)[:120]}")
            params = fn.get("parameters") or {}
            props = params.get("properties") or {}
            tools[name] = ToolSpec(
                params=tuple((k, ValueSpec.from_schema(v)) for k, v in props.items()),
                required=frozenset(params.get("required") or ()),
                # Listed parameters are the ones a call may use unless the schema says more are
                # allowed; a schema that lists none allows any (JSON Schema's default).
                open_keys=params.get("additionalProperties", not props) not in (False, None),
            )
        if not tools:
            raise ValueError("a tool-call grammar needs at least one tool; the env announced none")
        return cls(tuple(sorted(tools.items())), copy_strings)

    def start(self) -> CallState:
        """The state right after the opening ``<tool_call>`` tag."""
        return CallState("literal", pending=_OPEN, then="name")

    def feed(self, state: CallState, text: str) -> CallState | None:
        """The state after ``text``, or ``None`` if some character of it cannot come next."""
        s: CallState | None = state
        for ch in text:
            s = self.advance(s, ch)  # type: ignore[arg-type]
            if s is None:
                return None
        return s

    def advance(self, state: CallState, ch: str) -> CallState | None:
        """The state after one character, or ``None`` if it cannot come next."""
        phase = state.phase
        if phase == "literal":
            if ch != state.pending[0]:
                return None
            if len(state.pending) > 1:
                return CallState(
                    "literal", state.tool, state.used, pending=state.pending[1:], then=state.then
                )
            return CallState(state.then, state.tool, state.used)
        if phase == "name":
            if ch == '"':
                return self._after_name(state.text)
            text = state.text + ch
            ok = any(name.startswith(text) for name, _ in self.tools)
            return CallState("name", text=text) if ok else None
        spec = self._tool(state.tool)
        if phase in ("args_first", "args_sep"):
            missing = spec.required - state.used
            if ch == "}" and not missing:
                return CallState("literal", state.tool, state.used, pending="}", then="end")
            if phase == "args_first" and ch == '"' and self._keys_left(spec, state.used, ""):
                return CallState("key", state.tool, state.used)
            if phase == "args_sep" and ch == "," and self._keys_left(spec, state.used, ""):
                return CallState("literal", state.tool, state.used, pending=' "', then="key")
            return None
        if phase == "key":
            if ch == '"':
                value_spec = spec.spec(state.text)
                if value_spec is None or state.text in state.used:
                    return None
                used = state.used | {state.text}
                return CallState("literal", state.tool, used, pending=": ", then="value_" + state.text)
            text = state.text + ch
            return (
                CallState("key", state.tool, state.used, text=text)
                if self._keys_left(spec, state.used, text)
                else None
            )
        if phase.startswith("value_"):
            key = phase[len("value_") :]
            value_spec = spec.spec(key)
            assert value_spec is not None
            current = state.value if state.value is not None else Value(value_spec)
            nxt = current.advance(ch)
            if nxt is not None:
                return CallState(phase, state.tool, state.used, value=nxt)
            if not current.complete or state.value is None:
                return None
            return self.advance(CallState("args_sep", state.tool, state.used), ch)
        return None  # end: the block is whole

    def next_chars(self, state: CallState) -> frozenset[str] | None:
        """A superset of the characters that may follow ``state``, or ``None`` (any may).

        Known where it is small and cheap: fixed text, a literal or copied value being written.
        The engine's mask walk tries only these instead of every first character of the
        vocabulary's tokens: inside a copied value, a few of ~100.
        """
        if state.phase == "literal":
            return frozenset(state.pending[:1])
        if state.phase.startswith("value_"):
            current = state.value
            if current is None:
                value_spec = self._value_spec(state)
                return None if value_spec is None else Value(value_spec).next_chars()
            return None if current.complete else current.next_chars()
        return None

    def reads_copies(self, state: CallState) -> bool:
        """Whether the characters that may follow ``state`` depend on the turn's copy candidates.

        Only inside (or at the start of) a value whose spec holds copied literals. Everywhere else
        (the name, the keys, the separators, the other values) this grammar accepts exactly what
        its :attr:`origin` would with any other candidates.
        """
        if self.origin is None or not state.phase.startswith("value_"):
            return False
        value_spec = self._value_spec(state)
        return value_spec is not None and value_spec.copies

    def _value_spec(self, state: CallState) -> ValueSpec | None:
        """The spec of the value a ``value_<key>`` state is writing."""
        return self._tool(state.tool).spec(state.phase[len("value_") :])

    def _after_name(self, name: str) -> CallState | None:
        if not any(n == name for n, _ in self.tools):
            return None
        return CallState("literal", name, pending=_ARGS, then="args_first")

    def _tool(self, name: str) -> ToolSpec:
        for n, spec in self.tools:
            if n == name:
                return spec
        raise KeyError(name)

    @staticmethod
    def _keys_left(spec: ToolSpec, used: frozenset[str], prefix: str) -> bool:
        """Some unused parameter starts with ``prefix`` (any key does, for an open schema)."""
        if spec.open_keys:
            return '"' not in prefix and "\\" not in prefix
        return any(k.startswith(prefix) and k not in used for k, _ in spec.params)
