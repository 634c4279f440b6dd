"""A tiny byte-level BPE tokenizer with ChatML special tokens, and a tiny Llama over it (no downloads)."""

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


def save_tiny_llama(path: Path, *, seed: int = 0, tie_word_embeddings: bool = True) -> Path:
    """A 1-layer random Llama over :func:`tiny_tokenizer`, saved with it in ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), bos_token_id=None, pad_token_id=0,
        tie_word_embeddings=tie_word_embeddings,
    )  # fmt: skip
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path
