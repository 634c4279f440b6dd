import pytest
from model_fixtures import ENV_IDS, demos, tokenizer
from transformers import AutoTokenizer

from srt_agent.chat.messages import system, tool_result, user
from srt_agent.chat.template import ChatFormat
from srt_agent.recipe.demos import to_transcript
from srt_agent.recipe.tokenizer import (
    CHAT_TEMPLATE,
    NUMBER_TOKENS,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    render_chat,
    train_tokenizer,
)

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string"},
                "ids": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["expression"],
        },
    },
}


def test_special_tokens_have_fixed_ids_and_tags_are_single_text_tokens() -> None:
    tok = tokenizer()
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for tag in TAG_TOKENS:
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1
        # Not special: they survive skip_special_tokens, unlike the ChatML markers.
        assert tok.decode(ids, skip_special_tokens=True) == tag
    ids = tok("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"


@pytest.mark.parametrize(
    "text",
    [
        "The total is $1,234.50 <answer>1234.5</answer>",
        '<tool_call>{"name": "calculator", "arguments": {"expression": "(12 + 7) * 3.5"}}</tool_call>',
        "Unseen: café ☕ naïve 日本語 \t tabs\n\nand  double  spaces  ",
        "order #W4340262, item 1651506235",
    ],
)
def test_round_trip_is_exact(text: str) -> None:
    tok = tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, clean_up_tokenization_spaces=False) == text


def test_numbers_split_in_three_digit_chunks_from_the_left_and_common_words_are_merged() -> None:
    tok = tokenizer()
    text = "cost 2375 calculator 27.54545455 and 05 or 7"
    pieces = tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])
    assert [p for p in pieces if p.isdigit()] == ["237", "5", "27", "545", "454", "55", "05", "7"]
    assert "Ġcalculator" in pieces
    # The same digits tokenize the same way wherever they stand: copies are token-exact.
    a = tok("2812.16", add_special_tokens=False)["input_ids"]
    b = tok("x = 2812.16;", add_special_tokens=False)["input_ids"]
    assert any(b[i : i + len(a)] == a for i in range(len(b)))


def test_training_is_deterministic_and_respects_vocab_size() -> None:
    texts = ["hello world 123, the calculator says 42"] * 50 + ["another line of text"] * 20
    a, b = train_tokenizer(texts, vocab_size=300), train_tokenizer(texts, vocab_size=300)
    assert a.get_vocab() == b.get_vocab()
    assert len(a) <= 300 + len(TAG_TOKENS) + len(NUMBER_TOKENS)
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(texts, vocab_size=100)


def test_template_renders_tools_compactly_one_line_each() -> None:
    text = render_chat([system("Be brief."), user("2+2?")], [CALC_TOOL], generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n"
        'Tools, called as <tool_call>{"name": ..., "arguments": {...}}</tool_call>:\n'
        "- calculator(expression: string, ids?: array[string]): Evaluate arithmetic.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    # No system message: the tools get a system block of their own; no tools: no tools section.
    assert render_chat([user("hi")], [CALC_TOOL]).startswith("<|im_start|>system\nTools, called as")
    assert render_chat([user("hi")]) == "<|im_start|>user\nhi<|im_end|>\n"
    # Every tool result is its own turn (role `tool`), so nothing written earlier ever changes.
    two = render_chat(
        [user("q"), tool_result("1", call_id="a", name="x"), tool_result("2", call_id="b", name="x")]
    )
    assert two.endswith("<|im_start|>tool\n1<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n")


def test_hf_apply_chat_template_matches_render_chat() -> None:
    tok = tokenizer()
    msgs = [system("S"), user("U")]
    out = tok.apply_chat_template(
        [m.as_dict() for m in msgs], tools=[CALC_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert out == render_chat(msgs, [CALC_TOOL], generation_prompt=True)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_template_is_append_only_through_oracle_episodes(env_id: str) -> None:
    fmt = ChatFormat(tokenizer())
    for demo in demos()[env_id]:
        tr = to_transcript(fmt, demo)  # ChatFormat raises TemplateContinuityError if not append-only
        full = fmt.render(tr.messages, demo.tools, generation_prompt=False)
        # The token sequence decodes to the template's render (less the final newline after the last turn).
        assert fmt.decode(tr.token_ids) + "\n" == full
        assert list(tr.messages) == list(demo.messages)


def test_saved_tokenizer_loads_with_autotokenizer(tmp_path) -> None:
    tok = tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == CHAT_TEMPLATE
    text = render_chat([system("S"), user("What is 12 * 3.5?")], [CALC_TOOL], generation_prompt=True)
    assert (
        loaded(text, add_special_tokens=False)["input_ids"]
        == tok(text, add_special_tokens=False)["input_ids"]
    )


def test_task_template_drops_the_system_block_and_stays_append_only() -> None:
    msgs = [system("Long instructions."), user("What is 12 * 3.5?")]
    text = render_chat(msgs, [CALC_TOOL], generation_prompt=True, read_system=False)
    assert text == "<|im_start|>user\nWhat is 12 * 3.5?<|im_end|>\n<|im_start|>assistant\n"
    tok = train_tokenizer(["What is 12 * 3.5?"] * 20, vocab_size=300, read_system=False)
    out = tok.apply_chat_template(
        [m.as_dict() for m in msgs], tools=[CALC_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert out == text
    # Appending a tool result only appends text: the template stays append-only without a system block.
    longer = [*msgs, tool_result("42", call_id="c0", name="calculator")]
    assert render_chat(longer, [CALC_TOOL], read_system=False).startswith(
        text[: -len("<|im_start|>assistant\n")]
    )
