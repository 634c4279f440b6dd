"""Per-step metric sinks: a JSONL file (always) and TensorBoard (``trainer.log``, when installed).

``metrics.jsonl`` has one JSON object per line: a training step (``"kind": "step"``, with
``step`` and the metrics of :mod:`srt_agent.train.trainer`) or an evaluation (``"kind": "eval"``).
On resume, lines past the checkpoint's step are dropped (they belong to the step in flight at the
crash, which is redone) and TensorBoard purges them too, so each step appears once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("srt_agent.train")

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
TENSORBOARD_MISSING = (
    "TensorBoard logging is off: the optional `tensorboard` package is not installed "
    "(pip install 'srt-agent[train]'); metrics still go to metrics.jsonl"
)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics file (a torn last line, from a kill mid-write, is skipped)."""
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricsLogger:
    """Appends records to ``metrics.jsonl`` and scalars to TensorBoard.

    Args:
        out_dir: The run's output directory.
        backends: ``trainer.log`` (``jsonl`` is always written).
        resume_step: The checkpoint's step when resuming (later records are dropped), else ``None``
            (a fresh file).
    """

    def __init__(self, out_dir: str | Path, backends: Sequence[str], resume_step: int | None = None) -> None:
        self.path = Path(out_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = (
            []
            if resume_step is None
            else [r for r in read_records(self.path) if r.get("step", 0) <= resume_step]
        )
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, self.path)
        self._file = self.path.open("a", encoding="utf-8")
        self.tensorboard_error: str | None = None
        self._tb: Any = None
        if "tensorboard" in backends:
            self._tb = self._open_tensorboard(Path(out_dir) / TENSORBOARD_DIR, resume_step)

    def _open_tensorboard(self, path: Path, resume_step: int | None) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.tensorboard_error = TENSORBOARD_MISSING
            log.warning(TENSORBOARD_MISSING)
            return None
        purge = None if resume_step is None else resume_step + 1
        return SummaryWriter(str(path), purge_step=purge)

    def log(self, record: dict[str, Any]) -> None:
        """Write one record (flushed at once, so a crash loses at most the line being written)."""
        clean = {k: _finite(v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self._tb is not None and "step" in record:
            kind = record.get("kind", "step")
            for key, value in record.items():
                if key not in ("step", "kind", "time") and isinstance(value, int | float):
                    self._tb.add_scalar(f"{kind}/{key}", value, record["step"])
            self._tb.flush()

    def records(self) -> list[dict[str, Any]]:
        """Everything logged so far (including records kept from before a resume)."""
        self._file.flush()
        return read_records(self.path)

    def close(self) -> None:
        """Close the file and the TensorBoard writer."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()
