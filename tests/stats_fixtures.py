"""Statistical helpers shared by the exactness tests."""

from __future__ import annotations

from collections import Counter

import torch


def chi_square_p(counts: Counter[tuple[int, ...]], joint: dict[tuple[int, ...], float], n: int) -> float:
    """p-value of Pearson's test; cells expecting fewer than 5 samples are pooled into one."""
    assert all(joint.get(c, 0.0) > 0 for c in counts), "sampled a continuation of probability 0"
    stat, pooled_obs, pooled_exp, bins = 0.0, 0, 0.0, 0
    for cell, p in joint.items():
        if p == 0:
            continue
        if n * p < 5:
            pooled_obs += counts[cell]
            pooled_exp += n * p
            continue
        stat += (counts[cell] - n * p) ** 2 / (n * p)
        bins += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        bins += 1
    df = torch.tensor((bins - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))
