"""A naive reference for srt_agent.tree_cache.TreeCache: raw sequences in lists, drafts by brute force.

Nothing here is shared with the real implementation. Every tree node of the real cache is, here,
a pair (state, path) such that some sequence of the state starts with the path; its count is the
number of such sequences, its creation time the first time a token reached it. Drafts enumerate
every candidate path, score it, sort, and keep the best ``budget`` (the same ordering rule: higher
path probability, then shorter path, then the parent ranked first, then the smaller token).
Evictions are not driven by bytes here (the byte model is the real cache's business): callers
evict the least recently used states explicitly, or until the reference holds as many states as
the real cache.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import groupby

SENTINEL = -1


@dataclass
class RefSeq:
    tokens: list[int] = field(default_factory=list)
    ticks: list[int] = field(default_factory=list)  # when each token was appended
    live: bool = True


@dataclass
class RefState:
    task: str
    created: int
    seqs: list[RefSeq] = field(default_factory=list)


@dataclass
class RefStream:
    key: str
    live: bool
    seq: RefSeq | None  # None: detached (its state was evicted)


Path = tuple[int, ...]
NodeRef = tuple[str, Path]  # (state key, path from the state's root)


class ReferenceCache:
    def __init__(
        self, windows: tuple[int, ...], max_match: int, scan_limit: int, max_candidates: int
    ) -> None:
        self.windows = windows  # suffix lengths tried in order, each in the task then globally
        self.max_match = max_match
        self.scan_limit = scan_limit
        self.max_candidates = max_candidates
        self.states: dict[str, RefState] = {}  # insertion order is LRU order (least recent first)
        self.streams: dict[str, RefStream] = {}
        self.time = 0
        self.served: Counter[str] = Counter()

    # ------------------------------------------------------------------ inputs
    def _touch(self, key: str, task: str | None = None) -> RefState:
        if key in self.states:
            self.states[key] = self.states.pop(key)
        else:
            assert task is not None
            self.states[key] = RefState(task=task, created=self._now())
        return self.states[key]

    def _now(self) -> int:
        self.time += 1
        return self.time

    def extend(self, stream_id: str, key: str, task: str, tokens: list[int], kind: str) -> None:
        if tokens and min(tokens) < 0:
            raise ValueError("negative token")
        stream = self.streams.get(stream_id)
        if stream is None:
            state = self._touch(key, task)
            seq = RefSeq(live=kind == "live")
            state.seqs.append(seq)
            stream = self.streams[stream_id] = RefStream(key, kind == "live", seq)
        elif stream.key != key or stream.live != (kind == "live"):
            raise ValueError("stream mismatch")
        elif stream.seq is None:
            return
        else:
            self._touch(key)
        assert stream.seq is not None
        for t in tokens:
            stream.seq.tokens.append(t)
            stream.seq.ticks.append(self._now())

    def finish(self, stream_id: str) -> None:
        if stream_id not in self.streams:
            raise ValueError("not in flight")
        del self.streams[stream_id]

    def insert(self, key: str, task: str, tokens: list[int], kind: str) -> None:
        state = self._touch(key, task)
        seq = RefSeq(live=kind == "live")
        state.seqs.append(seq)
        for t in tokens:
            seq.tokens.append(t)
            seq.ticks.append(self._now())

    def evict_lru(self) -> str:
        key = next(iter(self.states))
        del self.states[key]
        for stream in self.streams.values():
            if stream.key == key:
                stream.seq = None
        return key

    def forget_streams(self) -> None:
        """What a save and load does: streams in flight end where they are."""
        self.streams.clear()

    # ------------------------------------------------------------------ nodes, by brute force
    def _seqs_through(self, node: NodeRef) -> list[RefSeq]:
        key, path = node
        n = len(path)
        return [s for s in self.states[key].seqs if tuple(s.tokens[:n]) == path]

    def _exists(self, node: NodeRef) -> bool:
        return bool(self._seqs_through(node))

    def _has_children(self, node: NodeRef) -> bool:
        return any(len(s.tokens) > len(node[1]) for s in self._seqs_through(node))

    def _created(self, node: NodeRef) -> int:
        key, path = node
        if not path:
            return self.states[key].created
        return min(s.ticks[len(path) - 1] for s in self._seqs_through(node))

    def _nodes(self, keys: list[str]) -> set[NodeRef]:
        out: set[NodeRef] = set()
        for key in keys:
            out.add((key, ()))
            for s in self.states[key].seqs:
                for n in range(1, len(s.tokens) + 1):
                    out.add((key, tuple(s.tokens[:n])))
        return out

    # ------------------------------------------------------------------ drafts
    def draft(
        self, key: str, task: str, generated: list[int], budget: int
    ) -> tuple[str, dict[Path, tuple[float, bool]]]:
        if budget == 0:
            self.served["none"] += 1
            return "none", {}
        roots: list[NodeRef] = []
        source = "none"
        if key in self.states:
            self._touch(key)
            here = (key, tuple(generated))
            if self._exists(here) and self._has_children(here):
                roots, source = [here], "exact"
        for window in self.windows:  # the task's trees first, on each suffix length in turn
            if not roots and task:
                keys = [k for k, s in self.states.items() if s.task == task]
                roots = self._matches(keys, generated, window)
                source = "task" if roots else source
        for window in self.windows:
            if not roots:
                roots = self._matches(list(self.states), generated, window)
                source = "global" if roots else "none"
        draft = self._select(roots, budget) if roots else {}
        self.served[source] += 1
        self.served["nodes"] += len(draft)
        self.served["runahead"] += sum(ra for _, ra in draft.values())
        return source, draft

    def _matches(self, keys: list[str], generated: list[int], window: int) -> list[NodeRef]:
        query = [SENTINEL, *generated]
        tail = query[-window:]
        cands = [n for n in self._nodes(keys) if [SENTINEL, *n[1]][-window:] == tail]
        cands.sort(key=self._created, reverse=True)
        cands = [n for n in cands[: self.scan_limit] if self._has_children(n)]
        lengths = {n: self._match_length([SENTINEL, *n[1]], query) for n in cands}
        if not lengths:
            return []
        best = max(lengths.values())
        return [n for n in cands if lengths[n] == best][: self.max_candidates]

    def _match_length(self, context: list[int], query: list[int]) -> int:
        m = 0
        while m < min(self.max_match, len(context), len(query)) and context[-1 - m] == query[-1 - m]:
            m += 1
        return m

    def _select(self, roots: list[NodeRef], budget: int) -> dict[Path, tuple[float, bool]]:
        counts: Counter[Path] = Counter()
        live: Counter[Path] = Counter()
        for key, path in roots:
            for s in self._seqs_through((key, path)):
                for n in range(len(path) + 1, len(s.tokens) + 1):
                    rel = tuple(s.tokens[len(path) : n])
                    counts[rel] += 1
                    live[rel] += s.live
        totals: Counter[Path] = Counter()
        for rel, c in counts.items():
            totals[rel[:-1]] += c
        probs: dict[Path, float] = {}
        for rel in sorted(counts, key=len):  # parents first
            parent = probs.get(rel[:-1], 1.0)
            probs[rel] = parent * (counts[rel] / totals[rel[:-1]])
        # Rank: higher probability, then shorter, then the parent ranked first, then the smaller
        # token. Parents always rank before their children (no higher probability, shorter), so
        # ranking tie groups in (probability, length) order knows every parent's rank in time.
        rank: dict[Path, int] = {(): -1}
        for _, ties in groupby(
            sorted(counts, key=lambda r: (-probs[r], len(r))), lambda r: (-probs[r], len(r))
        ):
            for r in sorted(ties, key=lambda r: (rank[r[:-1]], r[-1])):
                rank[r] = len(rank) - 1
        ranked = sorted(counts, key=rank.__getitem__)[:budget]
        return {r: (probs[r], live[r] == 0) for r in ranked}
