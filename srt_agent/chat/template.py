"""Token-in/token-out chat rendering across turns.

A multi-turn episode is one growing token sequence. The tokens the policy sampled are appended
verbatim and never re-tokenized (re-tokenizing decoded text can produce different ids, and then the
recorded logprobs no longer belong to the trained tokens). Everything else (system, user and tool
messages, and the template's glue around turns) is rendered with the model's chat template and
appended with loss mask 0.

Appending only works if the template is *append-only*: rendering the conversation with one more
message must extend, never rewrite, the text rendered before. Most templates are (Qwen2.5, ChatML);
some are not (Qwen3's thinking template drops earlier turns' reasoning once a new user message
arrives). :meth:`ChatFormat.add_observation` checks this at every turn and raises
:class:`TemplateContinuityError` naming the turn and the first differing text.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from srt_agent.chat.messages import Message, assistant
from srt_agent.errors import SrtAgentError

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>")
"""Tokens that end an assistant turn in common templates (ChatML/Qwen, Llama 3, Phi)."""


class TemplateContinuityError(SrtAgentError, ValueError):
    """The chat template rewrote earlier text when a turn was appended (it is not append-only)."""


@dataclass(frozen=True)
class TokenTranscript:
    """An episode's token sequence so far.

    Attributes:
        token_ids: Every token of the episode, prompt first.
        loss_mask: 1 for tokens the policy sampled, 0 for everything else.
        logprobs: Sampling logprob of each policy token; 0.0 where ``loss_mask`` is 0.
        messages: The conversation (assistant turns as the decoded text of their tokens).
        turn_spans: ``[start, end)`` token indices of each policy turn.
        rendered: The template's text for ``messages`` as last rendered (with the generation
            prompt); used to check that the next render only appends.
        tools: Tool schemas rendered into the prompt.
    """

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    messages: tuple[Message, ...]
    turn_spans: tuple[tuple[int, int], ...]
    rendered: str
    tools: tuple[dict[str, Any], ...] = ()

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def awaiting_generation(self) -> bool:
        """True when the sequence ends with a generation prompt (the policy's turn is next)."""
        return not self.messages or self.messages[-1].role != "assistant"


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _excerpt(text: str, at: int) -> str:
    return repr(text[max(0, at - 30) : at + 30])


class ChatFormat:
    """Renders messages with a tokenizer's chat template, token-in/token-out across turns.

    Args:
        tokenizer: An HF tokenizer with a ``chat_template``.
        chat_template: Use this template instead of the tokenizer's own.
        stop_token_ids: Tokens that end an assistant turn; by default the first of
            :data:`END_OF_TURN_TOKENS` found in the vocabulary, plus the EOS token.

    Raises:
        ValueError: The tokenizer has no chat template and none was given.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        chat_template: str | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ):
        self.tokenizer = tokenizer
        # The samples of a task open with the same prompt, and tool results repeat across them:
        # remember recent encodings (a prompt of ~1k tokens takes ~1-2 ms to encode).
        self._encode_cached = functools.lru_cache(maxsize=1024)(self._encode)
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise ValueError(
                f"{type(tokenizer).__name__} has no chat_template; pass chat_template=... "
                "(a jinja string, e.g. the model's tokenizer_config.json 'chat_template')"
            )
        if stop_token_ids is None:
            stops: list[int] = []
            vocab = tokenizer.get_vocab()
            for tok in END_OF_TURN_TOKENS:
                if tok in vocab:
                    stops.append(vocab[tok])
                    break
            eos = tokenizer.eos_token_id
            if isinstance(eos, int) and eos not in stops:
                stops.append(eos)
            stop_token_ids = stops
        if not stop_token_ids:
            raise ValueError("no end-of-turn token found; pass stop_token_ids=[...]")
        self.stop_token_ids: tuple[int, ...] = tuple(int(t) for t in stop_token_ids)

    def __getstate__(self) -> dict[str, Any]:
        # The memo wraps a bound method, which does not pickle (process pools get a ChatFormat).
        state = self.__dict__.copy()
        del state["_encode_cached"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._encode_cached = functools.lru_cache(maxsize=1024)(self._encode)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> ChatFormat:
        """Load the tokenizer (and its chat template) from an HF model directory."""
        return cls(AutoTokenizer.from_pretrained(str(model_dir)), **kwargs)

    # ------------------------------------------------------------------ rendering helpers
    def render(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (), *, generation_prompt: bool
    ) -> str:
        """The template's text for ``messages`` (with the assistant generation prompt if asked)."""
        out = self.tokenizer.apply_chat_template(
            [m.as_dict() for m in messages],
            tools=list(tools) or None,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )
        assert isinstance(out, str)
        return out

    def encode(self, text: str) -> list[int]:
        """Tokenize template text (special-token markup becomes special tokens; no BOS/EOS added)."""
        return list(self._encode_cached(text))

    def _encode(self, text: str) -> tuple[int, ...]:
        # A fast tokenizer's backend gives the same ids as its __call__ without building a
        # BatchEncoding (~0.3 ms a call on the driver's hot path).
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return tuple(backend.encode(text, add_special_tokens=False).ids)
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        """Decode tokens exactly as generated (special tokens kept, no space clean-up)."""
        return str(
            self.tokenizer.decode(
                list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    # ------------------------------------------------------------------ the episode's sequence
    def start(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = ()) -> TokenTranscript:
        """The prompt for the first assistant turn: the opening messages and the generation prompt."""
        if not messages:
            raise ValueError("start() needs at least one message")
        text = self.render(messages, tools, generation_prompt=True)
        ids = tuple(self.encode(text))
        return TokenTranscript(
            token_ids=ids,
            loss_mask=(0,) * len(ids),
            logprobs=(0.0,) * len(ids),
            messages=tuple(messages),
            turn_spans=(),
            rendered=text,
            tools=tuple(tools),
        )

    def assistant_text(self, token_ids: Sequence[int]) -> str:
        """The assistant message's content for generated tokens (a final end-of-turn token dropped)."""
        body = token_ids[:-1] if token_ids and token_ids[-1] in self.stop_token_ids else token_ids
        return self.decode(body)

    def add_generation(
        self, transcript: TokenTranscript, token_ids: Sequence[int], logprobs: Sequence[float]
    ) -> TokenTranscript:
        """Append the policy's sampled tokens verbatim (loss mask 1).

        Raises:
            ValueError: Lengths differ, the sequence is not awaiting a generation, or nothing was
                generated.
        """
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} token ids but {len(logprobs)} logprobs")
        if not token_ids:
            raise ValueError("add_generation() needs at least one token")
        if not transcript.awaiting_generation:
            raise ValueError("the last message is already the assistant's; add an observation first")
        start = len(transcript.token_ids)
        return replace(
            transcript,
            token_ids=transcript.token_ids + tuple(int(t) for t in token_ids),
            loss_mask=transcript.loss_mask + (1,) * len(token_ids),
            logprobs=transcript.logprobs + tuple(float(x) for x in logprobs),
            messages=(*transcript.messages, assistant(self.assistant_text(token_ids))),
            turn_spans=(*transcript.turn_spans, (start, start + len(token_ids))),
        )

    def add_observation(self, transcript: TokenTranscript, messages: Sequence[Message]) -> TokenTranscript:
        """Append the env's new messages and the next generation prompt (loss mask 0).

        The template's glue after the assistant turn (e.g. ``<|im_end|>`` and a newline when
        generation stopped without the end-of-turn token, or just the newline when it did) is
        appended too.

        Raises:
            TemplateContinuityError: The template is not append-only at this turn.
            ValueError: The sequence does not end with an assistant turn.
        """
        if transcript.awaiting_generation:
            raise ValueError("add_observation() must follow add_generation()")
        turn = len(transcript.turn_spans)
        history = transcript.messages
        closed = self.render(history, transcript.tools, generation_prompt=False)
        self._check_prefix(transcript.rendered, closed, turn, "adding the assistant's message")
        block = closed[len(transcript.rendered) :]
        s, e = transcript.turn_spans[-1]
        generated = self.decode(transcript.token_ids[s:e])
        if not block.startswith(generated):
            at = _first_difference(block, generated)
            raise TemplateContinuityError(
                f"turn {turn}: the template renders the assistant message as {_excerpt(block, at)} "
                f"but the policy generated {_excerpt(generated, at)} (differs at character {at}); "
                "its tokens cannot be kept verbatim"
            )
        full = self.render([*history, *messages], transcript.tools, generation_prompt=True)
        self._check_prefix(closed, full, turn, f"appending {len(messages)} observation message(s)")
        new_ids = tuple(self.encode(block[len(generated) :] + full[len(closed) :]))
        return replace(
            transcript,
            token_ids=transcript.token_ids + new_ids,
            loss_mask=transcript.loss_mask + (0,) * len(new_ids),
            logprobs=transcript.logprobs + (0.0,) * len(new_ids),
            messages=(*history, *messages),
            rendered=full,
        )

    @staticmethod
    def _check_prefix(before: str, after: str, turn: int, what: str) -> None:
        if not after.startswith(before):
            at = _first_difference(before, after)
            raise TemplateContinuityError(
                f"turn {turn}: the chat template is not append-only: {what} changed earlier text at "
                f"character {at}: was {_excerpt(before, at)}, now {_excerpt(after, at)}. Use an "
                "append-only template (e.g. one that keeps every turn's content verbatim)."
            )
