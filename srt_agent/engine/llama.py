"""The Llama/Qwen2 forward pass over a checkpoint's weights, written for the engine's needs.

Unlike the HF module, one forward takes several new tokens per row with explicit position ids, cache
write positions and an arbitrary attention bias, so prefill (causal), decode (one token) and
token-tree verification are the same call. Weights are stored fused (q|k|v and gate|up) to halve
the number of matmuls per layer, and transposed ((in, out) contiguous, the faster layout for CPU
matmuls with few rows); every HF parameter name maps to a view into that storage shaped like the
HF tensor, so loading and :meth:`CausalLM.load` (weight updates from the learner) are one
``copy_`` per tensor.

Decode on a small model is bound by per-op overhead as much as by matmuls, so the pass keeps the op
count low: the residual stream is 2-D ``(B*T, E)`` (no reshapes around matmuls; residual adds fused
into ``addmm``), q/k rows are stored in an interleaved layout so RoPE is one complex multiply (see
:func:`~srt_agent.engine.rope.interleave_rows`), and each layer writes the cache with one
``index_copy_``. GQA without repeating keys: the ``G = heads / kv_heads`` query heads that share a
key/value head are folded into the query-length dimension, so attention runs on
``(B, Hkv, G*T, D)`` queries against the cache's ``(B, Hkv, L, D)`` keys directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from srt_agent.engine.hf_checkpoint import ModelConfig, check_state_dict
from srt_agent.engine.kv_cache import KVCache
from srt_agent.engine.rope import apply_rope, interleave_rows, inverse_frequencies, rope_table

_GPU_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""Attention kernels the engine lets SDPA pick on a GPU (not cuDNN's: see :meth:`CausalLM.forward`)."""


