"""The tokenizer the engine needs: token ids back to text (stop strings, tool-call grammars)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Detokenizer(Protocol):
    """The one tokenizer method stop strings need (HF tokenizers have it)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str | list[str]:
        """Text of ``token_ids`` (HF annotates a list return for batched input, unused here)."""
        ...


def load_tokenizer(model_dir: str | Path) -> Detokenizer | None:
    """Load the HF tokenizer saved next to a checkpoint, if there is one.

    Args:
        model_dir: Checkpoint directory.

    Returns:
        The tokenizer, or ``None`` when the directory has no tokenizer files.
    """
    path = Path(model_dir)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    tokenizer: Detokenizer = AutoTokenizer.from_pretrained(str(path))
    return tokenizer
