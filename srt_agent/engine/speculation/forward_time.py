"""The forward-time model of speculation's cost model: seconds per forward, linear in its tokens.

Fitted apart for plain decode steps and verify steps from the engine's measured forwards, with
exponential forgetting so it follows the machine's speed, and a prior from calibration forwards.
"""

from __future__ import annotations

from collections.abc import Sequence

_TIME_DECAY = 0.98  # per observed forward: the time fit follows the last ~50 forwards
_PRIOR_STRENGTH = 0.1  # the prior slope weighs like a tenth of a forward at the prior's spread of sizes


class ForwardTime:
    """Forward time as ``a + b * tokens``: least squares over recent forwards, anchored by a prior.

    Observations decay (the fit follows the machine). The prior (the startup timing) only pulls
    the slope: ``b`` minimises the squared error plus ``lam * (b - b_prior) ** 2``, with ``lam`` worth
    a tenth of a forward at the prior's spread of sizes. So when every recent forward has the same
    size (no verify steps lately) the slope is the prior's and the intercept the observed one, and
    as soon as forwards of several sizes are seen, they decide.
    """

    def __init__(self) -> None:
        self._prior: tuple[float, float, float] | None = None  # (a, b, lam)
        self._obs = [0.0] * 5  # decayed sums of w, w*n, w*n^2, w*t, w*n*t
        self._coef: tuple[float, float] | None = None

    def set_prior(self, points: Sequence[tuple[int, float]]) -> None:
        """Set the prior from ``(tokens, seconds)`` timings of forwards (e.g. measured at startup)."""
        ns = [float(n) for n, _ in points]
        ts = [float(t) for _, t in points]
        a, b = _line(
            len(ns), sum(ns), sum(n * n for n in ns), sum(ts), sum(n * t for n, t in zip(ns, ts, strict=True))
        )
        spread = max(ns) - min(ns) if ns else 0.0
        self._prior = (a, b, _PRIOR_STRENGTH * spread * spread)
        self._coef = None

    @property
    def observed(self) -> bool:
        """Whether any forward was observed."""
        return self._obs[0] > 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """Add a measured forward of ``tokens`` tokens (padding included)."""
        n = float(tokens)
        s = self._obs
        for i, value in enumerate((1.0, n, n * n, seconds, n * seconds)):
            s[i] = _TIME_DECAY * s[i] + value
        self._coef = None

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``: seconds per forward and per token (both >= 0)."""
        if self._coef is None:
            a0, b0, lam = self._prior if self._prior is not None else (1.0, 0.0, 0.0)
            w, sn, snn, st, snt = self._obs
            if w < 1e-9:
                a, b = a0, b0
            else:
                var = snn - sn * sn / w
                cov = snt - sn * st / w
                b = (cov + lam * b0) / (var + lam) if var + lam > 1e-12 else b0
                b = max(b, 0.0)  # noise can tilt the fit; more tokens never make a forward faster
                a = (st - b * sn) / w
            self._coef = (max(a, 0.0), max(b, 0.0))
        return self._coef

    def predict(self, tokens: int) -> float:
        """Predicted seconds of a forward over ``tokens`` tokens."""
        a, b = self.coefficients()
        return a + b * tokens


def _line(w: float, sn: float, snn: float, st: float, snt: float) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``t = a + b * n`` from sums (``b = 0`` without spread)."""
    if w <= 0:
        return 1.0, 0.0
    var = snn - sn * sn / w
    b = (snt - sn * st / w) / var if var > 1e-12 else 0.0
    return (st - b * sn) / w, b
