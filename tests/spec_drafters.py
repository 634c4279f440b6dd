"""Test draft sources for the engine's speculation (stand-ins for the tree cache)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from srt_agent.contracts.draft import EMPTY_DRAFT, DraftSource, DraftSourceBase, DraftTree, StreamKind


def chain(tokens: Sequence[int], prob: float = 1.0, source: DraftSource = "exact") -> DraftTree:
    return DraftTree(tuple(tokens), tuple(range(-1, len(tokens) - 1)), (prob,) * len(tokens), source)


class Recorder(DraftSourceBase):
    """Records what the engine reports; drafts nothing unless subclassed."""

    def __init__(self) -> None:
        self.streams: dict[str, list[int]] = {}
        self.kinds: dict[str, StreamKind] = {}
        self.finished: set[str] = set()
        self.asked: list[int] = []  # budgets asked for

    def draft(
        self, state_key: str, task_id: str, prompt_ids: Sequence[int], generated: Sequence[int], budget: int
    ) -> DraftTree:
        self.asked.append(budget)
        return self.make(task_id, list(prompt_ids), list(generated), budget)

    def make(self, task_id: str, prompt: list[int], generated: list[int], budget: int) -> DraftTree:
        return EMPTY_DRAFT

    def extend(
        self,
        stream_id: str,
        state_key: str,
        task_id: str,
        new_tokens: Sequence[int],
        kind: StreamKind = "live",
    ) -> None:
        assert stream_id not in self.finished, f"extend after finish of {stream_id}"
        self.streams.setdefault(stream_id, []).extend(new_tokens)
        self.kinds[stream_id] = kind

    def finish(self, stream_id: str) -> None:
        assert stream_id in self.streams and stream_id not in self.finished
        self.finished.add(stream_id)


class Replay(Recorder):
    """Perfect drafts: replays a known continuation per task id (a previous sample of the same seed)."""

    def __init__(self, book: dict[str, Sequence[int]] | None = None, prob: float = 1.0) -> None:
        super().__init__()
        self.book = dict(book or {})
        self.prob = prob

    def make(self, task_id: str, prompt: list[int], generated: list[int], budget: int) -> DraftTree:
        full = list(self.book.get(task_id, ()))
        if full[: len(generated)] != generated:
            return EMPTY_DRAFT
        return chain(full[len(generated) : len(generated) + budget], self.prob)


def random_tree(rng: random.Random, vocab: int, budget: int, width: int = 2) -> tuple[list[int], list[int]]:
    """A random tree of ``budget`` nodes (distinct siblings, up to ``width`` children per node)."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[int, set[int]] = {}
    for _ in range(budget):
        options = [p for p in range(-1, len(tokens)) if len(children.get(p, ())) < min(width, vocab)]
        parent = rng.choice(options[-3:])  # favour deep nodes: mostly chains with some branching
        used = children.setdefault(parent, set())
        tok = rng.choice([t for t in range(vocab) if t not in used])
        used.add(tok)
        tokens.append(tok)
        parents.append(parent)
    return tokens, parents


class RandomDrafts(Recorder):
    """Useless drafts: random token trees that claim probability ``prob`` for every node."""

    def __init__(self, vocab: int, seed: int = 0, prob: float = 1.0, width: int = 2) -> None:
        super().__init__()
        self.vocab, self.prob, self.width = vocab, prob, width
        self.rng = random.Random(seed)

    def make(self, task_id: str, prompt: list[int], generated: list[int], budget: int) -> DraftTree:
        tokens, parents = random_tree(self.rng, self.vocab, budget, self.width)
        return DraftTree(tuple(tokens), tuple(parents), (self.prob,) * budget, "global")


class ModelDrafts(Recorder):
    """Drafts sampled from a known next-token distribution (``dist(context) -> probs or None``).

    Each node gets up to two distinct children drawn without replacement from the distribution,
    breadth first, until the budget is spent; ``mode`` ``good`` keeps them, ``bad`` replaces every
    token by a random one, ``partial`` replaces each token with probability one half. Where the
    distribution is unknown (``None``) the node's children are random.
    """

    def __init__(
        self, dist: Callable[[tuple[int, ...]], Sequence[float] | None], vocab: int, seed: int = 0
    ) -> None:
        super().__init__()
        self.dist, self.vocab = dist, vocab
        self.rng = random.Random(seed)

    def make(self, task_id: str, prompt: list[int], generated: list[int], budget: int) -> DraftTree:
        rng = self.rng
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[float] = []
        frontier: list[tuple[int, tuple[int, ...], float]] = [(-1, tuple(generated), 1.0)]
        while frontier and len(tokens) < budget:
            parent, context, path_p = frontier.pop(0)
            p = self.dist(context)
            weights = list(p) if p is not None else [1.0] * self.vocab
            picked: list[int] = []
            for _ in range(2):
                remaining = [t for t in range(self.vocab) if t not in picked and weights[t] > 0]
                if not remaining or len(tokens) + len(picked) >= budget:
                    break
                picked.append(rng.choices(remaining, [weights[t] for t in remaining])[0])
            for tok in picked:
                drafted = tok
                if task_id == "bad" or (task_id == "partial" and rng.random() < 0.5):
                    drafted = rng.randrange(self.vocab)
                if drafted in [tokens[j] for j, q in enumerate(parents) if q == parent]:
                    continue  # siblings stay distinct
                q = path_p * (weights[tok] / sum(weights))
                tokens.append(drafted)
                parents.append(parent)
                probs.append(q)
                frontier.append((len(tokens) - 1, (*context, drafted), q))
        return DraftTree(tuple(tokens), tuple(parents), tuple(probs), "exact")


class NoisyReplay(Replay):
    """Trees around a known continuation: per depth a random sibling (often placed first, so the
    accepted path is not contiguous in tree order) and the true token, corrupted with probability
    ``corrupt``; node ``j``'s children hang under the true (or corrupted) token of depth ``j``."""

    def __init__(
        self, book: dict[str, Sequence[int]], vocab: int, seed: int = 0, corrupt: float = 0.2
    ) -> None:
        super().__init__(book)
        self.vocab, self.corrupt = vocab, corrupt
        self.rng = random.Random(seed)

    def make(self, task_id: str, prompt: list[int], generated: list[int], budget: int) -> DraftTree:
        rng = self.rng
        full = list(self.book.get(task_id, ()))
        truth = full[len(generated) :] if full[: len(generated)] == generated else []
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1
        for tok in truth:
            if len(tokens) >= budget:
                break
            main = rng.randrange(self.vocab) if rng.random() < self.corrupt else tok
            sibling = rng.randrange(self.vocab)
            if sibling != main and len(tokens) + 2 <= budget and rng.random() < 0.7:
                tokens.append(sibling)
                parents.append(parent)
            tokens.append(main)
            parents.append(parent)
            parent = len(tokens) - 1
        return DraftTree(tuple(tokens), tuple(parents), (0.5,) * len(tokens), "task")
