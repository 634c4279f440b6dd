"""Atomic checkpoints: a run survives ``kill -9`` at any moment and resumes from its last complete step.

Layout of ``<trainer.out_dir>/checkpoints/step-000012/``::

    model/            the policy as an HF directory (+ tokenizer, + value_head.pt for GAE)
    optimizer.pt      optimizer and LR-scheduler state
    rng.pt            python, numpy, torch (and CUDA) RNG states
    tree_cache.npz    the SRT tree cache (TreeCache.save)
    config.yaml       the run's config
    manifest.json     size and SHA-256 of every file above
    state.json        step, whether the weights were finite, the evaluation before training, ...
                      (written last)

Atomicity: everything is written into a hidden ``.tmp-step-...`` sibling, each file and directory is
fsynced, and only then is the directory renamed to its final name (one atomic ``rename``), and the
parent fsynced. A reader takes only ``step-N`` directories whose ``state.json`` parses and names
step ``N``, so a half-written checkpoint (a killed writer's ``.tmp-*``) is never picked up;
:func:`clean_partial` removes those leftovers.

Integrity: a file damaged after the rename (a truncated copy, a bad disk) is caught by the
manifest (:func:`verify_checkpoint`), and resuming falls back to the newest checkpoint that is intact
and whose weights were finite (:func:`resume_order`). Pruning never removes the newest
finite checkpoint, so a run whose weights went NaN can still go back to before it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "state.json"
KEEP = 2
"""Complete checkpoints kept (the newest ones); older ones are deleted after each save."""
FORMAT = "srt-train-ckpt/2"
"""Written now: with ``manifest.json``; ``srt-train-ckpt/1`` (no manifest) is still read."""
_FORMATS = ("srt-train-ckpt/1", FORMAT)
MANIFEST_FILE = "manifest.json"
_NAME = re.compile(r"^step-(\d{6,})$")


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk.

    Attributes:
        path: Its directory.
        step: The training steps it contains.
        state: The parsed ``state.json``.
    """

    path: Path
    step: int
    state: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        """The policy's HF directory."""
        return self.path / "model"

    @property
    def cache_file(self) -> Path:
        """The tree cache file."""
        return self.path / "tree_cache.npz"

    @property
    def finite(self) -> bool:
        """Whether its weights (and the last step's losses) were finite when it was written."""
        return self.state.get("finite", True) is not False


