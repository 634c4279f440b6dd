"""Randomly initialised HF checkpoints (and a character tokenizer) for tests and benchmarks.

No pretrained model can be downloaded on the project's machines, so the engine's tests and its
benchmark write small random Llama/Qwen2 checkpoints with ``save_pretrained``: the same directory
format, and the same loading code path, as a real checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

# Roughly the project's embedded default model: ~6M parameters, 4k vocabulary, 4k context.
EMBEDDED_LIKE: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

# A tiny model for fast tests: GQA (4 query heads share 2 kv heads), untied head.
TINY: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


# Shaped like Qwen2.5-0.5B (~0.5B parameters, GQA 14:2, q/k/v biases): a GPU-sized benchmark model.
QWEN05B_LIKE: dict[str, Any] = {
    "architecture": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "init_std": 0.02,
}

SHAPES: dict[str, dict[str, Any]] = {"embedded": EMBEDDED_LIKE, "qwen2.5-0.5b": QWEN05B_LIKE}
"""Random model shapes by name (``srt-agent bench engine --shape``)."""


def save_random_model(
    path: str | Path,
    *,
    architecture: Literal["llama", "qwen2"] = "llama",
    init_std: float = 0.1,
    seed: int = 0,
    **config: Any,
) -> Path:
    """Write a randomly initialised causal LM checkpoint with ``save_pretrained``.

    Args:
        path: Output directory (created).
        architecture: ``llama`` (LlamaForCausalLM) or ``qwen2`` (Qwen2ForCausalLM, q/k/v biases).
        init_std: Std of the normal init of every parameter. Larger than HF's 0.02 so the
            logits are peaked (greedy tests then have no near-ties that rounding could flip).
        seed: Seed of the init.
        **config: Config fields overriding :data:`TINY`.

    Returns:
        The directory.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    fields = {**TINY, **config}
    torch.manual_seed(seed)
    model: LlamaForCausalLM | Qwen2ForCausalLM
    if architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(**fields))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**fields))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)  # RMSNorm gains near 1, but not exactly (catch a missed gain)
            else:
                param.normal_(0.0, init_std)
    out = Path(path)
    model.save_pretrained(out)
    return out


def char_tokenizer(vocab_size: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz .,!?0123456789") -> Any:
    """An HF fast tokenizer mapping token ``i`` to one character (``<i>`` past the alphabet).

    Args:
        vocab_size: Number of tokens (the model's vocabulary).
        alphabet: Characters of the first token ids.

    Returns:
        A ``PreTrainedTokenizerFast`` whose ``decode`` concatenates the tokens' characters.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    pieces = [alphabet[i] if i < len(alphabet) else f"<{i}>" for i in range(vocab_size)]
    backend = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token=pieces[-1]))
    backend.decoder = decoders.Fuse()  # join tokens without separators
    return PreTrainedTokenizerFast(tokenizer_object=backend)  # type: ignore[no-untyped-call]
