"""One verification round of speculative sampling, in the papers' notation.

Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling",
Algorithm 2. Notation: K drafted tokens x_1..x_K; q_i the draft distribution x_i was
drawn from; p_i the target distribution at the same position; p_{K+1} the target
distribution after the whole block.

Why the output is distributed as p: token x is emitted at a position either by
acceptance, with probability q(x) min(1, p(x)/q(x)) = min(p(x), q(x)), or by rejection
(probability 1 - sum_y min(p(y), q(y)) = sum_y max(0, p(y) - q(y))) followed by a draw
from the residual norm(max(0, p - q)), with probability max(0, p(x) - q(x)). The sum is
min(p, q) + max(0, p - q) = p(x).

Sparse rows. After the warpers p_i and q_i are supported on a few tokens each
(`specgen.sampling.Dists`: (ids, probs) per row). Nothing above needs more: acceptance
reads only p_i(x_i) and q_i(x_i); max(0, p_i - q_i) is zero wherever p_i is, so the
residual lives on supp(p_i) and needs q_i only there; the bonus token is a draw from
p_{K+1} over its support. Every function below takes p and q either as dense
(rows, n_vocab) float64 arrays or as `Dists` batches, sparse or dense.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from specgen.sampling import Dists, draw

Probs = npt.NDArray[np.float64]
Rows = Dists | Probs
"""p or q: a `Dists` batch, or a dense (rows, n_vocab) float64 array (rows sum to 1)."""


def as_dists(rows: Rows) -> Dists:
    """A dense (rows, n_vocab) array as a dense `Dists` (no copy); a `Dists` unchanged."""
    if isinstance(rows, Dists):
        return rows
    a = np.asarray(rows, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    return Dists(None, a, a.shape[1])


def accept(x: npt.NDArray[np.int64], q: Rows, p: Rows, u: npt.NDArray[np.float64]) -> int:
    """Length n of the accepted prefix: x_i is accepted iff u_i < p_i(x_i) / q_i(x_i).

    Args:
        x: (K,) int64 drafted tokens.
        q: K draft distributions, q_i(x_i) > 0.
        p: K + 1 (or K) target distributions.
        u: (K,) float64 uniforms in [0, 1).

    Returns:
        n in [0, K]: x_1..x_n accepted, x_{n+1} (if n < K) rejected.
    """
    k = x.shape[0]
    q_x = as_dists(q)[:k].at(x)
    p_x = as_dists(p)[:k].at(x)
    # u * q < p  <=>  u < p / q, without dividing (q(x) > 0 since x was drawn from q)
    ok = u * q_x < p_x
    rejected = np.flatnonzero(~ok)
    return int(rejected[0]) if rejected.size else k


def residual(p_i: Probs, q_i: Probs) -> Probs:
    """norm(max(0, p_i - q_i)): float64, same shape as the inputs, sums to 1.

    p_i and q_i are aligned vectors: over the whole vocabulary, or over p_i's support
    (q_i[j] = q_i at p_i's j-th token), which loses nothing since max(0, p - q) is zero
    outside supp(p). When p_i == q_i a rejection has probability zero; if rounding still
    produces one (an all-zero residual), p_i itself is returned, the limit of the rule.
    """
    r = np.maximum(p_i - q_i, 0.0)
    s = r.sum()
    return r / s if s > 0.0 else p_i


def residual_row(q: Rows, p: Rows, i: int) -> tuple[npt.NDArray[np.int64], Probs]:
    """The residual at position i + 1 on p_{i+1}'s support: (ids, residual) with (m,)
    int64 token ids and (m,) float64 probabilities (see `residual`)."""
    ids, p_i = as_dists(p).row(i)
    return ids, residual(p_i, as_dists(q).on(i, ids))


def correct(n: int, q: Rows, p: Rows, rng: np.random.Generator) -> int:
    """The token after the accepted prefix (stage 4).

    n < K: a draw from the residual norm(max(0, p_{n+1} - q_{n+1})).
    n == K: the bonus token, a draw from p_{K+1}.

    Args:
        n: accepted length from `accept`.
        q: K draft distributions.
        p: K + 1 target distributions.
        rng: the target-side generator (one uniform is drawn unless the row has a
            single token).
    """
    k = len(as_dists(q))
    ids, row = residual_row(q, p, n) if n < k else as_dists(p).row(k)
    return draw(ids, row, rng)


def accept_greedy(x: npt.NDArray[np.int64], argmax_p: npt.NDArray[np.int64]) -> int:
    """Temperature 0: accept while x_i equals the target's argmax at position i.

    This is `accept` with one-hot p and q (p_i(x_i) is 1 or 0). Args: x (K,) int64,
    argmax_p (K + 1,) or (K,) int64. Returns n in [0, K].
    """
    k = x.shape[0]
    miss = np.flatnonzero(x != argmax_p[:k])
    return int(miss[0]) if miss.size else k
