"""The statistics of the sampling check (pure): the chi-square survival function, Holm's
correction, and a Pearson goodness-of-fit test of token counts against a sparse law."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np


def _gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) (Numerical Recipes, 6.2: series for
    x < a + 1, Lentz's continued fraction otherwise); relative error ~1e-14."""
    if x <= 0.0:
        return 1.0
    log_pre = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        ap, term = a, 1.0 / a
        total = term
        for _ in range(10_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_pre))
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(log_pre) * h


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square with `dof` degrees of freedom (scipy.stats.chi2.sf)."""
    if dof <= 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    return _gamma_q(dof / 2.0, x / 2.0)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in input order (step-down, monotone, capped at 1)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def pooled_chisquare(
    observed: Counter[int], ids: np.ndarray, probs: np.ndarray, min_expected: float = 5.0
) -> tuple[float, int, int]:
    """Pearson goodness of fit of token counts to a sparse distribution.

    Cells with expected count >= `min_expected` are kept; the rest of the support and any
    observed token outside it are pooled into one cell, which is merged into the smallest
    kept cell when its own expected count is below `min_expected`.

    Args:
        observed: token id -> count; n = sum of counts.
        ids, probs: (m,) int64 support and (m,) float64 probabilities (sum 1).

    Returns:
        (chi2, dof, n_outside); dof = 0 (and chi2 = 0) when fewer than two cells remain.
    """
    n = sum(observed.values())
    expected = n * probs
    keep = expected >= min_expected
    if n == 0 or not keep.any():
        return 0.0, 0, 0
    support = set(ids.tolist())
    n_outside = sum(c for t, c in observed.items() if t not in support)
    e_cells = list(expected[keep])
    o_cells = [float(observed.get(int(t), 0)) for t in ids[keep]]
    e_rest = float(n - sum(e_cells))
    o_rest = float(n - sum(o_cells))
    if e_rest >= min_expected:
        e_cells.append(e_rest)
        o_cells.append(o_rest)
    else:
        j = int(np.argmin(e_cells))
        e_cells[j] += e_rest
        o_cells[j] += o_rest
    if len(e_cells) < 2:
        return 0.0, 0, n_outside
    e = np.asarray(e_cells)
    o = np.asarray(o_cells)
    return float(((o - e) ** 2 / e).sum()), len(e_cells) - 1, n_outside
