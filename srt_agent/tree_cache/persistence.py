"""Saving and loading the tree cache: flat numpy arrays in an ``.npz`` file, no pickle.

Layout (format ``srt-tree-cache/1``): ``meta`` is a JSON string (format, state keys and task ids in
LRU order, config, counters, next tick); the trees are concatenated in arrays ``parents`` (index
within the tree, ``-1`` for a root), ``tokens``, ``counts``, ``ends``, ``live``, ``ticks``, tree
``i`` being rows ``offsets[i]:offsets[i+1]``, each tree's root first and every parent before its
children. Each array is int32 when all its values fit, else int64 (older files: deflated, int64
except ``parents``); readers widen them. Loading uses ``allow_pickle=False``, so a file can hold
only arrays.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from srt_agent.errors import SrtAgentError
from srt_agent.tree_cache.prefix_tree import SENTINEL, Node, children

FORMAT_VERSION = "srt-tree-cache/1"
_ARRAYS = ("parents", "tokens", "counts", "ends", "live", "ticks")


class CacheFileError(SrtAgentError, ValueError):
    """A file is not a readable tree cache save of a format this version understands."""


@dataclass(frozen=True)
class TreeArrays:
    """One state's tree as flat arrays (row 0 the root, every parent before its children)."""

    state_key: str
    task_id: str
    parents: npt.NDArray[np.int32]
    tokens: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    live: npt.NDArray[np.int64]
    ticks: npt.NDArray[np.int64]


def tree_to_arrays(state_key: str, task_id: str, root: Node) -> TreeArrays:
    """Flatten the tree under ``root`` (breadth-first, so parents come first)."""
    order = [root]
    parents = [-1]
    i = 0
    while i < len(order):
        for c in children(order[i]):
            order.append(c)
            parents.append(i)
        i += 1
    # One conversion of all fields (the trainer saves the cache with every checkpoint).
    fields = np.array([(n.token, n.count, n.ends, n.live, n.tick) for n in order], dtype=np.int64)  # (N, 5)
    return TreeArrays(
        state_key=state_key,
        task_id=task_id,
        parents=np.asarray(parents, dtype=np.int32),
        tokens=fields[:, 0],
        counts=fields[:, 1],
        ends=fields[:, 2],
        live=fields[:, 3],
        ticks=fields[:, 4],
    )


def arrays_to_nodes(tree: TreeArrays) -> list[Node]:
    """Rebuild a tree's nodes (root first) from its arrays; counts are taken as saved."""
    nodes: list[Node] = []
    parents = tree.parents.tolist()
    for i, (tok, count, ends, live, tick) in enumerate(
        zip(
            tree.tokens.tolist(),
            tree.counts.tolist(),
            tree.ends.tolist(),
            tree.live.tolist(),
            tree.ticks.tolist(),
            strict=True,
        )
    ):
        parent = nodes[parents[i]] if i else None
        node = Node(tok, parent, tick)
        node.count, node.ends, node.live = count, ends, live
        if parent is not None:
            kids = parent.kids
            if kids is None:
                parent.kids = node
            elif isinstance(kids, Node):
                parent.kids = {kids.token: kids, tok: node}
            else:
                kids[tok] = node
        nodes.append(node)
    return nodes


