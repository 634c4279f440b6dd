"""Reading an HF-format Llama/Qwen2-family checkpoint directory: its config and its weights.

The engine runs its own forward pass, so it needs exactly the facts that shape that pass (sizes,
biases, RoPE) and the raw tensors by their HF names. Both the transformers 4.x config layout
(``rope_theta`` + ``rope_scaling``) and the 5.x one (``rope_parameters``) are read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from srt_agent.errors import SrtAgentError

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class CheckpointError(SrtAgentError, ValueError):
    """The checkpoint directory cannot be loaded by the engine (message names the problem and fix)."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding settings.

    Attributes:
        theta: Base of the geometric frequency ladder (``rope_theta``).
        rope_type: ``default``, ``linear`` (positions divided by ``factor``) or ``llama3``.
        factor: Scaling factor of ``linear`` / ``llama3``.
        low_freq_factor: ``llama3`` only.
        high_freq_factor: ``llama3`` only.
        original_max_position_embeddings: ``llama3`` only: the pre-extension context.
    """

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """The facts of a checkpoint that shape the forward pass.

    Attributes:
        architecture: ``LlamaForCausalLM`` or ``Qwen2ForCausalLM``.
        vocab_size: Rows of the embedding and the LM head.
        hidden_size: Residual stream width.
        intermediate_size: MLP width.
        num_layers: Decoder layers.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (GQA when fewer than ``num_heads``).
        head_dim: Width of one head.
        rms_norm_eps: Epsilon of every RMSNorm.
        max_position_embeddings: The model's context length.
        tie_word_embeddings: The LM head reuses the input embedding.
        qkv_bias: q/k/v projections have biases (always for Qwen2; ``attention_bias`` for Llama).
        o_bias: The output projection has a bias (Llama ``attention_bias``).
        mlp_bias: gate/up/down projections have biases (Llama ``mlp_bias``).
        rope: Rotary embedding settings.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    rope: RopeConfig

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ModelConfig:
        """Build from the contents of an HF ``config.json``.

        Args:
            raw: The parsed JSON object.

        Returns:
            The config.

        Raises:
            CheckpointError: Unsupported architecture, activation, sliding window or RoPE type.
        """
        archs = list(raw.get("architectures") or [])
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            model_type = raw.get("model_type")
            by_type = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
            if not archs and model_type in by_type:
                arch = by_type[model_type]
            elif model_type in by_type:
                raise CheckpointError(
                    f"architectures {archs} is not a causal LM (no LM head); TorchEngine needs a checkpoint "
                    f"saved from {by_type[model_type]}"
                )
            else:
                raise CheckpointError(
                    f"unsupported architecture {archs or model_type!r}: TorchEngine runs causal LMs of "
                    f"{sorted(SUPPORTED_ARCHITECTURES)}; convert the checkpoint or use another engine"
                )
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"unsupported hidden_act {act!r}: TorchEngine implements 'silu' only")
        if arch == "Qwen2ForCausalLM" and raw.get("use_sliding_window", False):
            raise CheckpointError(
                "use_sliding_window=true is not supported by TorchEngine; set it to false in config.json "
                "(full attention) if the model tolerates it"
            )
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        attention_bias = bool(raw.get("attention_bias", False))
        is_qwen = arch == "Qwen2ForCausalLM"
        return cls(
            architecture=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=True if is_qwen else attention_bias,
            o_bias=False if is_qwen else attention_bias,
            mlp_bias=False if is_qwen else bool(raw.get("mlp_bias", False)),
            rope=_rope_config(raw),
        )

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF parameter names of this model and their shapes (``lm_head.weight`` even when tied)."""
        e, d = self.hidden_size, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (self.vocab_size, e),
            "model.norm.weight": (e,),
            "lm_head.weight": (self.vocab_size, e),
        }
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (e,)
            shapes[p + "post_attention_layernorm.weight"] = (e,)
            proj = {
                "self_attn.q_proj": (self.num_heads * d, e, self.qkv_bias),
                "self_attn.k_proj": (self.num_kv_heads * d, e, self.qkv_bias),
                "self_attn.v_proj": (self.num_kv_heads * d, e, self.qkv_bias),
                "self_attn.o_proj": (e, self.num_heads * d, self.o_bias),
                "mlp.gate_proj": (self.intermediate_size, e, self.mlp_bias),
                "mlp.up_proj": (self.intermediate_size, e, self.mlp_bias),
                "mlp.down_proj": (e, self.intermediate_size, self.mlp_bias),
            }
            for name, (out_f, in_f, bias) in proj.items():
                shapes[p + name + ".weight"] = (out_f, in_f)
                if bias:
                    shapes[p + name + ".bias"] = (out_f,)
        return shapes


def _rope_config(raw: Mapping[str, Any]) -> RopeConfig:
    # transformers 5.x: rope_parameters holds theta and the scaling; 4.x: rope_theta + rope_scaling.
    params = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = float(merged.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = str(merged.get("rope_type", merged.get("type", "default")))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            f"unsupported rope scaling type {rope_type!r}: TorchEngine implements {SUPPORTED_ROPE_TYPES}; "
            "remove or change rope_scaling/rope_parameters in config.json or use another engine"
        )
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(merged.get("original_max_position_embeddings", 8192)),
    )


def read_config(model_dir: str | Path) -> ModelConfig:
    """Read and check ``config.json`` of a checkpoint directory.

    Args:
        model_dir: Directory written by ``save_pretrained``.

    Returns:
        The parsed config.

    Raises:
        CheckpointError: The directory or its config is missing, unreadable or unsupported.
    """
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(
            f"model directory {str(path)!r} does not exist or is not a directory; pass the folder "
            "written by save_pretrained (with config.json and *.safetensors)"
        )
    config_path = path / "config.json"
    if not config_path.is_file():
        raise CheckpointError(
            f"{str(path)!r} has no config.json: it is not an HF checkpoint directory; pass the folder "
            "written by save_pretrained"
        )
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON: {exc}") from exc
    try:
        return ModelConfig.from_dict(raw)
    except KeyError as exc:
        raise CheckpointError(f"{config_path} lacks the field {exc.args[0]!r} of a causal LM config") from exc


def _weight_files(path: Path) -> list[Path]:
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            return [path / f for f in sorted(set(weight_map.values()))]
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (path / single).is_file():
            return [path / single]
    raise CheckpointError(
        f"{str(path)!r} has no weights (model.safetensors, pytorch_model.bin or a sharded index); "
        "save the model with save_pretrained"
    )


def read_state_dict(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Load every tensor of a checkpoint directory by its HF name (on CPU, stored dtype).

    Args:
        model_dir: Directory written by ``save_pretrained``.

    Returns:
        Name to tensor.

    Raises:
        CheckpointError: No weight files found.
    """
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in _weight_files(Path(model_dir)):
        if file.suffix == ".safetensors":
            tensors.update(load_file(str(file)))
        else:
            tensors.update(torch.load(file, map_location="cpu", weights_only=True))
    return tensors


