"""Atomic checkpoints: a run survives ``kill -9`` at any moment and resumes from its last complete step.

Layout of ``<trainer.out_dir>/checkpoints/step-000012/``::

    model/            the policy as an HF directory (+ tokenizer, + value_head.pt for GAE)
    optimizer.pt      optimizer and LR-scheduler state
    rng.pt            python, numpy, torch (and CUDA) RNG states
    tree_cache.npz    the SRT tree cache (TreeCache.save)
    tree_cache.replica<i>.npz  on Ray, each engine replica's own tree cache
    config.yaml       the run's config
    manifest.json     size and SHA-256 of every file above
    state.json        step, whether the weights were finite, the evaluation before training, ...
                      (written last)

Atomicity: everything is written into a hidden ``.tmp-step-...`` sibling, each file and directory is
fsynced, and only then is the directory renamed to its final name (one atomic ``rename``), and the
parent fsynced. A reader takes only ``step-N`` directories whose ``state.json`` parses and names
step ``N``, so a half-written checkpoint (a killed writer's ``.tmp-*``) is never picked up (nor
reported: after ``kill -9`` it is normal); :func:`clean_partial` removes those leftovers.

Integrity: a file damaged after the rename (a truncated copy, a bad disk) is caught by the
manifest (:func:`verify_checkpoint`), and resuming falls back to the newest checkpoint that is intact
and whose weights were finite (:func:`resume_order`), saying why it passed over the newer ones: a
``step-N`` directory whose ``state.json`` is missing or unreadable is listed there with the reason
too (never by :func:`list_checkpoints`). The manifest only proves the bytes are the ones written
(or rewritten along with it), so the loader also checks the tensors it loaded for NaN and inf
(:func:`check_finite`). Pruning never removes the newest finite checkpoint, so a run whose weights
went NaN can still go back to before it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from srt_agent.errors import SrtAgentError, shown

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "state.json"
KEEP = 2
"""Complete checkpoints kept (the newest ones); older ones are deleted after each save."""
FORMAT = "srt-train-ckpt/2"
"""Written now: with ``manifest.json``; ``srt-train-ckpt/1`` (no manifest) is still read."""
_FORMATS = ("srt-train-ckpt/1", FORMAT)
MANIFEST_FILE = "manifest.json"
CACHE_FILE = "tree_cache.npz"
"""The driver's tree cache in a checkpoint."""
_NAME = re.compile(r"^step-(\d{6,})$")
_STATE_LIMIT = 1 << 20
"""The most of a ``state.json`` read (a larger one is reported as damaged, not parsed)."""


