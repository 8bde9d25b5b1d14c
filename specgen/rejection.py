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


# -- block verification -----------------------------------------------------------------
#
# Sun et al. 2025, "Block Verification Accelerates Speculative Decoding" (ICLR),
# Algorithm 2. Notation as above, plus: q(x^i) = q_1(x_1) ... q_i(x_i) and
# p(x^i) = p_1(x_1) ... p_i(x_i) for a prefix x^i = x_1..x_i of the block.
#
#   P_0 = 1,  P_i = min(1, P_{i-1} p_i(x_i) / q_i(x_i))              (i = 1..K)
#   r_i = sum_x max(P_i p_{i+1}(x) - q_{i+1}(x), 0)                   (i = 0..K-1)
#   h_i = r_i / (r_i + 1 - P_i)   (1 when the denominator is 0),  h_K = P_K
#   eta_1..eta_K fresh independent uniforms; tau = the last i with eta_i < h_i (0 if none)
#   emit x_1..x_tau, then Y ~ norm(max(P_tau p_{tau+1} - q_{tau+1}, 0)) if tau < K,
#   Y ~ p_{K+1} if tau = K (no Y when the round scored no bonus row).
#
# Why the output is distributed as the target's (proof sketch).
# (1) P(tau >= i | x^i) = P_i, the probability taken over the rest of the block
#     (x_{i+1}..x_K ~ q) and the uniforms. Backwards from i = K, where it is h_K = P_K:
#     {tau >= i} = {tau >= i + 1} or {eta_i < h_i}, and eta_i is independent of the
#     rest, so P(tau >= i | x^i) = 1 - (1 - P(tau >= i + 1 | x^i)) (1 - h_i). By
#     induction P(tau >= i + 1 | x^i) = sum_x q_{i+1}(x) P_{i+1}(x^i x)
#     = sum_x min(q_{i+1}(x), P_i p_{i+1}(x)) = P_i - r_i, and
#     (1 - P_i + r_i)(1 - h_i) = 1 - P_i by the choice of h_i.
# (2) Write W_i(x^i) = q(x^i) P_i(x^i) = min(q(x^i), W_{i-1}(x^{i-1}) p_i(x_i)), W_0 = 1.
#     By (1), P(X^i = x^i, tau >= i) = W_i, so P(X^i = x^i, tau = i) = W_i - sum_x
#     W_{i+1}(x^i x) = q(x^i) r_i, and with Y's law P(X^i = x^i, tau = i, Y = y)
#     = max(W_i p_{i+1}(y) - q(x^i y), 0) = W_i p_{i+1}(y) - W_{i+1}(x^i y).
# (3) The text starts with s = s_1..s_j (j <= K + 1) either because the block covers
#     it (tau >= j, X^j = s: W_j) or because a round ending at i < j (tau = i, X^i = s^i,
#     Y = s_{i+1}) is followed by target-distributed text (the next rounds, by
#     induction over rounds). With V_i = W_i(s^i) p(s_{i+1}..s_j | s^i) the second kind
#     sums to sum_{i<j} (V_i - V_{i+1}) = p(s) - W_j: the total is p(s). At tau = K the
#     bonus Y ~ p_{K+1} is one more conditionally independent draw from the target, so
#     leaving it out (a round scored without its bonus row, decided before the round)
#     changes nothing: the next round draws that position from the same p_{K+1}.
#
# Token-wise verification (`verify`) is the special case where each position is tested
# alone; block verification accepts at least as much in expectation and is optimal among
# rules that see only the drafted path (the paper's Theorem 2). It equals token-wise
# exactly at K = 1 (h_1 = P_1 = min(1, p_1/q_1), residual norm(max(p_1 - q_1, 0))) and
# when p and q are both one-hot (greedy): P_i is 1 up to the first mismatch and 0 after,
# so h_i = P_i and tau is the matched prefix. With one-hot q alone (prompt lookup) it
# equals token-wise in law: P_i = p_1(x_1)...p_i(x_i) is then token-wise's P(n >= i).
#
# Sparse rows: r_i and the residual read p_{i+1} on its support and q_{i+1} there
# (max(P_i p - q, 0) is zero outside supp(p_{i+1})), like `residual_row`.


def cumulative_ratios(x: npt.NDArray[np.int64], q: Rows, p: Rows) -> Probs:
    """P_0..P_K: (K + 1,) float64, P_0 = 1, P_i = min(1, P_{i-1} p_i(x_i) / q_i(x_i)).

    x: (K,) int64; q: K draft distributions (q_i(x_i) > 0); p: at least K target ones.
    """
    k = x.shape[0]
    ratio = as_dists(p)[:k].at(x) / as_dists(q)[:k].at(x)
    big_p = np.ones(k + 1, dtype=np.float64)
    for i in range(k):
        # once 0, P stays 0: a later ratio overflowed to inf (q_i(x_i) below 1e-308) would
        # make 0 * inf NaN, which min() takes for 1.0
        big_p[i + 1] = 0.0 if big_p[i] == 0.0 else min(1.0, big_p[i] * ratio[i])
    return big_p