def check_state_dict(
    config: ModelConfig, state_dict: Mapping[str, torch.Tensor], *, complete: bool
) -> dict[str, torch.Tensor]:
    """Check names and shapes of HF parameters against a config.

    Args:
        config: The model config.
        state_dict: HF name to tensor; a few known non-parameters (``rotary_emb.inv_freq``) are ignored.
        complete: Require every parameter (loading a checkpoint) rather than any subset (an update).

    Returns:
        The accepted entries (ignored buffers dropped).

    Raises:
        CheckpointError: An unknown name, a wrong shape or (with ``complete``) a missing parameter.
    """
    shapes = config.parameter_shapes()
    accepted: dict[str, torch.Tensor] = {}
    unknown = []
    for name, tensor in state_dict.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name not in shapes:
            unknown.append(name)
            continue
        if tuple(tensor.shape) != shapes[name]:
            raise CheckpointError(
                f"parameter {name!r} has shape {tuple(tensor.shape)}, the model expects {shapes[name]}"
            )
        accepted[name] = tensor
    if unknown:
        raise CheckpointError(
            f"unknown parameter names {sorted(unknown)[:5]} (of {len(unknown)}): expected HF names of a "
            f"{config.architecture}, e.g. 'model.layers.0.self_attn.q_proj.weight'"
        )
    if complete:
        optional = {"lm_head.weight"} if config.tie_word_embeddings else set()
        missing = sorted(set(shapes) - set(accepted) - optional)
        if missing:
            raise CheckpointError(
                f"checkpoint lacks parameters {missing[:5]} (of {len(missing)}); it does not match its "
                "config.json"
            )
    return accepted
