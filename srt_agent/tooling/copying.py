"""Copied tool arguments: a call's string values are words of the conversation, never inventions.

With ``rollout.copy_tool_arguments`` a :class:`~srt_agent.tooling.grammar.ToolCallGrammar` has
``copy_strings`` set, and each turn decodes under :func:`turn_grammar` of it: every string value
without an ``enum`` (array items too) becomes one of the turn's :func:`copy_candidates`, the words
and quoted strings of its prompt outside the policy's own earlier turns (its calls and its prose).
A user id, an order id, an item id or an e-mail can then be copied but not made up, as a dynamic
enum would do in a structured-output engine.

The candidates depend on the prompt, so the engine's tracker and the learner's replay both call
:func:`turn_grammar` on the same prompt text (:class:`~srt_agent.engine.constraint.CallTracker`);
the same candidates give the same grammar object, so their masks are shared.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable

from srt_agent.tooling.grammar import ToolCallGrammar, ToolSpec, ValueSpec

# Words a value may be copied from: ids (``#W8732376``, ``liam_johnson_4492``), e-mails, numbers.
_WORD = re.compile(r"[A-Za-z0-9_#@.+\-]+")
# Quoted strings: the string values of a tool's JSON output (names with spaces, addresses).
_QUOTED = re.compile(r'"([ -!#-\[\]-~]{1,120})"')
# Single-quoted ones, as prose quotes a value ("the reason 'no longer needed'"); the quotes must
# stand outside words, so the apostrophes of "I'd" and "customer's" never pair up.
_SINGLE_QUOTED = re.compile(r"(?<![A-Za-z0-9])'([ -&(-~]{1,120}?)'(?![A-Za-z0-9])")


def copy_candidates(text: str) -> frozenset[str]:
    """The strings a copied value may be, taken from ``text`` (the conversation so far).

    Every word (a run of letters, digits and ``_#@.+-``, without a sentence's trailing ``.`` or
    ``-``), every double-quoted string of printable ASCII without a backslash (JSON string
    values of tool outputs) and every single-quoted one (a value quoted in prose). Non-ASCII
    text never becomes a candidate: a byte-level vocabulary may have no whole token for its
    characters, and a value must always be completable.
    """
    words = {w.rstrip(".-") for w in _WORD.findall(text)}
    words.update(_QUOTED.findall(text))
    words.update(_SINGLE_QUOTED.findall(text))
    words.discard("")
    return frozenset(words)


def turn_grammar(grammar: ToolCallGrammar, candidates: Iterable[str]) -> ToolCallGrammar:
    """The grammar of one turn of a ``copy_strings`` grammar: its string values are ``candidates``.

    Candidates a call cannot hold (a quote or a backslash, a control or non-ASCII character) are
    dropped. With none left, or for a grammar without ``copy_strings``, strings stay free: a value
    must always have a way to be written. The same candidates give the same object (cached).
    """
    if not grammar.copy_strings:
        return grammar
    usable = sorted(
        json.dumps(c)
        for c in candidates
        if c and c.isascii() and c.isprintable() and '"' not in c and "\\" not in c
    )
    if not usable:
        return ToolCallGrammar(grammar.tools)
    return _derive(grammar, _Choices(usable))


class _Choices(tuple[str, ...]):
    """A sorted tuple of JSON string literals whose hash is computed once.

    A copy set holds hundreds of strings and sits in every state of a value being copied; the
    engine hashes a (grammar, state) key per constrained token, so the hash must not cost a pass
    over the set each time. (Literal states search it by bisection, so it must stay sorted.)
    """

    _hash: int

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            self._hash = tuple.__hash__(self)
            return self._hash


@functools.lru_cache(maxsize=256)
def _derive(grammar: ToolCallGrammar, choices: _Choices) -> ToolCallGrammar:
    def swap(spec: ValueSpec) -> ValueSpec:
        if spec.kind == "string":
            return ValueSpec("literal", literals=choices, copied=True)
        if spec.kind == "array" and spec.items is not None:
            return ValueSpec("array", items=swap(spec.items))
        return spec

    tools = tuple(
        (name, ToolSpec(tuple((k, swap(v)) for k, v in tool.params), tool.required, tool.open_keys))
        for name, tool in grammar.tools
    )
    return ToolCallGrammar(tools, origin=grammar)