def _attention_kernels(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """On a GPU, SDPA restricted to :data:`_GPU_ATTENTION`; elsewhere its default choice."""
    return sdpa_kernel(_GPU_ATTENTION) if device.type == "cuda" else contextlib.nullcontext()


@dataclass
class _Layer:
    # Matmul weights are stored transposed, (in, out) contiguous: on CPU, ``x @ W_t`` with this
    # layout runs about twice as fast as ``F.linear(x, W)`` for the few-row inputs of decoding.
    ln_attn: torch.Tensor  # (E,)
    wqkv_t: torch.Tensor  # (E, (H + 2*Hkv) * D)
    bqkv: torch.Tensor | None
    wo_t: torch.Tensor  # (H * D, E)
    bo: torch.Tensor | None
    ln_mlp: torch.Tensor  # (E,)
    w_gate_up_t: torch.Tensor  # (E, 2 * I)
    b_gate_up: torch.Tensor | None
    w_down_t: torch.Tensor  # (I, E)
    b_down: torch.Tensor | None


def _matmul(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight_t (+ bias)`` in one op."""
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


class CausalLM:
    """A decoder-only Llama/Qwen2 model as plain tensors with a cache-aware forward.

    Args:
        config: Parsed checkpoint config.
        state_dict: Every HF parameter (``lm_head.weight`` optional when tied).
        dtype: Compute and storage dtype.
        device: Device of weights and activations.
        max_positions: Positions covered by the RoPE table (the engine's context limit).

    Raises:
        CheckpointError: Missing, unknown or mis-shaped parameters.
    """

    def __init__(
        self,
        config: ModelConfig,
        state_dict: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
    ) -> None:
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        c = config
        e, d, inter = c.hidden_size, c.head_dim, c.intermediate_size
        qkv_out = (c.num_heads + 2 * c.num_kv_heads) * d

        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, device=self.device)

        self.norm = empty(e)
        self.lm_head_t = empty(e, c.vocab_size)  # (E, V)
        # Tied: the embedding is a (strided) view of the head; a lookup gathers few rows, so the
        # strides cost nothing, and one storage means an update can never untie them.
        self.embed = self.lm_head_t.t() if c.tie_word_embeddings else empty(c.vocab_size, e)  # (V, E)
        self.layers = [
            _Layer(
                ln_attn=empty(e),
                wqkv_t=empty(e, qkv_out),
                bqkv=empty(qkv_out) if c.qkv_bias else None,
                wo_t=empty(c.num_heads * d, e),
                bo=empty(e) if c.o_bias else None,
                ln_mlp=empty(e),
                w_gate_up_t=empty(e, 2 * inter),
                b_gate_up=empty(2 * inter) if c.mlp_bias else None,
                w_down_t=empty(inter, e),
                b_down=empty(e) if c.mlp_bias else None,
            )
            for _ in range(c.num_layers)
        ]
        self._views = self._parameter_views()
        self.load(state_dict, complete=True)
        positions = max_positions or c.max_position_embeddings
        self.rotations = rope_table(inverse_frequencies(c.rope, d), positions).to(self.device)  # (P, D/2)

    def _parameter_views(self) -> dict[str, torch.Tensor]:
        """HF name -> view into the engine's storage, shaped like the HF tensor (writing it loads it)."""
        c = self.config
        q, kv, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
        views = {
            "model.embed_tokens.weight": self.embed,
            "model.norm.weight": self.norm,
            "lm_head.weight": self.lm_head_t.t(),
        }
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            views[p + "input_layernorm.weight"] = layer.ln_attn
            views[p + "post_attention_layernorm.weight"] = layer.ln_mlp
            fused = {
                "self_attn.q_proj": (layer.wqkv_t, layer.bqkv, 0, q, c.num_heads),
                "self_attn.k_proj": (layer.wqkv_t, layer.bqkv, q, q + kv, c.num_kv_heads),
                "self_attn.v_proj": (layer.wqkv_t, layer.bqkv, q + kv, q + 2 * kv, 0),
                "self_attn.o_proj": (layer.wo_t, layer.bo, 0, layer.wo_t.shape[1], 0),
                "mlp.gate_proj": (layer.w_gate_up_t, layer.b_gate_up, 0, inter, 0),
                "mlp.up_proj": (layer.w_gate_up_t, layer.b_gate_up, inter, 2 * inter, 0),
                "mlp.down_proj": (layer.w_down_t, layer.b_down, 0, layer.w_down_t.shape[1], 0),
            }
            for name, (weight_t, bias, lo, hi, rope_heads) in fused.items():
                weight = weight_t[:, lo:hi].t()  # (out, in), HF's orientation
                # q/k rows (rope_heads > 0) go into the interleaved RoPE layout.
                views[p + name + ".weight"] = interleave_rows(weight, rope_heads) if rope_heads else weight
                if bias is not None:
                    views[p + name + ".bias"] = (
                        interleave_rows(bias[lo:hi], rope_heads) if rope_heads else bias[lo:hi]
                    )
        return views

    @torch.inference_mode()
    def load(self, state_dict: Mapping[str, torch.Tensor], *, complete: bool = False) -> None:
        """Copy HF-named parameters into the model (all of them, or any subset).

        Args:
            state_dict: HF name to tensor (any dtype/device; converted).
            complete: Require every parameter (initial load) instead of accepting a subset.

        Raises:
            CheckpointError: Unknown names, wrong shapes, or (``complete``) missing parameters.
                Nothing is copied when this is raised.
        """
        accepted = check_state_dict(self.config, state_dict, complete=complete)
        for name, tensor in accepted.items():
            view = self._views[name]
            view.copy_(tensor.detach().reshape(view.shape))

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        row_start: int | torch.Tensor,
        write_positions: torch.Tensor,
        attn_bias: torch.Tensor,
        logit_index: torch.Tensor | None = None,
        hidden_only: bool = False,
    ) -> torch.Tensor:
        """Run new tokens of rows ``row_start ..`` through the model, reading and extending the cache.

        On a GPU, attention avoids cuDNN's kernel: it builds an execution plan per input shape,
        and the engine's eager forwards (prefills, steps too wide for a graph) change shape nearly
        every call, so that planning cost more than the attention itself (measured on an H200:
        plain rollouts ran 2-3x slower in bfloat16 with it than in float32, which cuDNN does not
        take). Flash and memory-efficient attention have no per-shape setup.

        Args:
            input_ids: ``(B, T)`` new token ids.
            positions: ``(B, T)`` RoPE position of each new token.
            cache: The KV cache; rows ``row_start .. row_start + B - 1`` are this batch.
            row_start: First cache row of the batch, or a ``(B,)`` int64 tensor of its rows (any
                rows: their keys and values are gathered; how a captured prefill takes its rows).
            write_positions: ``(B, T)`` cache position each new token's key/value is stored at.
            attn_bias: ``(B, 1, T, L)`` additive bias (0 or -inf) over cache positions ``0 .. L-1``,
                which must include the new tokens' write positions.
            logit_index: Optional ``(B,)``: compute logits only at this new-token index per row.
            hidden_only: Return the final normed hidden states ``(B, T, E)`` instead of logits;
                :meth:`head` turns any of them into logits (a verify step needs logits only
                where its tree walk goes).

        The cache must already hold ``row_start + B`` rows and ``max(write_positions) + 1``
        positions (:meth:`KVCache.reserve`). Positions past the RoPE table (only padding tokens can
        have them) are clamped; their outputs are meaningless and must be ignored.

        Returns:
            ``(B, T, V)`` logits, or ``(B, V)`` with ``logit_index``, or ``(B, T, E)`` with ``hidden_only``.
        """
        with _attention_kernels(self.device):
            c = self.config
            b, t = input_ids.shape
            n = b * t
            h, hkv, d = c.num_heads, c.num_kv_heads, c.head_dim
            g = h // hkv
            length = attn_bias.shape[-1]
            e = c.hidden_size
            table = self.rotations
            rotations = table[positions.reshape(-1).clamp(max=table.shape[0] - 1)].unsqueeze(1)  # (N, 1, D/2)
            write_index = cache.write_index(row_start, write_positions)
            # The G query heads of a kv head are folded into the query dimension: repeat the bias.
            bias = attn_bias.repeat(1, 1, g, 1) if g > 1 else attn_bias  # (B, 1, G*T, L)
            x = F.embedding(input_ids.reshape(-1), self.embed)  # (N, E)
            for i, layer in enumerate(self.layers):
                hs = F.rms_norm(x, (e,), layer.ln_attn, c.rms_norm_eps)
                qkv = _matmul(hs, layer.wqkv_t, layer.bqkv).view(n, h + 2 * hkv, d)
                qk = apply_rope(qkv[:, : h + hkv], rotations)  # (N, H + Hkv, D)
                kv = torch.cat((qk[:, h:], qkv[:, h + hkv :]), dim=1)  # (N, 2*Hkv, D): keys, values
                cache.write(i, write_index, kv)
                keys, values = cache.read(i, row_start, b, length)  # (B, Hkv, L, D)
                if t == 1:
                    q = qk[:, :h].view(b, hkv, g, d)  # (B, Hkv, G, D), a view
                else:  # (B, T, Hkv, G, D) -> (B, Hkv, G, T, D) -> (B, Hkv, G*T, D)
                    q = qk[:, :h].reshape(b, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)  # (B, Hkv, G*T, D)
                if t == 1:
                    o = o.reshape(n, h * d)
                else:
                    o = o.view(b, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(n, h * d)
                x = torch.addmm(x, o, layer.wo_t)  # residual add fused into the matmul
                if layer.bo is not None:
                    x = x + layer.bo
                hs = F.rms_norm(x, (e,), layer.ln_mlp, c.rms_norm_eps)
                gate_up = _matmul(hs, layer.w_gate_up_t, layer.b_gate_up)  # (N, 2*I)
                inter = gate_up.shape[-1] // 2
                x = torch.addmm(x, F.silu(gate_up[:, :inter]) * gate_up[:, inter:], layer.w_down_t)
                if layer.b_down is not None:
                    x = x + layer.b_down
            if logit_index is not None:
                x = x[torch.arange(b, device=x.device) * t + logit_index]  # (B, E)
                return self.head(F.rms_norm(x, (e,), self.norm, c.rms_norm_eps))
            hidden = F.rms_norm(x, (e,), self.norm, c.rms_norm_eps)
            if hidden_only:
                return hidden.view(b, t, e)
            return self.head(hidden).view(b, t, -1)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``(K, V)`` of final normed hidden states ``(K, E)`` (see ``hidden_only``)."""
        return torch.mm(hidden, self.lm_head_t)
