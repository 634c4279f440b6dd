"""One error for every flash-attn helper the CI stand-in names."""

from typing import Any


def absent(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"flash_attn.{name} is a CI stand-in: flash-attn needs CUDA; run OpenRLHF without "
            "--ds.packing_samples here"
        )

    call.__name__ = name
    return call
