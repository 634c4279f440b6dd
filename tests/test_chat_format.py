import pickle

import pytest
from chat_fixtures import tiny_tokenizer

from srt_agent.chat.messages import Message, system, tool_result, user
from srt_agent.chat.template import ChatFormat, TemplateContinuityError

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Math.", "parameters": {}}}]


def episode(fmt: ChatFormat, *, stop: bool = True) -> tuple[list[list[int]], list[Message], object]:
    """Play two generated turns with a tool result between them; return generated ids and history."""
    im_end = fmt.stop_token_ids[0]
    turns = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>',
        "The answer is <answer>4</answer>.",
    ]
    generated = [fmt.encode(t) + ([im_end] if stop else []) for t in turns]
    opening = [system("Be brief."), user("What is 2+2?")]
    tr = fmt.start(opening, TOOLS)
    tr = fmt.add_generation(tr, generated[0], [-0.5] * len(generated[0]))
    obs = [tool_result("4", call_id="t1_call_0", name="calculator")]
    tr = fmt.add_observation(tr, obs)
    tr = fmt.add_generation(tr, generated[1], [-0.25] * len(generated[1]))
    return generated, [*opening, *obs], tr


def test_qwen25_sequence_decodes_to_the_full_render_and_masks_only_sampled_tokens() -> None:
    fmt = ChatFormat(tiny_tokenizer("qwen2.5.jinja"))
    generated, _, tr = episode(fmt)
    # The kept tokens decode to exactly what the template renders for the whole conversation.
    full = fmt.render(tr.messages, TOOLS, generation_prompt=False)
    text = fmt.decode(tr.token_ids)
    assert full.startswith(text) and full[len(text) :] == "\n"  # only the final glue is missing
    assert "<tool_response>\n4\n</tool_response>" in text and '"name": "calculator"' in text
    # Loss mask covers exactly the sampled tokens, and they are verbatim.
    assert sum(tr.loss_mask) == sum(len(g) for g in generated)
    for (s, e), g in zip(tr.turn_spans, generated, strict=True):
        assert list(tr.token_ids[s:e]) == g and set(tr.loss_mask[s:e]) == {1}
        assert tr.loss_mask[s - 1] == 0 and (e == len(tr) or tr.loss_mask[e] == 0)
    unmasked = [lp for lp, m in zip(tr.logprobs, tr.loss_mask, strict=True) if not m]
    assert unmasked == [0.0] * tr.loss_mask.count(0)
    assert tr.messages[2].content.startswith("<tool_call>") and tr.messages[-1].content.endswith("</answer>.")


def test_turn_without_end_token_gets_template_glue_with_mask_zero() -> None:
    fmt = ChatFormat(tiny_tokenizer())
    generated, _, tr = episode(fmt, stop=False)
    s, e = tr.turn_spans[0]
    glue = fmt.decode(tr.token_ids[e : e + 2])
    assert glue.startswith("<|im_end|>") and tr.loss_mask[e] == 0
    assert list(tr.token_ids[s:e]) == generated[0]


def test_sampled_tokens_are_never_retokenized() -> None:
    fmt = ChatFormat(tiny_tokenizer())
    text_ids = fmt.encode("hello world")
    # An unusual but valid split of the same text: characters one by one (byte-level tokens).
    odd = [fmt.tokenizer.convert_tokens_to_ids(c) for c in "hello"] + fmt.encode(" world")
    assert fmt.decode(odd) == "hello world" and odd != text_ids
    tr = fmt.start([user("say hi")])
    tr = fmt.add_generation(tr, [*odd, fmt.stop_token_ids[0]], [-1.0] * (len(odd) + 1))
    tr = fmt.add_observation(tr, [user("again")])
    s, e = tr.turn_spans[0]
    assert list(tr.token_ids[s : e - 1]) == odd


def test_qwen3_thinking_template_is_caught_as_not_append_only() -> None:
    fmt = ChatFormat(tiny_tokenizer("qwen3-thinking.jinja"))
    tr = fmt.start([user("What is 2+2?")])
    # The generation prompt already opens "<think>\n"; the model writes its reasoning and answer.
    assert fmt.render([user("x")], generation_prompt=True).endswith("<think>\n")
    ids = [*fmt.encode("step by step\n</think>\n\n4"), fmt.stop_token_ids[0]]
    tr = fmt.add_generation(tr, ids, [0.0] * len(ids))
    with pytest.raises(TemplateContinuityError) as info:
        fmt.add_observation(tr, [user("And 3+3?")])
    assert "turn 1: the chat template is not append-only" in str(info.value)


def test_template_that_rewrites_assistant_content_is_reported() -> None:
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fmt = ChatFormat(tiny_tokenizer(), chat_template=template)
    tr = fmt.start([user("hi")])
    ids = [*fmt.encode("  hello world"), fmt.stop_token_ids[0]]
    tr = fmt.add_generation(tr, ids, [0.0] * len(ids))
    with pytest.raises(TemplateContinuityError, match="turn 1: the template renders the assistant message"):
        fmt.add_observation(tr, [user("ok")])


def test_misuse_is_rejected_with_clear_errors() -> None:
    fmt = ChatFormat(tiny_tokenizer())
    tr = fmt.start([user("hi")])
    with pytest.raises(ValueError, match="logprobs"):
        fmt.add_generation(tr, [1, 2], [0.0])
    with pytest.raises(ValueError, match="must follow add_generation"):
        fmt.add_observation(tr, [user("x")])
    tr = fmt.add_generation(tr, [5], [0.0])
    with pytest.raises(ValueError, match="already the assistant's"):
        fmt.add_generation(tr, [5], [0.0])
    bare = tiny_tokenizer()
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        ChatFormat(bare)


def test_a_chat_format_pickles_for_process_pools_and_keeps_encoding_the_same() -> None:
    fmt = ChatFormat(tiny_tokenizer("qwen2.5.jinja"))
    text = fmt.render([user("2 + 2?")], generation_prompt=True)
    copy = pickle.loads(pickle.dumps(fmt))
    assert copy.encode(text) == fmt.encode(text) == fmt.encode(text)  # the memo returns fresh lists
    assert fmt.encode(text) is not fmt.encode(text)
