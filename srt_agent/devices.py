"""Naming the torch device a component runs on."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """The torch device named ``name`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``), checked to be usable.

    ``auto`` is CUDA when torch sees a GPU, else the CPU.

    Raises:
        ValueError: Not a device name, or CUDA asked for without a CUDA-enabled torch and a GPU.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use 'auto', 'cpu' or 'cuda' (or 'cuda:N')") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA GPU here; use 'cpu' or 'auto'")
    return device
