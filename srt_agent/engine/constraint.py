"""Tool-call constrained decoding: vocabulary masks from a :class:`ToolCallGrammar`.

A request that carries a grammar (``GenerationRequest.tool_grammar``) samples freely until it
writes the ``<tool_call>`` token; from there until ``</tool_call>`` every token is drawn from the
policy's distribution restricted to the tokens that keep the block a prefix of a valid call, and
renormalised. The logprob the engine reports is that of the restricted distribution: the
distribution the token was actually drawn from. The opening tag itself is drawn unconstrained, and
so is everything after the closing tag.

A token is allowed in a state when each of its characters is (special tokens never are, and
inside a whole call only ``</tool_call>`` is). Masks are computed once per (grammar, state) by a
walk over a character trie of the vocabulary, pruned where the grammar refuses a character (and,
inside a literal or copied value, trying only the characters that can come next), and cached: a
call of a tool goes through the same few dozen states whatever its values hold. With copied
arguments each turn has a grammar of its own; a mask that no copy candidate decided is cached under
the grammar it was derived from, so the next turns find it too.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from srt_agent.chat.messages import IM_END, IM_START
from srt_agent.errors import SrtAgentError
from srt_agent.tooling.copying import copy_candidates, turn_grammar
from srt_agent.tooling.grammar import CallState, ToolCallGrammar
from srt_agent.tooling.parser import CLOSE_TAG, OPEN_TAG

if TYPE_CHECKING:
    from srt_agent.engine.detokenizer import Detokenizer

_MAX_CACHED = 20_000  # masks kept: a bound for grammars with open-ended states and per-turn grammars
_MAX_CACHED_BYTES = 512 * 2**20  # and a bound in bytes (one byte a token): large vocabularies keep fewer


class ConstraintError(SrtAgentError, ValueError):
    """The tokenizer cannot serve tool-call constraints (no single-token tags)."""


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)


class Vocabulary:
    """Every token's text, a character trie over them, and the tag tokens' ids.

    Args:
        tokenizer: The engine's tokenizer.
        vocab_size: The model's vocabulary (ids past the tokenizer's have no text).

    Raises:
        ConstraintError: ``<tool_call>`` or ``</tool_call>`` is not a single token.
    """

    def __init__(self, tokenizer: Detokenizer, vocab_size: int) -> None:
        self.size = vocab_size
        self.root = _Node()
        self.texts: list[str] = [""] * vocab_size  # each token's text ("" for ids without one)
        tags: dict[str, int] = {}
        for i in range(vocab_size):
            try:
                text = _text(tokenizer.decode([i], skip_special_tokens=False))
                plain = _text(tokenizer.decode([i], skip_special_tokens=True))
            except (IndexError, KeyError, OverflowError, ValueError, TypeError):  # ids past the tokenizer's
                continue
            self.texts[i] = text
            if text in (OPEN_TAG, CLOSE_TAG, IM_START, IM_END):
                tags.setdefault(text, i)
                continue
            if not text or plain != text or "\ufffd" in text:
                continue  # special tokens and partial UTF-8 bytes never appear inside a call
            node = self.root
            for ch in text:
                node = node.children.setdefault(ch, _Node())
            node.ids.append(i)
        missing = [t for t in (OPEN_TAG, CLOSE_TAG) if t not in tags]
        if missing:
            raise ConstraintError(
                f"constrained tool calls need {' and '.join(missing)} as single tokens of the tokenizer; "
                "add them as tokens (tokenizer.add_tokens) or turn tool-call constraints off"
            )
        self.open_id, self.close_id = tags[OPEN_TAG], tags[CLOSE_TAG]
        # ChatML's message markers, where the tokenizer has them as single tokens: they let a
        # prompt's text be split by role (copied arguments never come from the policy's turns).
        self.start_id, self.end_id = tags.get(IM_START), tags.get(IM_END)


def _text(decoded: str | list[str]) -> str:
    return decoded if isinstance(decoded, str) else "".join(decoded)


class CallMasks:
    """Allowed-token masks of a grammar's states over one vocabulary, cached.

    Thread-safe: rows of the engine's loop ask from one thread, but a mask may be built for a
    test or a benchmark from another.
    """

    def __init__(self, vocabulary: Vocabulary, device: torch.device) -> None:
        self.vocabulary = vocabulary
        self.device = device
        self._cache: dict[tuple[ToolCallGrammar, CallState], torch.Tensor] = {}
        self._shared: dict[tuple[ToolCallGrammar, CallState], torch.Tensor] = {}  # keyed by origin
        self._capacity = max(64, min(_MAX_CACHED, _MAX_CACHED_BYTES // max(1, vocabulary.size)))
        self._lock = threading.Lock()

    def mask(self, grammar: ToolCallGrammar, state: CallState) -> torch.Tensor:
        """``(V,)`` bool: the tokens that may come next in ``state``.

        A turn grammar of copied arguments is new each turn (its candidates grow with the
        conversation), so most of its states would miss a cache keyed by grammar. A mask whose walk
        never read the candidates (the name, keys and separators: most states of a call) is the
        same for every turn derived from one grammar, and is also kept under that origin.
        """
        key = (grammar, state)
        shared = None if grammar.origin is None else (grammar.origin, state)
        with self._lock:
            hit = self._cache.get(key)
            if hit is None and shared is not None:
                hit = self._shared.get(shared)
        if hit is not None:
            return hit
        allowed = torch.zeros(self.vocabulary.size, dtype=torch.bool)
        reads_copies = False
        if state.ended:
            allowed[self.vocabulary.close_id] = True
        else:
            ids, reads_copies = self._walk(grammar, state)
            allowed[ids] = True
        mask = allowed.to(self.device)
        with self._lock:
            if len(self._cache) + len(self._shared) >= self._capacity:
                self._cache.clear()
                self._shared.clear()
            if shared is not None and not reads_copies:
                self._shared[shared] = mask
            else:
                self._cache[key] = mask
        return mask

    def _walk(self, grammar: ToolCallGrammar, state: CallState) -> tuple[list[int], bool]:
        """Ids of every token whose characters the grammar accepts from ``state``.

        Also whether any of them was decided in a state that reads the turn's copy candidates.
        """
        found: list[int] = []
        reads_copies = False
        stack: list[tuple[_Node, CallState]] = [(self.vocabulary.root, state)]
        while stack:
            node, s = stack.pop()
            reads_copies = reads_copies or grammar.reads_copies(s)
            chars = grammar.next_chars(s)
            children = node.children
            tried = children.items() if chars is None else [(c, children[c]) for c in chars if c in children]
            for ch, child in tried:
                nxt = grammar.advance(s, ch)
                if nxt is None:
                    continue
                found.extend(child.ids)
                if child.children:
                    stack.append((child, nxt))
        return found, reads_copies


class CallTracker:
    """One sequence's place in its grammar: outside a call (``state is None``) or inside one.

    With a ``copy_strings`` grammar, :meth:`resume` replaces :attr:`grammar` by the turn's own
    (:func:`~srt_agent.tooling.copying.turn_grammar` of the prompt's text outside the policy's turns): the
    engine and the learner both call it on the same prompt, so they mask alike.

    Args:
        grammar: The request's grammar.
        vocabulary: The engine's vocabulary (tag ids, and each token's text).
    """

    def __init__(self, grammar: ToolCallGrammar, vocabulary: Vocabulary) -> None:
        self.grammar = grammar
        self.vocabulary = vocabulary
        self.state: CallState | None = None

    @property
    def active(self) -> bool:
        """Inside a call block: the next token is constrained."""
        return self.state is not None

    def resume(self, prompt_ids: Sequence[int]) -> None:
        """Start inside a call when the prompt ends in an open one (a caller that forces a prefix).

        The prompt's last ``<tool_call>`` with no ``</tool_call>`` after it, and what follows it,
        set the state; a prefix the grammar refuses leaves the request unconstrained until its
        next opening tag. A ``copy_strings`` grammar takes its candidates from the prompt first.
        """
        vocab = self.vocabulary
        if self.grammar.copy_strings:
            self.grammar = turn_grammar(self.grammar, copy_candidates(self._context(prompt_ids)))
        for i in range(len(prompt_ids) - 1, -1, -1):
            token = prompt_ids[i]
            if token == vocab.close_id:
                return
            if token == vocab.open_id:
                self.feed(prompt_ids[i:])
                return

    def _context(self, prompt_ids: Sequence[int]) -> str:
        """The prompt's text outside the policy's own turns: what a call may copy from.

        The policy's earlier assistant messages (ChatML ``<|im_start|>assistant`` ... ``<|im_end|>``,
        where the tokenizer has those markers) and its ``<tool_call>`` blocks are left out, so a
        value it once invented, in a call or in its prose, does not become copyable; what the
        system prompt, the user and the tools said stays in.
        """
        vocab = self.vocabulary
        texts, inside, own = vocab.texts, False, False
        role: list[str] | None = None  # the role name being read after a start marker
        parts: list[str] = []
        for token in prompt_ids:
            text = texts[token] if 0 <= token < len(texts) else ""
            if role is not None:  # "<|im_start|>" + role + "\n"
                head, newline, tail = text.partition("\n")
                role.append(head)
                if newline:
                    own, role = "".join(role).strip() == "assistant", None
                    if not own:
                        parts.append(tail)
                continue
            if token == vocab.start_id:
                role = []
            elif token == vocab.end_id:
                own = inside = False
            elif token == vocab.open_id:
                inside = True
            elif token == vocab.close_id:
                inside = False
            elif not (inside or own):
                parts.append(text)
        return "".join(parts)

    def feed(self, tokens: Sequence[int]) -> None:
        """Advance over committed tokens.

        A token the grammar refuses (only possible for tokens the engine did not draw under the
        mask, such as a forced prompt) ends the constraint for this block rather than the request:
        the env's parser will report the call as malformed, as it would unconstrained.
        """
        for token in tokens:
            self.state, _ = self.step(self.state, token)

    def step(self, state: CallState | None, token: int) -> tuple[CallState | None, bool]:
        """The state after ``token`` from ``state``, and whether the grammar allows the token there.

        Outside a block every token is allowed and ``<tool_call>`` opens one; inside, the closing
        tag is allowed once the call is whole, and another token when its text is.
        """
        vocab = self.vocabulary
        if state is None:
            return (self.grammar.start() if token == vocab.open_id else None), True
        if token == vocab.close_id:
            return None, state.ended
        text = vocab.texts[token] if 0 <= token < len(vocab.texts) else ""
        nxt = self.grammar.feed(state, text) if text and token != vocab.open_id else None
        return nxt, nxt is not None