class NonFiniteWeights(SrtAgentError, ValueError):
    """Tensors loaded from a checkpoint hold NaN or inf; the message (one line) names the first."""


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
        return self.path / CACHE_FILE

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

    A checkpoint may not when its ``state.json`` is missing or unreadable (then its ``state`` is
    empty), its files fail :func:`verify_checkpoint` or its weights were not finite. Each is verified
    only when the caller gets to it, so resuming from an intact newest checkpoint reads only that
    checkpoint's files. Hidden ``.tmp-*`` directories (a killed writer's) are never listed.
    """
    for ckpt, why in sorted(_scan(out_dir), key=lambda found: found[0].step, reverse=True):
        if why:
            yield ckpt, why
            continue
        problems = verify_checkpoint(ckpt)
        if problems:
            yield ckpt, f"damaged ({'; '.join(problems)})"
        elif not ckpt.finite:
            yield ckpt, "its weights or losses were not finite (NaN or inf)"
        else:
            yield ckpt, ""


def _inspect(path: Path) -> tuple[Checkpoint, str] | None:
    """A ``step-N`` directory as a checkpoint, and why it is not a complete one (``""``: it is).

    An incomplete one (``state.json`` missing, unreadable, or naming another step) comes with an
    empty ``state``. ``None``: not a ``step-N`` directory (a writer's hidden ``.tmp-*``, a file).
    """
    match = _NAME.match(path.name)
    if match is None or not path.is_dir():
        return None
    step = int(match.group(1))
    broken = Checkpoint(path, step, {})
    try:
        with (path / STATE_FILE).open("rb") as f:
            raw = f.read(_STATE_LIMIT + 1)
    except FileNotFoundError:
        return broken, f"{STATE_FILE} is missing (the checkpoint is incomplete or was damaged)"
    except OSError as exc:
        return broken, f"{STATE_FILE} cannot be read ({type(exc).__name__}: {exc.strerror})"
    if len(raw) > _STATE_LIMIT:
        return broken, f"{STATE_FILE} is over {_STATE_LIMIT} bytes (a trainer's state is a few hundred)"
    try:
        state = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return broken, f"{STATE_FILE} is not UTF-8 text (a bad byte at offset {exc.start})"
    except json.JSONDecodeError as exc:  # json's own words (never the file's): already one short line
        where = f"line {exc.lineno} column {exc.colno}"
        return broken, f"{STATE_FILE} is not valid JSON (truncated?): {exc.msg}: {where}"
    if not isinstance(state, dict):
        return broken, f"{STATE_FILE} holds a JSON {type(state).__name__}, not an object"
    if state.get("step") != step:
        return broken, f"{STATE_FILE} names step {shown(state.get('step'), 40)}, not {step}"
    if state.get("format") not in _FORMATS:
        fmt = shown(state.get("format"), 60)
        return broken, f"{STATE_FILE} has format {fmt}, which this version does not read"
    return Checkpoint(path, step, state), ""


def _scan(out_dir: str | Path) -> list[tuple[Checkpoint, str]]:
    """Every ``step-N`` directory of a run, with why it is not a complete checkpoint (``""``: it is)."""
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return []
    return [found for found in (_inspect(p) for p in root.iterdir()) if found is not None]


def list_checkpoints(out_dir: str | Path) -> list[Checkpoint]:
    """The complete checkpoints of a run, oldest first (half-written ones are never listed)."""
    found = [ckpt for ckpt, why in _scan(out_dir) if not why]
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


# ---------------------------------------------------------------------- loaded tensors


def check_finite(source: str | Callable[[str], str], tensors: Iterable[tuple[str, Any]]) -> None:
    """Raise if a loaded tensor (or float) holds NaN or inf.

    One ``isfinite(...).all()`` per floating-point tensor, gathered into one host sync per device
    (a GPU model is not synced per tensor); only a failing check looks closer to name the tensor.

    Args:
        source: The file the values were loaded from, for the message (``model/model.safetensors``),
            or a function of the value's name that says (for a model in several files).
        tensors: ``(name, value)`` pairs; tensors that are not floating point and values that are
            neither tensors nor floats are skipped.

    Raises:
        NonFiniteWeights: ``"<source> holds non-finite values (NaN in '<name>')"``, for the first one.
    """
    checked: list[tuple[str, Any]] = []
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for name, value in tensors:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            flags.setdefault(value.device, []).append(torch.isfinite(value).all())
        elif isinstance(value, float):
            flags.setdefault(torch.device("cpu"), []).append(torch.tensor(math.isfinite(value)))
        else:
            continue
        checked.append((name, value))
    if all(bool(torch.stack(group).all()) for group in flags.values()):
        return
    for name, value in checked:  # the first bad one, in the order given
        t = torch.as_tensor(value)
        if not bool(torch.isfinite(t).all()):
            kind = "NaN" if bool(torch.isnan(t).any()) else "inf"
            where = source(name) if callable(source) else source
            raise NonFiniteWeights(f"{where} holds non-finite values ({kind} in {shown(name, 100)})")


def nested_values(prefix: str, obj: Any, depth: int = 4) -> Iterator[tuple[str, Any]]:
    """``(dotted name, leaf)`` of the dicts, lists and tuples in ``obj``, for :func:`check_finite`.

    For an optimizer's ``param_groups`` or a scheduler's ``state_dict()``.
    """
    if isinstance(obj, dict) and depth:
        for key, value in obj.items():
            yield from nested_values(f"{prefix}.{key}", value, depth - 1)
    elif isinstance(obj, list | tuple) and depth:
        for i, value in enumerate(obj):
            yield from nested_values(f"{prefix}[{i}]", value, depth - 1)
    else:
        yield prefix, obj


def weights_file(model_dir: Path, tensor: str) -> str:
    """The file of a saved HF model that holds ``tensor``, as ``model/<file>`` (for messages).

    A sharded model names the shard its ``model.safetensors.index.json`` gives.
    """
    try:
        shard = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"][tensor]
        if isinstance(shard, str) and (model_dir / shard).is_file():
            return f"{model_dir.name}/{shard}"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (model_dir / name).is_file():
            return f"{model_dir.name}/{name}"
    return f"{model_dir.name}/"


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
