"""The embedded model's tokenizer: a small byte-level BPE with ChatML tokens and a compact chat template.

The default model is tiny, so its context is precious: the vocabulary is trained on the built-in
envs' own text (a few thousand merges make their prompts and replies short), and the chat template
renders tool schemas as one line per tool instead of JSON.

Token layout:

* ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (end of turn, EOS) are special tokens,
  ids 0, 1, 2;
* ``<tool_call>``, ``</tool_call>``, ``<answer>``, ``</answer>`` are single *added* tokens that are
  not special, so they decode as text (the env parses them from the decoded reply) while costing
  one token each;
* numbers are cut into chunks of up to three digits from the left (``2812.16`` is ``281 2 . 16``),
  and every string of one to three digits is its own token (added, not special), so a chunk always
  tokenizes the same way. Why: the model copies numbers from the problem and from tool results into
  calculator expressions; a 1-3 digit number is then copied in one step by pointing at one token,
  where one-digit tokens need a chain of exact copies (an induction circuit that a few-million
  parameter model trained for minutes forms late). Tied embeddings make copying rare chunk tokens
  work: attention that moves a token's embedding forward scores that token highest.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from srt_agent.chat.messages import IM_END, IM_START, Message

PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
TAG_TOKENS = ("<tool_call>", "</tool_call>", "<answer>", "</answer>")
"""Added, non-special tokens: one id each, decoded as their text."""
NUMBER_TOKENS = tuple(f"{i:0{width}d}" for width in (1, 2, 3) for i in range(10**width))
"""Every string of one to three digits; added tokens match leftmost-longest, so digit runs split into
chunks of three from the left."""

# ChatML, append-only: every message renders as its own block that never changes once written, and
# tool results are their own `tool` turns (no grouping of consecutive results, which would make the
# closing of a block depend on the next message). Tools render as one line each,
# `name(arg: type, opt?: type): description`, appended to the system block; the call syntax is
# stated once, because some envs' system prompts (Retail) do not show it.
_TEMPLATE_SOURCE = (
    "{%- macro tool_line(tool) -%}"
    "{%- set f = tool['function'] if tool['function'] is defined else tool -%}"
    "{%- set params = f['parameters'] if f['parameters'] is defined else {} -%}"
    "{%- set props = params['properties'] if params['properties'] is defined else {} -%}"
    "{%- set required = params['required'] if params['required'] is defined else [] -%}"
    "{{- '- ' + f['name'] + '(' -}}"
    "{%- for name, p in props.items() -%}"
    "{{- ', ' if not loop.first -}}"
    "{{- name + ('' if name in required else '?') + ': ' + (p['type'] if p['type'] is defined else 'any') -}}"
    "{%- if p['items'] is defined and p['items']['type'] is defined -%}"
    "{{- '[' + p['items']['type'] + ']' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{{- ')' -}}"
    "{%- if f['description'] is defined and f['description'] -%}{{- ': ' + f['description'] -}}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set has_system = messages and messages[0]['role'] == 'system' -%}"
    "{%- if READ_SYSTEM and (has_system or tools) -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- messages[0]['content'] -}}{%- endif -%}"
    "{%- if tools -%}"
    "{%- if has_system -%}{{- '\\n\\n' -}}{%- endif -%}"
    '{{- \'Tools, called as <tool_call>{"name": ..., "arguments": {...}}</tool_call>:\' -}}'
    "{%- for tool in tools -%}{{- '\\n' + tool_line(tool) -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and has_system) -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def chat_template(read_system: bool) -> str:
    """The ChatML template, with or without the system block (system prompt and tool list).

    The embedded model uses ``read_system=False``: its template drops the system message and the
    tool list, so the model sees only the conversation. Why: a model of a few million parameters
    cannot follow written instructions anyway; it learns each built-in env's protocol (tool-call
    syntax, answer tags) from demonstrations. The env's system prompt was ~40% of a Calculator
    demo, and in tuning runs dropping it let supervised learning reach the same loss in about half
    the steps (measured: loss 0.29 vs 0.53 after 1,000 steps), because attention no longer has to
    learn to look past a long constant preamble. Real checkpoints use their own templates.
    """
    return _TEMPLATE_SOURCE.replace("READ_SYSTEM", "true" if read_system else "false")


CHAT_TEMPLATE = chat_template(True)
"""The full template: system prompt and compact tool list in a system block."""
TASK_TEMPLATE = chat_template(False)
"""The embedded model's template: the conversation without the system block."""


@functools.cache
def _compiled_template(read_system: bool) -> Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(chat_template(read_system))


def render_chat(
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] = (),
    *,
    generation_prompt: bool = False,
    read_system: bool = True,
) -> str:
    """Render a conversation with the chat template without a tokenizer (for tokenizer training).

    Uses the same jinja settings as ``transformers``' ``apply_chat_template``; ``read_system``
    picks :data:`CHAT_TEMPLATE` or :data:`TASK_TEMPLATE` (see :func:`chat_template`).
    """
    return _compiled_template(read_system).render(
        messages=[m.as_dict() for m in messages], tools=list(tools), add_generation_prompt=generation_prompt
    )


def _strip_markup(texts: Iterable[str]) -> Iterator[str]:
    """The texts without special and tag tokens: they get their own ids, so BPE must not merge them."""
    for text in texts:
        for tag in (*SPECIAL_TOKENS, *TAG_TOKENS):
            text = text.replace(tag, "\n")
        yield text


def train_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 2048, context: int = 4096, read_system: bool = True
) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``texts`` and wrap it with the special tokens and chat template.

    Args:
        texts: Training text, e.g. conversations rendered with :func:`render_chat` (special and tag
            tokens in it are ignored).
        vocab_size: Size of the BPE vocabulary including the three special tokens; the four tag
            tokens and the 1,110 number tokens are added on top.
        context: The model's context length (saved as ``model_max_length``).
        read_system: Whether the saved chat template renders the system block (see
            :func:`chat_template`).

    Returns:
        A fast tokenizer; ``save_pretrained`` it next to the model.

    Raises:
        ValueError: ``vocab_size`` is too small for the 256 byte symbols and the special tokens.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(
            f"vocab_size={vocab_size} is too small; use at least {256 + len(SPECIAL_TOKENS) + 1}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_strip_markup(texts), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*TAG_TOKENS, *NUMBER_TOKENS)])
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # untyped in transformers
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        model_max_length=context,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = chat_template(read_system)
    return fast
