"""Acceptance calibration of speculation's cost model: how often drafted nodes are accepted.

The expected acceptance of a node is ``min(1, rate * q)``, ``q`` its draft probability and ``rate``
measured per (calibration key, depth) over the recent verify steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

_ACCEPT_DECAY = 0.95  # per verify step: acceptance is measured over roughly the last 20 verify steps
# Before any measurement a cell trusts the draft's probabilities (factor 1) with the weight of a
# tenth of a node: one rejected node already outweighs it, so useless drafts are dropped within a
# step or two, while sources and depths never verified yet stay optimistic (they get tried).
_PRIOR_NODES = 0.1


@dataclass
class _Cell:
    nodes: float = 0.0  # decayed count of verified nodes
    mass: float = 0.0  # decayed sum of their draft probabilities q
    accepted: float = 0.0  # decayed count of accepted ones

    def rate(self) -> float:
        # accepted / expected, with a prior of _PRIOR_NODES nodes at factor 1 and this cell's mean q.
        mean_q = self.mass / self.nodes if self.nodes > 0 else 1.0
        prior_mass = _PRIOR_NODES * mean_q
        return (self.accepted + prior_mass) / (self.mass + prior_mass)


@dataclass
class Acceptance:
    """Calibration of draft probabilities: expected acceptance of a node is ``min(1, rate * q)``.

    One cell per (calibration key, depth), the key being the draft's calibration class within its
    request's group; all cells forget at each verify step.
    """

    cells: dict[tuple[str, int], _Cell] = field(default_factory=dict)
    # Rates read since the last observation: every row of every step reads them per node, and they
    # change only when a verify step is observed.
    _rates: dict[tuple[str, int], float] = field(default_factory=dict, repr=False)
    _rate_lists: dict[tuple[str, int], list[float]] = field(default_factory=dict, repr=False)

    def rate(self, source: str, depth: int) -> float:
        """Calibration factor of nodes at ``depth`` (1 = child of the root) from ``source``."""
        key = (source, depth)
        value = self._rates.get(key)
        if value is None:
            cell = self.cells.get(key)
            value = self._rates[key] = cell.rate() if cell is not None else 1.0
        return value

    def rates(self, source: str, depths: int) -> list[float]:
        """:meth:`rate` at depths ``1 .. depths`` (cached until the next observation)."""
        key = (source, depths)
        cached = self._rate_lists.get(key)
        if cached is None:
            cached = self._rate_lists[key] = [self.rate(source, d) for d in range(1, depths + 1)]
        return cached

    def best_rate(self, depth: int) -> float:
        """The most optimistic factor at ``depth`` over the sources seen so far (1 before any)."""
        rates = [c.rate() for (_, d), c in self.cells.items() if d == depth]
        seen = {s for s, _ in self.cells}
        if not seen:
            return 1.0
        # A depth never verified for a seen source keeps the prior (it is unexplored).
        return max(rates) if len(rates) == len(seen) else 1.0

    def observe(self, observations: Sequence[tuple[str, int, int, float, int]]) -> None:
        """Forget a little, then add one verify step's evidence.

        Args:
            observations: ``(source, depth, nodes, mass, accepted)``: nodes verified at that depth
                (of one draft, or summed over several), the sum of their draft probabilities
                ``q`` and how many were accepted.
        """
        self._rates.clear()
        self._rate_lists.clear()
        for cell in self.cells.values():
            cell.nodes *= _ACCEPT_DECAY
            cell.mass *= _ACCEPT_DECAY
            cell.accepted *= _ACCEPT_DECAY
        for source, depth, nodes, mass, accepted in observations:
            cell = self.cells.setdefault((source, depth), _Cell())
            cell.nodes += nodes
            cell.mass += mass
            cell.accepted += accepted
