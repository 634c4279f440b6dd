"""The trained model: an HF causal LM, optionally with a value head, and the frozen reference.

The learner trains the ordinary Hugging Face model (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ...)
loaded from the run's model directory, so a checkpoint is again an HF directory that every other
command (``srt-agent eval --model``) loads. For GAE the critic is a linear value head on the
policy's last hidden states (a shared trunk, as in InstructGPT-style PPO with a small model); its
weights are saved next to the model as ``value_head.pt``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

VALUE_HEAD_FILE = "value_head.pt"
"""File of the value head's state dict inside a saved policy directory."""


@dataclass(frozen=True)
class PolicyOutput:
    """One forward, evaluated only where the policy sampled the next token.

    A multi-turn episode is mostly prompt, tool and observation tokens; the output layer (and its
    softmax, the largest cost of a small model's backward) runs only at the ``N`` positions whose
    next token has loss mask 1, in row-major order: the same order as ``token_ids[loss_mask == 1]``.

    Attributes:
        logits: ``(N, V)`` logits of the distributions the ``N`` sampled tokens were drawn from.
        values: ``(N,)`` critic values of those states (``V(t)`` of GAE), or ``None`` without a
            value head.
    """

    logits: Tensor
    values: Tensor | None


def unpack(packed: Tensor, loss_mask: Tensor) -> Tensor:
    """Place ``(N,)`` per-sampled-token values at their ``(B, T)`` positions (0 elsewhere).

    Differentiable in ``packed``.

    Raises:
        ValueError: ``N`` differs from the number of 1s in ``loss_mask``.
    """
    where = loss_mask.bool()
    if int(where.sum()) != packed.numel():
        raise ValueError(f"{packed.numel()} values for {int(where.sum())} sampled tokens")
    zeros = torch.zeros(loss_mask.shape, dtype=packed.dtype, device=packed.device)
    return zeros.masked_scatter(where, packed)


def _quiet_transformers() -> None:
    """Silence transformers' per-load progress bars (they would break the trainer's own)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    logging.getLogger("transformers").setLevel(logging.ERROR)


def load_causal_lm(model_dir: str | Path, device: torch.device) -> nn.Module:
    """An HF causal LM from a directory, in float32 on ``device``, in train mode.

    Raises:
        OSError: The directory holds no loadable model (transformers' message names the file).
    """
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    model: nn.Module = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.to(device)


class PolicyModel(nn.Module):
    """An HF causal LM plus an optional scalar value head on its final hidden states.

    Args:
        lm: The causal LM (``base_model_prefix`` names its decoder, ``lm_head`` its output layer).
        value_head: Add a critic head (for GAE), initialised to output 0.
    """

    def __init__(self, lm: nn.Module, *, value_head: bool = False) -> None:
        super().__init__()
        self.lm = lm
        hidden = int(self.hf.config.hidden_size)
        self.value_head: nn.Linear | None = None
        if value_head:
            head = nn.Linear(hidden, 1, device=next(lm.parameters()).device)
            nn.init.zeros_(head.weight)  # V = 0 at the start: rewards are in [0, 1], returns near it
            nn.init.zeros_(head.bias)
            self.value_head = head

    @property
    def hf(self) -> Any:
        """The causal LM as its HF class (for ``config``, ``lm_head``, ``save_pretrained``)."""
        return self.lm

    @classmethod
    def load(cls, model_dir: str | Path, device: torch.device, *, value_head: bool = False) -> PolicyModel:
        """Load from a model directory (and its ``value_head.pt``, if saved with one)."""
        policy = cls(load_causal_lm(model_dir, device), value_head=value_head)
        head_file = Path(model_dir) / VALUE_HEAD_FILE
        if policy.value_head is not None and head_file.is_file():
            policy.value_head.load_state_dict(torch.load(head_file, map_location=device, weights_only=True))
        return policy

    def forward(self, token_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> PolicyOutput:
        """Logits (and values) at the states the sampled tokens came from.

        Args:
            token_ids: ``(B, T)`` int64, right-padded.
            attention_mask: ``(B, T)``, 1 on real tokens.
            loss_mask: ``(B, T)``, 1 on tokens the policy sampled (never position 0: every
                episode starts with its prompt).

        Returns:
            The :class:`PolicyOutput` of the ``N = loss_mask.sum()`` sampled tokens.

        Raises:
            ValueError: ``loss_mask`` marks position 0, or ``attention_mask`` is not right-padding
                (a 0 before a 1 in some row).

        The decoder runs causal attention without the padding mask. Under right padding that is
        exact for every real token (a token attends only to positions before it, all real; positions
        are 0, 1, ... either way), and only the padding's own outputs, which no loss reads, change.
        It lets attention take its causal kernel instead of reading a ``(B, 1, T, T)`` mask: on CPU
        the forward and backward of a 4 x 2,000-token micro-batch take ~30% less time.
        """
        if bool(loss_mask[:, 0].any()):
            raise ValueError("loss_mask[:, 0] is 1: a sampled first token has no state it was sampled from")
        if bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
            raise ValueError("attention_mask is not right-padded: a padding position precedes a real token")
        hf = self.hf
        base = getattr(hf, hf.base_model_prefix)  # the decoder ("model" for Llama and Qwen2)
        hidden = base(input_ids=token_ids, use_cache=False).last_hidden_state
        states = hidden[:, :-1][loss_mask[:, 1:].bool()]  # (N, H): position t - 1 predicts token t
        logits: Tensor = hf.lm_head(states)  # (N, V)
        values = None if self.value_head is None else self.value_head(states).squeeze(-1).float()  # (N,)
        return PolicyOutput(logits=logits, values=values)

    def lm_state_dict(self) -> dict[str, Tensor]:
        """The causal LM's parameters under their HF names (what the engine's ``update_weights`` takes)."""
        return {name: p.detach() for name, p in self.lm.state_dict().items()}

    def save(self, out_dir: str | Path, tokenizer: Any = None) -> None:
        """Write an HF model directory (plus ``value_head.pt`` and the tokenizer, when given)."""
        out = Path(out_dir)
        self.hf.save_pretrained(out)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        if self.value_head is not None:
            torch.save(self.value_head.state_dict(), out / VALUE_HEAD_FILE)


def load_reference(model_dir: str | Path, device: torch.device) -> PolicyModel:
    """The frozen reference policy for the KL term: the run's starting checkpoint, in eval mode.

    Always the starting checkpoint (``model.dir``), also when a run resumes from a later one.
    """
    ref = PolicyModel(load_causal_lm(model_dir, device))
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
