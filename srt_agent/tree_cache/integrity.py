"""The tree cache's integrity check: every invariant recomputed from scratch (O(size): tests, loads)."""

from __future__ import annotations

from typing import Any

from srt_agent.tree_cache.options import STATE_BYTES, STREAM_BYTES, STREAM_TOKEN_BYTES, TASK_BYTES
from srt_agent.tree_cache.prefix_tree import Node, check_tree, child, iter_nodes, tree_bytes
from srt_agent.tree_cache.suffix_index import node_key


def cache_problems(cache: Any) -> list[str]:
    """Everything inconsistent in ``cache`` (called with its lock held); empty if all is well.

    ``cache`` is a :class:`~srt_agent.tree_cache.TreeCache`, which calls this; typed loosely so that
    this module does not import the cache back (the checks read its internals).
    """
    problems: list[str] = []
    windows = cache.config.windows
    total_nodes = 0
    total_bytes = 0
    # Per fallback window: node -> key, over all tasks and per task.
    global_keys: list[dict[Node, int]] = [{} for _ in windows]
    task_keys: dict[str, list[dict[Node, int]]] = {}
    for key, state in cache._states.items():
        name = f"state {key!r}"
        if state.key != key:
            problems.append(f"{name}: the LRU table files state {state.key!r} under this key")
        problems += check_tree(state.root, name)
        n, tree = tree_bytes(state.root)
        if (n, STATE_BYTES + tree) != (state.nodes, state.bytes):
            problems.append(
                f"{name}: holds {n} nodes / {STATE_BYTES + tree} bytes, "
                f"its counters say {state.nodes} / {state.bytes}"
            )
        total_nodes += n
        total_bytes += STATE_BYTES + tree
        own = task_keys.setdefault(state.task, [{} for _ in windows]) if state.task else None
        for node in iter_nodes(state.root):
            for i, window in enumerate(windows):
                k = node_key(node, window)
                global_keys[i][node] = k
                if own is not None:
                    own[i][node] = k
        for sid, stream in state.streams.items():
            if cache._streams.get(sid) is not stream:
                problems.append(f"{name}: lists stream {sid!r}, which is not in flight")
    for sid, stream in cache._streams.items():
        total_bytes += STREAM_BYTES + STREAM_TOKEN_BYTES * len(stream.tokens)
        problems += _stream_problems(cache, sid)
    if total_nodes != cache._nodes:
        problems.append(f"node counter {cache._nodes} != {total_nodes} nodes held")
    for i, window in enumerate(windows):
        problems += cache._global[i].check(global_keys[i], f"global index (window {window})")
        total_bytes += cache._global[i].bytes
    if set(cache._tasks) != set(task_keys):
        problems.append(f"task indexes {sorted(cache._tasks)} != tasks of held states {sorted(task_keys)}")
    for task, indexes in cache._tasks.items():
        expected = task_keys.get(task, [{} for _ in windows])
        for index, keys, window in zip(indexes, expected, windows, strict=True):
            problems += index.check(keys, f"task {task!r} index (window {window})")
            total_bytes += index.bytes + TASK_BYTES
    if total_bytes != cache._bytes:
        problems.append(f"byte counter {cache._bytes} != {total_bytes} recomputed")
    if cache._bytes > cache.config.byte_budget and cache._states:
        budget = cache.config.byte_budget
        problems.append(f"{cache._bytes} bytes held with states left, over the budget {budget}")
    ticks = [n.tick for n in global_keys[0]]
    if len(set(ticks)) != len(ticks) or (ticks and max(ticks) >= cache._tick):
        problems.append(f"node ticks are not unique or not below the next tick {cache._tick}")
    return problems


def _stream_problems(cache: Any, sid: str) -> list[str]:
    stream = cache._streams[sid]
    name = f"stream {sid!r}"
    if stream.id != sid:
        return [f"{name}: filed under the wrong id ({stream.id!r})"]
    state = stream.state
    if state is None:  # detached by an eviction
        if stream.node is not None or stream.tokens:
            return [f"{name}: detached but still holds a cursor or tokens"]
        return []
    if cache._states.get(stream.key) is not state or state.streams.get(sid) is not stream:
        return [f"{name}: its state {stream.key!r} is not held, or does not list it"]
    node: Node | None = state.root
    for t in stream.tokens:
        node = child(node, t) if node is not None else None
    if node is None or node is not stream.node:
        return [f"{name}: its {len(stream.tokens)} tokens do not walk to its cursor"]
    if stream.node.ends < 1 or (stream.live and stream.node.live < 1):
        return [f"{name}: its cursor node counts no sequence ending there"]
    return []
