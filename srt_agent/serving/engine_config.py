"""Which engine rolls out (``engine`` in a run config): the in-process one, or a server over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["EngineConfig"]


class EngineConfig(BaseModel):
    """The rollout engine.

    ``kind: torch`` loads the model into this process (:class:`~srt_agent.engine.torch_engine.TorchEngine`,
    drafting from the run's tree cache). ``kind: sglang`` sends every generation to a server with
    SGLang's native API at ``url``: SGLang with srt-agent's drafter (``srt-agent sglang-serve``), or
    ``srt-agent serve``; the server drafts, so the run's own tree cache stays empty. ``engine: sglang``
    is short for ``{kind: sglang}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["torch", "sglang"] = Field(default="torch", description="In-process, or a server at `url`.")
    url: str | None = Field(default=None, description="The server, e.g. http://127.0.0.1:30000 (sglang).")
    timeout_s: float = Field(default=600.0, gt=0, description="Most seconds one generation may take.")
    retries: int = Field(
        default=3, ge=0, description="Further tries after a connection failure or a 502/503/504."
    )
    max_connections: int = Field(default=256, ge=1, description="Connections pooled to the server.")
    weight_sync: Literal["disk", "tensor"] = Field(
        default="disk",
        description="How new weights reach the server: a checkpoint on disk, or the tensors (same machine).",
    )
    weights_dir: Path | None = Field(
        default=None,
        description="Where new weights are written for the server to load (same path on its disk); "
        "default: a temporary folder.",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _url_fits_kind(self) -> EngineConfig:
        if self.kind == "sglang" and not self.url:
            raise ValueError(
                "engine.kind = 'sglang' needs engine.url (e.g. http://127.0.0.1:30000); start a server "
                "with `srt-agent serve --model DIR` or `srt-agent sglang-serve --model DIR`"
            )
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"engine.url = {self.url!r}: must start with http:// or https://")
        if self.kind == "torch" and self.url:
            raise ValueError(
                "engine.url is only read with engine.kind = 'sglang'; set the kind or drop the url"
            )
        return self