def save_arrays(path: str | Path, trees: Sequence[TreeArrays], meta: dict[str, Any]) -> None:
    """Write ``trees`` and ``meta`` to ``path`` atomically (a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        **meta,
        "format": FORMAT_VERSION,
        "state_keys": [t.state_key for t in trees],
        "task_ids": [t.task_id for t in trees],
    }
    offsets = np.zeros(len(trees) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(t.tokens) for t in trees])
    arrays: dict[str, Any] = {"meta": np.array(json.dumps(record)), "offsets": offsets}
    for name in _ARRAYS:
        parts = [getattr(t, name) for t in trees]
        arrays[name] = _narrow(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int32)
    tmp = path.with_name(path.name + ".tmp")
    # Uncompressed: the trainer saves the cache with every checkpoint, and deflating a ~0.5M-node
    # cache took ~0.5 s, most of a checkpoint's time; narrow integers keep the file ~28 bytes a node.
    with tmp.open("wb") as f:  # a file object: np.savez would otherwise append ".npz" to the name
        np.savez(f, **arrays)
    os.replace(tmp, path)


def _narrow(values: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.integer[Any]]:
    """``values`` as int32 when every value fits, else as int64 (readers widen them again)."""
    info = np.iinfo(np.int32)
    if len(values) == 0 or (int(values.min()) >= info.min and int(values.max()) <= info.max):
        return values.astype(np.int32)
    return values.astype(np.int64)


def load_arrays(path: str | Path) -> tuple[list[TreeArrays], dict[str, Any]]:
    """Read a file written by :func:`save_arrays`, checking its format and shapes.

    Raises:
        CacheFileError: Missing or unreadable file, another format or version, or inconsistent arrays.
    """
    path = Path(path)
    if not path.is_file():
        raise CacheFileError(f"{path}: no such tree cache file (write one with TreeCache.save)")
    try:
        with np.load(path, allow_pickle=False) as data:
            contents = {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CacheFileError(f"{path}: not a tree cache save file (.npz): {exc}") from None
    missing = [n for n in ("meta", "offsets", *_ARRAYS) if n not in contents]
    if missing:
        raise CacheFileError(f"{path}: not a tree cache save file: arrays {missing} are missing")
    try:
        meta = json.loads(str(contents["meta"]))
    except json.JSONDecodeError as exc:
        raise CacheFileError(f"{path}: the metadata is not JSON ({exc})") from None
    found = meta.get("format") if isinstance(meta, dict) else None
    if found != FORMAT_VERSION:
        raise CacheFileError(
            f"{path}: format {found!r}, but this version of srt-agent reads {FORMAT_VERSION!r}; "
            "load it with the srt-agent that wrote it, or delete the file to start with a cold cache"
        )
    return _split(path, contents, meta), meta


def _split(path: Path, contents: dict[str, Any], meta: dict[str, Any]) -> list[TreeArrays]:
    keys, tasks = meta.get("state_keys"), meta.get("task_ids")
    if not isinstance(keys, list) or not isinstance(tasks, list):
        raise CacheFileError(f"{path}: the metadata lists no state keys or task ids")
    offsets = contents["offsets"]
    n_rows = len(contents["tokens"])
    bad = (
        len(keys) != len(tasks)
        or offsets.ndim != 1
        or len(offsets) != len(keys) + 1
        or any(len(contents[name]) != n_rows or contents[name].ndim != 1 for name in _ARRAYS)
        or (len(offsets) and (offsets[0] != 0 or offsets[-1] != n_rows or np.any(np.diff(offsets) < 1)))
    )
    if bad:
        raise CacheFileError(
            f"{path}: inconsistent array shapes or state lists (a truncated or foreign file?)"
        )
    trees: list[TreeArrays] = []
    for i, (key, task) in enumerate(zip(keys, tasks, strict=True)):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        part = {name: contents[name][lo:hi] for name in _ARRAYS}
        parents, tokens = part["parents"], part["tokens"]
        rows = np.arange(hi - lo)
        if (
            parents[0] != -1
            or tokens[0] != SENTINEL
            or np.any(parents[1:] < 0)
            or np.any(parents[1:] >= rows[1:])
            or np.any(tokens[1:] < 0)
        ):
            raise CacheFileError(f"{path}: tree {i} ({key!r}) has bad parent links or token ids")
        trees.append(
            TreeArrays(
                state_key=str(key),
                task_id=str(task),
                parents=parents.astype(np.int32),
                tokens=tokens.astype(np.int64),
                counts=part["counts"].astype(np.int64),
                ends=part["ends"].astype(np.int64),
                live=part["live"].astype(np.int64),
                ticks=part["ticks"].astype(np.int64),
            )
        )
    return trees
