"""A tiny byte-level BPE tokenizer with ChatML special tokens, for chat-format tests (no downloads)."""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
CORPUS = [
    "hello world, this is a test of tools and calls.",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>',
    "The answer is <answer>4</answer>. Thinking <think>step by step</think> about numbers 0123456789.",
]


def tiny_tokenizer(template: str = "qwen2.5.jinja") -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = (TEMPLATES / template).read_text()
    return fast
