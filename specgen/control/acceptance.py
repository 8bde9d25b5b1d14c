"""The acceptance estimator: how likely a drafted token is accepted, by block position
(`Acceptance`: one request's counts, each position shrunk toward the one before it), for
the controller (`specgen.control.batch.BatchController`).

Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


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

    With `fade` < 1 the positions a round's block did not reach (i > K) fade back toward
    the estimate of the position before: their counts are multiplied by `fade` each such
    round (`BatchController.fade_untested` says where).
    """

    def __init__(
        self,
        prior: float,
        weight: float = 2.0,
        depth: int = 32,
        pool: Hashable = None,
        fade: float = 1.0,
    ) -> None:
        self.prior = prior
        self.pool = pool
        self.weight = weight
        self.fade = fade
        self.tested = np.zeros(depth)
        self.hits = np.zeros(depth)

    def update(self, k: int, n_accepted: int) -> None:
        k = min(k, self.tested.size)
        n = min(n_accepted, k)
        self.tested[: min(n + 1, k)] += 1
        self.hits[:n] += 1
        self.tested[k:] *= self.fade
        self.hits[k:] *= self.fade

    def alpha_by_pos(self, k: int) -> tuple[float, ...]:
        k = min(max(k, 1), self.tested.size)
        out, prev = [], self.prior
        for hits, tested in zip(self.hits[:k], self.tested[:k], strict=True):
            prev = float((hits + self.weight * prev) / (tested + self.weight))
            out.append(prev)
        return tuple(out)
