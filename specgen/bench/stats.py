"""The pure statistics of `specgen bench`: percentiles, the bootstrap interval of a median,
and the theoretical speedup of Leviathan et al. 2023 from measured acceptance and costs
(acceptance itself is counted by `specgen.acceptance_stats`). No models, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specgen.control.goodput import expected_tokens

# -- statistics (pure) ----------------------------------------------------------------------


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> list[float]:
    """Linear-interpolation percentiles (numpy's default); NaN for no values."""
    if len(values) == 0:
        return [float("nan")] * len(qs)
    return [float(x) for x in np.percentile(np.asarray(values, dtype=np.float64), qs)]


def bootstrap_median_ci(
    values: Sequence[float], level: float = 0.95, n_boot: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval for the median of `values`.

    Resamples the values with replacement `n_boot` times (seeded, so a result reproduces
    exactly) and returns the (1-level)/2 and (1+level)/2 quantiles of the resampled
    medians. One value: (v, v). Raises ValueError for none.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    meds = np.median(x[idx], axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def theoretical_speedup(
    alpha_by_pos: Sequence[float],
    block_sizes: Sequence[int],
    draft_token_s: float,
    verify_s: Callable[[int], float],
    ordinary_token_s: float,
) -> float:
    """Speedup over ordinary decoding that the measured acceptance and costs allow.

    Each round with block m is expected to emit E(m) = 1 + sum_{i<=m} prod_{j<=i} alpha_j
    tokens (Leviathan et al. 2023, eq. (1) for a constant alpha: (1 - alpha^(m+1)) /
    (1 - alpha); `specgen.control.goodput.expected_tokens`) and to cost m * draft_token_s +
    verify_s(m). Over the rounds actually run (block sizes `block_sizes`, which lets an
    adaptive K count):

        bound = (sum E(m_r) / sum (m_r * draft_token_s + verify_s(m_r))) * ordinary_token_s

    For a fixed block K this is E(K) * ordinary_token_s / (K * draft_token_s + verify_s(K)).

    Args:
        alpha_by_pos: measured acceptance at positions 1, 2, ... (last value repeats).
        block_sizes: drafted tokens of each round (0 = an ordinary pass).
        draft_token_s: seconds to draft one token.
        verify_s: seconds of the rest of a round (target pass on m+1 tokens, sampling,
            bookkeeping) as a function of m.
        ordinary_token_s: seconds per token of ordinary decoding.
    """
    if not block_sizes:
        return float("nan")
    tokens = sum(expected_tokens(alpha_by_pos, m) for m in block_sizes)
    cost = sum(m * draft_token_s + verify_s(m) for m in block_sizes)
    return tokens / cost * ordinary_token_s if cost > 0 else float("nan")
