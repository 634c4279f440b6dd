"""Reports as the flat JSON objects ``--json`` writes."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

__all__ = ["build_record", "flatten", "write_record"]


def write_record(path: str | Path, record: dict[str, Any]) -> None:
    """Write ``record`` as every ``--json`` option does: keys sorted, indented, folder made if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts into one level (``{"a": {"b/c-d": 1}}`` -> ``{"a_b_c_d": 1}``) for --json."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}".replace("/", "_").replace("-", "_").replace(".", "_")
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}_"))
        else:
            out[name] = value
    return out


def build_record(report: Any) -> dict[str, Any]:
    """A dataclass report (the model build's) as one flat JSON object."""
    return flatten(asdict(report))
