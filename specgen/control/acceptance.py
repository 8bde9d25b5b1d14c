"""Acceptance estimators: how likely a drafted token is accepted, by block position.

- `Rates` (the single stream's `specgen.control.single.Controller`): acceptance per
  position i of the block, alpha_i = P(x_i accepted | x_1..x_{i-1} accepted), as Beta-like
  counts with exponential forgetting, shrunk toward the pooled rate of all positions (deep
  positions are seen rarely); the same counts give the probability that the drafter
  proposes position i at all, s_i (a confidence cut-off or an n-gram lookup may stop a block
  early: positions never drafted are not rejections, they make the round shorter and its
  verification cheaper). `ChangeDetector` discounts the acceptance evidence when recent
  rounds are too unlikely under it (the text changed).
- `Acceptance` (the server's `specgen.control.batch.BatchController`): one request's counts,
  each position shrunk toward the one before it.

Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


class Rates:
    """Per-position Bernoulli rates with exponential forgetting and pooled shrinkage.

    Position i (0-based) holds decayed counts hits_i / trials_i. The estimate is
    (hits_i + shrink * pooled) / (trials_i + shrink), where pooled =
    (prior_mean * prior_strength + sum hits) / (prior_strength + sum trials): an
    optimistic prior that evidence outweighs within a round or two.

    Positions a round did not test decay by `forget * forget_untested` instead of
    `forget`. Without it a single early rejection at position i (common: the first
    tokens after a prompt are the hardest) makes blocks longer than i - 1 look bad, the
    controller stops drafting that far, position i is never tested again, and its
    estimate recovers only as fast as plain forgetting (about ten rounds on the demo
    pair, observed). With it, the old evidence there fades within a few rounds back to
    the pooled rate, so K grows again as soon as the short blocks keep being accepted.
    """

    def __init__(
        self,
        n: int,
        prior_mean: float,
        prior_strength: float,
        shrink: float,
        forget: float,
        forget_untested: float = 1.0,
    ) -> None:
        self.hits = np.zeros(n)
        self.trials = np.zeros(n)
        self.prior_mean = prior_mean
        self.prior_strength = prior_strength
        self.shrink = shrink
        self.forget = forget
        self.forget_untested = forget_untested

    def update(self, tested: int, hits: int) -> None:
        """One round: positions 0..tested-1 were tried, the first `hits` of them succeeded."""
        # forgetting per round (not per trial) so stale deep positions drift back to the pool
        self.hits *= self.forget
        self.trials *= self.forget
        self.hits[tested:] *= self.forget_untested
        self.trials[tested:] *= self.forget_untested
        self.trials[:tested] += 1.0
        self.hits[:hits] += 1.0

    def discount(self, factor: float) -> None:
        """Keep only `factor` of the evidence (after a detected change)."""
        self.hits *= factor
        self.trials *= factor

    def pooled(self) -> float:
        num = self.prior_mean * self.prior_strength + float(self.hits.sum())
        return num / (self.prior_strength + float(self.trials.sum()))

    def estimate(self) -> FloatArray:
        """(n,) float64 rates in [0, 1]."""
        pooled = self.pooled()
        return (self.hits + self.shrink * pooled) / (self.trials + self.shrink)


_SURPRISING = 0.1  # tail probability that makes a round count toward a change


class ChangeDetector:
    """Discount the acceptance evidence when recent rounds are too unlikely under it.

    Forgetting alone is slow to notice that the text changed (say, from copying to
    free writing): the counts of a long run of accepted blocks take many rejections
    to outweigh, and all that time the controller drafts long blocks in vain. Each
    round's accepted length N is scored by its tail probability under the current
    estimates, P(N <= n) or P(N >= n) (whichever is smaller). A round whose tail is
    below 0.1 is surprising; when the product of the tails of a run of consecutive
    surprising rounds (same direction) falls below `p`, that is taken as a
    change and only `keep` of the evidence is kept. With alpha = 0.95 -> 0.02
    that is three rounds; on stationary acceptance it fires rarely (each false alarm
    only weakens the estimates for a few rounds).

    Args:
        p: the product of tails below which a run of surprising rounds is a change (0
            disables it).
        keep: the share of the evidence kept after a change.
    """

    def __init__(self, p: float, keep: float) -> None:
        self.p = p
        self.keep = keep
        self._streak, self._streak_dir = 1.0, 0

    def observe(self, rates: Rates, n: int, m: int) -> None:
        """A round accepted n of the m >= 1 positions it tested; discounts `rates` (the
        acceptance by position) on a change.
        """
        reach = np.cumprod(rates.estimate()[:m])  # P(N >= j), j = 1..m
        upper = float(reach[n - 1]) if n > 0 else 1.0  # P(N >= n)
        lower = 1.0 - float(reach[n]) if n < m else 1.0  # P(N <= n)
        direction, tail = (-1, lower) if lower < upper else (1, upper)
        if tail >= _SURPRISING:
            self._streak, self._streak_dir = 1.0, 0
            return
        if direction != self._streak_dir:
            self._streak, self._streak_dir = 1.0, direction
        self._streak *= tail
        if self._streak < self.p:
            rates.discount(self.keep)
            self._streak, self._streak_dir = 1.0, 0


class Acceptance:
    """One request's acceptance by block position, as counts shrunk toward the position
    before it.

    alpha_1 = (hits_1 + w * prior) / (tested_1 + w) and alpha_i = (hits_i + w * alpha_{i-1})
    / (tested_i + w): position i is tested in a round when positions 1..i-1 were accepted;
    a round with n accepted of K tested positions 1..n+1 (1..K when all were accepted).
    A position never tested takes the estimate of the one before it, not the pooled prior:
    a request served at K = 1 whose every x_1 is accepted must be able to grow its K (with
    the prior at each deeper position, K stayed 1 for a whole request). `pool` names the
    pooled rate its rounds add to (`BatchController.new_acceptance`).
    """

    def __init__(
        self, prior: float, weight: float = 2.0, depth: int = 32, pool: Hashable = None
    ) -> None:
        self.prior = prior
        self.pool = pool
        self.weight = weight
        self.tested = np.zeros(depth)
        self.hits = np.zeros(depth)

    def update(self, k: int, n_accepted: int) -> None:
        k = min(k, self.tested.size)
        n = min(n_accepted, k)
        self.tested[: min(n + 1, k)] += 1
        self.hits[:n] += 1

    def alpha_by_pos(self, k: int) -> tuple[float, ...]:
        k = min(max(k, 1), self.tested.size)
        out, prev = [], self.prior
        for hits, tested in zip(self.hits[:k], self.tested[:k], strict=True):
            prev = float((hits + self.weight * prev) / (tested + self.weight))
            out.append(prev)
        return tuple(out)
