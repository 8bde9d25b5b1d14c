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
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from specgen.sampling import draw_dense

Probs = npt.NDArray[np.float64]


def accept(x: npt.NDArray[np.int64], q: Probs, p: Probs, u: npt.NDArray[np.float64]) -> int:
    """Length n of the accepted prefix: x_i is accepted iff u_i < p_i(x_i) / q_i(x_i).

    Args:
        x: (K,) int64 drafted tokens.
        q: (K, n_vocab) float64 draft distributions, rows sum to 1, q_i(x_i) > 0.
        p: (K + 1, n_vocab) or (K, n_vocab) float64 target distributions.
        u: (K,) float64 uniforms in [0, 1).

    Returns:
        n in [0, K]: x_1..x_n accepted, x_{n+1} (if n < K) rejected.
    """
    k = x.shape[0]
    rows = np.arange(k)
    # u * q < p  <=>  u < p / q, without dividing (q(x) > 0 since x was drawn from q)
    ok = u * q[rows, x] < p[rows, x]
    rejected = np.flatnonzero(~ok)
    return int(rejected[0]) if rejected.size else k


def residual(p_i: Probs, q_i: Probs) -> Probs:
    """norm(max(0, p_i - q_i)) over the full vocabulary: (n_vocab,) float64, sums to 1.

    When p_i == q_i a rejection has probability zero; if rounding still produces one
    (an all-zero residual), p_i itself is returned, which is the limit of the rule.
    """
    r = np.maximum(p_i - q_i, 0.0)
    s = r.sum()
    return r / s if s > 0.0 else p_i


def correct(n: int, q: Probs, p: Probs, rng: np.random.Generator) -> int:
    """The token after the accepted prefix (stage 4).

    n < K: a draw from the residual norm(max(0, p_{n+1} - q_{n+1})).
    n == K: the bonus token, a draw from p_{K+1}.

    Args:
        n: accepted length from `accept`.
        q: (K, n_vocab) float64 draft distributions.
        p: (K + 1, n_vocab) float64 target distributions.
        rng: the target-side generator.
    """
    k = q.shape[0]
    row = residual(p[n], q[n]) if n < k else p[k]
    return draw_dense(row, rng)


def verify(
    x: npt.NDArray[np.int64], q: Probs, p: Probs, rng: np.random.Generator
) -> tuple[int, int]:
    """One whole round: (n_accepted, next_token). See `accept` and `correct` for shapes.

    Draws exactly K uniforms for acceptance then one for the correction, so a seed
    fixes the outcome.
    """
    u = rng.random(x.shape[0])
    n = accept(x, q, p, u)
    return n, correct(n, q, p, rng)


def accept_greedy(x: npt.NDArray[np.int64], argmax_p: npt.NDArray[np.int64]) -> int:
    """Temperature 0: accept while x_i equals the target's argmax at position i.

    This is `accept` with one-hot p and q (p_i(x_i) is 1 or 0). Args: x (K,) int64,
    argmax_p (K + 1,) or (K,) int64. Returns n in [0, K].
    """
    k = x.shape[0]
    miss = np.flatnonzero(x != argmax_p[:k])
    return int(miss[0]) if miss.size else k
