"""The chi-square check the statistical tests share: observed sequences against a law."""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import stats


def chi2_pvalue(counts: Counter, law: dict) -> float:
    """Chi-square p-value of `counts` (sequence -> times seen) against `law` (sequence ->
    probability), cells expected fewer than 5 times pooled into one so the approximation
    holds; 0.0 where a sequence of probability 0 (or outside the law) was seen."""
    if any(law.get(k, 0.0) == 0.0 for k in counts):
        return 0.0
    keys = sorted(law)
    n = sum(counts.values())
    exp = np.array([law[k] for k in keys]) * n
    obs = np.array([counts[k] for k in keys], dtype=float)
    big = exp >= 5
    small = (exp > 0) & ~big
    obs_p = np.append(obs[big], obs[small].sum()) if small.any() else obs[big]
    exp_p = np.append(exp[big], exp[small].sum()) if small.any() else exp[big]
    return float(stats.chisquare(obs_p, exp_p).pvalue)