def block_weights(x: npt.NDArray[np.int64], q: Rows, p: Rows) -> tuple[Probs, Probs]:
    """The cumulative ratios P_0..P_K and the pass probabilities h_1..h_K.

    Args:
        x: (K,) int64 drafted tokens.
        q: K draft distributions, q_i(x_i) > 0.
        p: K + 1 (or K: no bonus row; h_K does not read p_{K+1}) target distributions.

    Returns:
        (P, h): (K + 1,) float64 P with P[0] = 1 (`cumulative_ratios`), and (K,) float64
        h with h[i - 1] = h_i; every entry in [0, 1].
    """
    k = x.shape[0]
    qd, pd = as_dists(q), as_dists(p)
    big_p = cumulative_ratios(x, qd, pd)
    h = np.empty(k, dtype=np.float64)
    for i in range(1, k):
        r = _residual_mass(qd, pd, i, big_p[i])
        den = r + 1.0 - big_p[i]
        h[i - 1] = r / den if den > 0.0 else 1.0
    if k:
        h[k - 1] = big_p[k]
    return big_p, h


def _block_residual(
    q: Dists, p: Dists, i: int, big_p_i: float
) -> tuple[npt.NDArray[np.int64], Probs]:
    """max(P_i p_{i+1} - q_{i+1}, 0) on supp(p_{i+1}) (rows i of p and q), unnormalized."""
    ids, p_row = p.row(i)
    q_row = q.probs[i] if p.dense and q.dense else q.on(i, ids)  # whole rows: no gather
    return ids, np.maximum(big_p_i * p_row - q_row, 0.0)


def _residual_mass(q: Dists, p: Dists, i: int, big_p_i: float) -> float:
    """r_i = sum_x max(P_i p_{i+1}(x) - q_{i+1}(x), 0)."""
    return float(_block_residual(q, p, i, big_p_i)[1].sum())


def last_passing(eta: Probs, h: Probs) -> int:
    """tau: the last i in 1..K with eta_i < h_i, 0 if none (Algorithm 2, lines 3-7).

    The paper's test is eta_i <= h_i on a continuous eta; with eta in [0, 1) the strict
    test passes with probability h_i exactly, and at K = 1 it is `accept`'s u < p/q.
    eta, h: (K,) float64.
    """
    passed = np.flatnonzero(eta < h)
    return int(passed[-1]) + 1 if passed.size else 0


def block_accept(x: npt.NDArray[np.int64], q: Rows, p: Rows, eta: Probs) -> int:
    """tau, the accepted length under block verification.

    Args:
        x: (K,) int64 drafted tokens.
        q: K draft distributions, q_i(x_i) > 0.
        p: K + 1 (or K) target distributions.
        eta: (K,) float64 fresh independent uniforms in [0, 1), one per position.

    Returns:
        tau in [0, K]: x_1..x_tau accepted (`last_passing` of `block_weights`' h).
    """
    return last_passing(eta, block_weights(x, q, p)[1])


def block_residual_row(
    tau: int, big_p_tau: float, q: Rows, p: Rows
) -> tuple[npt.NDArray[np.int64], Probs]:
    """norm(max(P_tau p_{tau+1} - q_{tau+1}, 0)) on p_{tau+1}'s support, tau < K:
    (ids, probs), (m,) int64 and (m,) float64 summing to 1. big_p_tau is P_tau
    (`cumulative_ratios`; 1 at tau = 0, where this is `residual_row`).

    When rounding leaves it all zero (tau then had probability ~0), p_{tau+1} itself is
    returned, the limit of the rule, as in `residual`.
    """
    ids, r = _block_residual(as_dists(q), as_dists(p), tau, big_p_tau)
    s = r.sum()
    return ids, (r / s if s > 0.0 else as_dists(p).row(tau)[1])


def block_correct(
    tau: int, big_p_tau: float, q: Rows, p: Rows, rng: np.random.Generator
) -> int | None:
    """The token after the accepted x_1..x_tau (Algorithm 2, line 8).

    tau < K: a draw from `block_residual_row`. tau = K: the bonus token, a draw from
    p_{K+1}, or None when p has only K rows (the round scored no bonus row; exact, see
    the proof sketch above). One uniform is drawn unless the row has a single token.
    """
    k = len(as_dists(q))
    if tau < k:
        return draw(*block_residual_row(tau, big_p_tau, q, p), rng)
    pd = as_dists(p)
    return draw(*pd.row(k), rng) if len(pd) > k else None


def verify_block(
    x: npt.NDArray[np.int64], q: Rows, p: Rows, rng: np.random.Generator
) -> tuple[int, int | None]:
    """One whole round by block verification: (tau, next_token). Draws K uniforms
    (eta) then one for the correction, in `verify`'s order, so a seed fixes the outcome."""
    eta = rng.random(x.shape[0])
    big_p, h = block_weights(x, q, p)
    tau = last_passing(eta, h)
    return tau, block_correct(tau, float(big_p[tau]), q, p, rng)
