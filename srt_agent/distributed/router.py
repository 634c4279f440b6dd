"""Which replica serves a request: cache-aware routing, as SGLang's router does for prefixes.

A replica's tree cache only drafts from what that replica generated. So every request of one task
(its conversation states, and every sample of its GRPO group) goes to the same replica: the first
request of a task picks the replica with the fewest tasks, and the task stays there until that
replica dies. ``round_robin`` spreads requests instead (the comparison the benchmark makes).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Literal

__all__ = ["Router"]


class Router:
    """Maps routing keys (task ids, else state keys) to replica indices.

    Args:
        replicas: Number of replicas.
        mode: ``cache_aware`` (sticky per key, least-loaded first) or ``round_robin``.
    """

    def __init__(self, replicas: int, mode: Literal["cache_aware", "round_robin"] = "cache_aware") -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.replicas = replicas
        self.mode = mode
        self._owner: dict[str, int] = {}
        self._load = [0] * replicas
        self._next = 0
        self._lock = threading.Lock()

    def pick(self, key: str) -> int:
        """The replica for ``key``."""
        with self._lock:
            if self.mode == "round_robin":
                self._next = (self._next + 1) % self.replicas
                return self._next
            owner = self._owner.get(key)
            if owner is None:
                owner = min(range(self.replicas), key=lambda r: (self._load[r], r))
                self._owner[key] = owner
                self._load[owner] += 1
            return owner

    def owners(self) -> dict[str, int]:
        """Every key routed so far and its replica (cache-aware mode), to keep with the caches."""
        with self._lock:
            return dict(self._owner)

    def restore(self, owners: Mapping[str, int]) -> None:
        """Route keys to the replicas :meth:`owners` gave (those past ``replicas`` are dropped).

        A resumed run's replicas start from the caches saved with these routes: each task goes
        back to the replica whose cache holds its history.
        """
        with self._lock:
            for key, replica in owners.items():
                if 0 <= replica < self.replicas and key not in self._owner:
                    self._owner[key] = replica
                    self._load[replica] += 1

    def tasks_of(self, replica: int) -> list[str]:
        """The keys routed to ``replica`` (cache-aware mode)."""
        with self._lock:
            return [k for k, r in self._owner.items() if r == replica]