def checkpoint_root(out_dir: str | Path) -> Path:
    """Where a run's checkpoints live."""
    return Path(out_dir) / CHECKPOINTS_DIR


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file, then every directory bottom-up, so the rename publishes durable data."""
    for dirpath, _, files in os.walk(root, topdown=False):
        for name in files:
            _fsync_path(Path(dirpath) / name)
        _fsync_path(Path(dirpath))


def write_checkpoint(
    out_dir: str | Path, step: int, state: dict[str, Any], write_files: Callable[[Path], None]
) -> Checkpoint:
    """Write a checkpoint atomically and prune old ones.

    Args:
        out_dir: The run's output directory.
        step: Completed training steps.
        state: JSON-safe trainer state; ``step`` and ``format`` are added.
        write_files: Writes the checkpoint's other files into the directory it is given.

    Returns:
        The new checkpoint.
    """
    root = checkpoint_root(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_files(tmp)
    (tmp / MANIFEST_FILE).write_text(json.dumps({"files": _manifest(tmp)}, indent=2, sort_keys=True) + "\n")
    full = {**state, "step": step, "format": FORMAT}
    (tmp / STATE_FILE).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
    _fsync_tree(tmp)
    if final.exists():  # the same step saved again (a resumed run's final save): replace it
        old = root / f".old-step-{step:06d}-{os.getpid()}"
        final.rename(old)
        shutil.rmtree(old)
    tmp.rename(final)
    _fsync_path(root)
    prune(out_dir)
    return Checkpoint(final, step, full)


def prune(out_dir: str | Path, keep: int = KEEP) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints, never the newest one with finite weights.

    Returns:
        The deleted directories.
    """
    found = list_checkpoints(out_dir)
    kept = {c.path for c in found[-keep:]}
    finite = [c for c in found if c.finite]
    if finite:
        kept.add(finite[-1].path)
    stale = [c.path for c in found if c.path not in kept]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(root: Path) -> dict[str, dict[str, Any]]:
    """``relative path -> {"bytes", "sha256"}`` of every file under ``root``."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        out[path.relative_to(root).as_posix()] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    return out


def verify_checkpoint(ckpt: Checkpoint) -> list[str]:
    """What is wrong with a checkpoint's files (empty: every file is as it was written).

    Checks each file of ``manifest.json`` for presence, size and SHA-256. A checkpoint of the first
    format (no manifest) cannot be checked and passes.
    """
    if ckpt.state.get("format") == "srt-train-ckpt/1":
        return []
    try:
        listed = json.loads((ckpt.path / MANIFEST_FILE).read_text())["files"]
        assert isinstance(listed, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return [f"{MANIFEST_FILE} is missing or unreadable"]
    problems: list[str] = []
    for name, want in sorted(listed.items()):
        path = ckpt.path / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.stat().st_size != want.get("bytes"):
            problems.append(f"{name} has {path.stat().st_size} bytes, {want.get('bytes')} were written")
        elif _sha256(path) != want.get("sha256"):
            problems.append(f"{name} does not match its checksum")
    return problems


def resume_order(out_dir: str | Path) -> Iterator[tuple[Checkpoint, str]]:
    """Every checkpoint of a run, newest first, with why a run may not resume from it (``""``: it may).

    A checkpoint may not when its files fail :func:`verify_checkpoint` or its weights were not
    finite. Each is verified only when the caller gets to it, so resuming from an intact newest
    checkpoint reads only that checkpoint's files.
    """
    for ckpt in reversed(list_checkpoints(out_dir)):
        problems = verify_checkpoint(ckpt)
        if problems:
            yield ckpt, f"damaged ({'; '.join(problems)})"
        elif not ckpt.finite:
            yield ckpt, "its weights or losses were not finite (NaN or inf)"
        else:
            yield ckpt, ""


def _read(path: Path) -> Checkpoint | None:
    match = _NAME.match(path.name)
    if match is None or not path.is_dir():
        return None
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None  # no state.json: not a complete checkpoint
    step = int(match.group(1))
    if not isinstance(state, dict) or state.get("step") != step or state.get("format") not in _FORMATS:
        return None
    return Checkpoint(path, step, state)


def list_checkpoints(out_dir: str | Path) -> list[Checkpoint]:
    """The complete checkpoints of a run, oldest first (half-written ones are never listed)."""
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return []
    found = [c for c in (_read(p) for p in root.iterdir()) if c is not None]
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(out_dir: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint of a run, or ``None``."""
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def clean_partial(out_dir: str | Path) -> list[Path]:
    """Delete leftovers of interrupted writes (``.tmp-*`` and ``.old-*`` directories).

    Returns:
        The deleted paths.
    """
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return []
    leftovers = [p for p in root.iterdir() if p.name.startswith((".tmp-", ".old-"))]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


# ---------------------------------------------------------------------- RNG states


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch (and CUDA) RNG states, in types ``torch.load(weights_only=True)`` reads."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    out: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy_key": torch.from_numpy(np.asarray(np_state["state"]["key"], dtype=np.int64)),
        "numpy_rest": [
            np_state["bit_generator"],
            int(np_state["state"]["pos"]),
            int(np_state["has_gauss"]),
            float(np_state["gauss"]),
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states saved by :func:`rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    bit_generator, pos, has_gauss, gauss_value = state["numpy_rest"]
    np.random.set_state(
        {
            "bit_generator": bit_generator,
            "state": {"key": state["numpy_key"].numpy().astype(np.uint32), "pos": pos},
            "has_gauss": has_gauss,
            "gauss": gauss_value,
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
