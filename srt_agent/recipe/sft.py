"""Supervised fine-tuning on token sequences with a loss mask (loss on the policy's tokens only).

Batches are padded, not packed: sequences of one group (env) and similar length are batched together
so that padding stays small, and each row attends only to its own tokens, so no attention crosses a
sequence boundary (packing several sequences into one row would need block-diagonal masks, whose
quadratic cost on long rows outweighs the padding saved on these short demos).

Sequences of one env share a long prompt prefix (system prompt and tool list: ~40% of a Calculator
demo). Its forward pass runs once per batch, and its keys and values are repeated for every row, so
the rows only run their own suffixes. This is exact (the test compares losses and gradients with the
plain forward) and about 1.5x faster.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from transformers import PreTrainedModel

from srt_agent.devices import resolve_device
from srt_agent.output.console import Heartbeat

IGNORE_INDEX = -100
"""Label of tokens without loss (the ``ignore_index`` of ``torch.nn.functional.cross_entropy``)."""


@dataclass(frozen=True)
class Example:
    """One training sequence.

    Attributes:
        token_ids: The whole sequence.
        loss_mask: 1 where the token is trained on (the policy's tokens), 0 elsewhere.
        group: Batches never mix groups (use the env id: its sequences share a prompt prefix).
        weights: Loss weight of each token (0 off the loss mask); ``None`` means the loss mask.
    """

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    group: str = ""
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.loss_mask):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.loss_mask)} loss-mask entries")
        if self.weights is not None:
            if len(self.weights) != len(self.token_ids):
                raise ValueError(f"{len(self.token_ids)} token ids but {len(self.weights)} weights")
            if any(w != 0 for w, m in zip(self.weights, self.loss_mask, strict=True) if not m):
                raise ValueError("a token off the loss mask has a non-zero weight")


@dataclass(frozen=True)
class SFTConfig:
    """Optimisation settings.

    Attributes:
        steps: Optimizer steps.
        batch_tokens: Most tokens per batch, padding included (rows x longest row).
        lr: Peak learning rate (AdamW).
        warmup_steps: Linear warm-up from 0 to ``lr``.
        min_lr_ratio: The cosine decay ends at ``lr * min_lr_ratio``.
        weight_decay: AdamW weight decay (not applied to norms and biases).
        grad_clip: Clip the global gradient norm to this.
        seed: Seeds the data order.
        share_prefix: Run a prompt prefix shared by a batch's rows once (exact, faster).
        device: Where to train (``"cpu"``, ``"cuda"``, ``"cuda:1"``); the model is moved there.
        bf16: On a CUDA device, run forwards and backwards in bfloat16 autocast (float32 weights
            and optimizer state): the tensor cores' rate, for models large enough to use it.
    """

    steps: int = 200
    batch_tokens: int = 4096
    lr: float = 3e-3
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    share_prefix: bool = True
    device: str = "cpu"
    bf16: bool = False


@dataclass(frozen=True)
class SFTStats:
    """What training did.

    Attributes:
        steps: Optimizer steps taken.
        tokens: Real (non-padding) tokens processed.
        loss_tokens: Tokens that carried loss.
        losses: Loss of every step (plain mean negative log-likelihood over its loss tokens,
            whatever the weights).
        final_loss: Mean loss of the last 10% of steps.
        seconds: Wall-clock time of the loop.
    """

    steps: int
    tokens: int
    loss_tokens: int
    losses: tuple[float, ...]
    final_loss: float
    seconds: float

    def after(self, earlier: SFTStats) -> SFTStats:
        """Both phases as one run: ``earlier``'s steps first (its final loss is not this run's)."""
        return SFTStats(
            steps=earlier.steps + self.steps,
            tokens=earlier.tokens + self.tokens,
            loss_tokens=earlier.loss_tokens + self.loss_tokens,
            losses=earlier.losses + self.losses,
            final_loss=self.final_loss,
            seconds=earlier.seconds + self.seconds,
        )


def batches(
    examples: Sequence[Example], batch_tokens: int, rng: np.random.Generator
) -> Iterator[list[Example]]:
    """Endless batches: each epoch shuffles, batches one group's similar lengths, and shuffles batches.

    A batch holds at most ``batch_tokens`` tokens (rows x longest row), except that an example longer
    than that is a batch of its own: a small budget keeps the many short demos in many small steps
    without dropping the few long ones (Retail episodes).

    Raises:
        ValueError: No examples, or ``batch_tokens`` < 1.
    """
    if not examples:
        raise ValueError("no training examples")
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    while True:
        order = rng.permutation(len(examples))
        # Sort within windows of the shuffled order: one group's similar lengths share a batch (little
        # padding, a shared prefix) while the epoch still mixes tasks and envs.
        window = 256
        epoch: list[list[Example]] = []
        for w in range(0, len(order), window):
            chunk = sorted(
                (examples[i] for i in order[w : w + window]), key=lambda e: (e.group, len(e.token_ids))
            )
            batch: list[Example] = []
            for ex in chunk:
                full = (len(batch) + 1) * len(ex.token_ids) > batch_tokens
                if batch and (full or ex.group != batch[0].group):
                    epoch.append(batch)
                    batch = []
                batch.append(ex)
            epoch.append(batch)
        for i in rng.permutation(len(epoch)):
            yield epoch[i]


def collate(batch: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded model inputs with per-token labels and loss weights.

    Returns:
        ``input_ids``, ``attention_mask``, ``labels`` (IGNORE_INDEX off the loss mask) and
        ``weights`` (per-token loss weights, 0 off the loss mask and on padding), each (B, T).
    """
    width = max(len(e.token_ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # (B, T)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    weights = torch.zeros((len(batch), width), dtype=torch.float32)
    for row, e in enumerate(batch):
        n = len(e.token_ids)
        ids[row, :n] = torch.tensor(e.token_ids)
        attn[row, :n] = 1
        mask = torch.tensor(e.loss_mask, dtype=torch.bool)
        labels[row, :n] = torch.where(mask, ids[row, :n], IGNORE_INDEX)
        weights[row, :n] = torch.tensor(
            e.weights if e.weights is not None else e.loss_mask, dtype=torch.float32
        )
    return {"input_ids": ids, "attention_mask": attn, "labels": labels, "weights": weights}


MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are not worth a separate forward pass."""


def shared_prefix(batch: Sequence[Example]) -> int:
    """Length of the prompt prefix all rows share, 0 if too short to be worth sharing.

    The prefix holds no loss token, nor does the token right after it (its label would need the
    prefix's last logits), and every row keeps at least two tokens of its own.
    """
    if len(batch) < 2:
        return 0
    first, limit = batch[0], min(len(e.token_ids) for e in batch) - 2
    n = 0
    while n < limit and all(e.token_ids[n] == first.token_ids[n] and e.loss_mask[n + 1] == 0 for e in batch):
        n += 1
    return n if n >= MIN_SHARED_PREFIX else 0


def batch_loss(
    model: PreTrainedModel, inputs: dict[str, torch.Tensor], prefix: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted and plain mean loss over the label tokens, running a shared ``prefix`` only once.

    Args:
        model: A causal LM.
        inputs: :func:`collate` output.
        prefix: Shared prefix length (:func:`shared_prefix`); 0 runs the plain forward.

    Returns:
        The loss to optimise (mean negative log-likelihood weighted by ``weights``) and the plain
        mean negative log-likelihood over the loss-mask tokens (to report).
    """
    ids, attn = inputs["input_ids"], inputs["attention_mask"]  # (B, T)
    base = model.base_model
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]  # untyped in transformers
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (LM head)")
    cache = None
    if prefix:
        # One row's prefix, with its keys/values repeated per row; gradients flow back through them.
        out = base(input_ids=ids[:1, :prefix], use_cache=True)
        # transformers 5.x names the output's cache `cache` (the old name warns); 4.x `past_key_values`.
        cache = out["cache"] if "cache" in out else out.past_key_values  # noqa: SIM401 - no eager default
        cache.batch_repeat_interleave(ids.shape[0])
    # With a cache, positions continue after the prefix; the mask covers prefix + own tokens.
    # The same rename for the forward argument.
    name = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    hidden = base(input_ids=ids[:, prefix:], attention_mask=attn, **{name: cache}).last_hidden_state
    labels = inputs["labels"][:, prefix + 1 :]  # (B, T'): token t is predicted from position t - 1
    valid = labels != IGNORE_INDEX
    # The LM head (a large share of a small model's compute) runs only where there is a label.
    logits = head(hidden[:, :-1][valid])  # (N, V)
    nll = F.cross_entropy(logits.float(), labels[valid], reduction="none")  # (N,)
    weights = inputs["weights"][:, prefix + 1 :][valid]
    weighted = (nll * weights).sum() / weights.sum().clamp(min=1e-9)
    return weighted, nll.mean()


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Learning-rate multiplier at ``step``: linear warm-up, then cosine decay to ``min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _optimizer(model: torch.nn.Module, cfg: SFTConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def train(
    model: PreTrainedModel,
    examples: Sequence[Example],
    cfg: SFTConfig,
    *,
    pad_id: int,
    show_progress: bool = True,
) -> SFTStats:
    """Train ``model`` in place on ``examples`` (loss on their loss-mask tokens only).

    Args:
        model: A causal LM.
        examples: Training sequences.
        cfg: Optimisation settings.
        pad_id: Token id used for padding (never attended to, never trained on).
        show_progress: Show a rich progress bar with the loss.

    Returns:
        Loss curve and token counts.
    """
    rng = np.random.default_rng(cfg.seed)
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        # TF32 matmuls on a GPU (float32 weights and optimizer state; ~3x the matmul rate of strict
        # float32). CPU builds are untouched and stay bit-reproducible per seed and threads.
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.nn.Module.to(model, device)  # (transformers types PreTrainedModel.to too narrowly)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if cfg.bf16 and device.type == "cuda"
        else contextlib.nullcontext()
    )
    opt = _optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, cfg))
    model.train()
    losses: list[float] = []
    tokens = loss_tokens = 0
    t0 = time.perf_counter()
    columns = (
        TextColumn("[bold]SFT[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}  {task.fields[tps]:,.0f} tok/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, disable=not show_progress) as progress:
        task = progress.add_task("sft", total=cfg.steps, loss=float("nan"), tps=0.0)
        beat = Heartbeat(progress.console, "SFT step", cfg.steps) if show_progress else None
        for _, batch in zip(range(cfg.steps), batches(examples, cfg.batch_tokens, rng), strict=False):
            inputs = {k: v.to(device) for k, v in collate(batch, pad_id).items()}
            with autocast:
                loss, plain = batch_loss(model, inputs, shared_prefix(batch) if cfg.share_prefix else 0)
            torch.autograd.backward(loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(plain.detach()))
            tokens += int(inputs["attention_mask"].sum())
            loss_tokens += int((inputs["labels"] != IGNORE_INDEX).sum())
            smooth = sum(losses[-10:]) / len(losses[-10:])
            tps = tokens / (time.perf_counter() - t0)
            progress.update(task, advance=1, loss=smooth, tps=tps)
            if beat is not None:
                beat.update(len(losses), f"loss {smooth:.3f} {tps:,.0f} tok/s")
    model.train(False)
    tail = losses[-max(1, len(losses) // 10) :]
    return SFTStats(
        steps=len(losses),
        tokens=tokens,
        loss_tokens=loss_tokens,
        losses=tuple(losses),
        final_loss=sum(tail) / len(tail),
        seconds=time.perf_counter() - t0,
    )
