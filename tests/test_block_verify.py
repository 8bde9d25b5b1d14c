"""Block verification (Sun et al. 2025, Algorithm 2): exact where it is deterministic,
statistical where it is random.

Exact tests: the paper's two-symbol example by hand and by enumeration (uniforms on a
grid fine enough that every threshold falls between grid points, so the grid average
is the exact expectation); equality with token-wise verification where the rules
coincide. Statistical tests: the joint law of the first three emitted tokens of the
whole process (rounds repeated until three tokens) against the target's, by chi-square
with a fixed seed, failing below ALPHA = 1e-4 (a correct rule fails spuriously with
probability 1e-4 per test; the seed makes each run identical); the broken variants
below must fail the same test.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from reference import dense, verify
from scipy import stats

from specgen import rejection
from specgen.sampling import Dists

ALPHA = 1e-4

# -- the paper's two-symbol example: symbols a = 0, b = 1, models context-free ---------

P_AB = np.array([1 / 3, 2 / 3])  # target M_b
Q_AB = np.array([2 / 3, 1 / 3])  # draft M_s
GRID = 12  # every h and every p/q in the example is a multiple of 1/12


def grid(k):
    """All eta vectors of the grid: midpoints (j + 1/2) / GRID, each weight GRID^-k."""
    mids = (np.arange(GRID) + 0.5) / GRID
    return [np.array(e) for e in itertools.product(mids, repeat=k)]


def two_symbol_rows(x, bonus=True):
    k = len(x)
    q = np.tile(Q_AB, (k, 1))
    p = np.tile(P_AB, (k + 1 if bonus else k, 1))
    return np.asarray(x, dtype=np.int64), q, p


def test_two_symbol_weights_by_hand():
    big_p, h = rejection.block_weights(*two_symbol_rows([0, 0]))
    np.testing.assert_allclose(big_p, [1, 1 / 2, 1 / 4])
    np.testing.assert_allclose(h, [0, 1 / 4])  # r_1 = 0: P_1 p leaves nothing above q
    big_p, h = rejection.block_weights(*two_symbol_rows([1, 0]))
    np.testing.assert_allclose(big_p, [1, 1, 1 / 2])
    np.testing.assert_allclose(h, [1, 1 / 2])  # r_1 = 1/3, 1 - P_1 = 0
    # no bonus row: h_K = P_K does not read p_{K+1}
    assert np.array_equal(rejection.block_weights(*two_symbol_rows([1, 0], bonus=False))[1], h)


def closed_form_lengths():
    """Expected accepted length at K = 2, by hand (the paper's Section 2).

    Token-wise: beta = sum min(p, q) = 2/3 per position, E[n] = beta + beta^2 = 10/9.
    Block: by draft (probability, E[tau]): aa (4/9, 2 * 1/4), ab (2/9, 2),
    ba (2/9, 2 * 1/2 + 1 * 1/2), bb (1/9, 2): 2/9 + 4/9 + 3/9 + 2/9 = 11/9.
    """
    return Fraction(10, 9), Fraction(11, 9)


def enumerated_lengths():
    token = block = 0.0
    for x in itertools.product([0, 1], repeat=2):
        x_, q, p = two_symbol_rows(x)
        weight = Q_AB[x[0]] * Q_AB[x[1]] / GRID**2
        for u in grid(2):
            token += weight * rejection.accept(x_, q, p, u)
            block += weight * rejection.block_accept(x_, q, p, u)
    return token, block


def test_two_symbol_expected_length_closed_form_and_enumeration():
    token_cf, block_cf = closed_form_lengths()
    token, block = enumerated_lengths()
    assert token == pytest.approx(float(token_cf), abs=1e-12)
    assert block == pytest.approx(float(block_cf), abs=1e-12)
    assert block_cf > token_cf


def stream_law(verifier_rows, bonus=True, n=3):
    """Exact P(text starts with s) for |s| = n in the two-symbol example: enumerate the
    draft, the eta grid and the correction's law; after the round the text continues
    from the target (its law after any context is P_AB)."""
    k = 2
    law = np.zeros((2,) * n)
    for x in itertools.product([0, 1], repeat=k):
        x_, q, p = two_symbol_rows(x, bonus)
        weight = Q_AB[x[0]] * Q_AB[x[1]] / GRID**k
        for eta in grid(k):
            tau, big_p_tau = verifier_rows(x_, q, p, eta)
            if tau < k:
                ids, row = rejection.block_residual_row(tau, big_p_tau, q, p)
                nxt = {int(i): float(w) for i, w in zip(ids, row, strict=True)}
            elif bonus:
                nxt = {0: P_AB[0], 1: P_AB[1]}
            else:
                nxt = {}
            for y, wy in (nxt or {None: 1.0}).items():
                head = list(x[:tau]) + ([] if y is None else [y])
                for s in itertools.product([0, 1], repeat=n):
                    if list(s[: len(head)]) != head[:n]:
                        continue
                    tail = s[len(head) :]
                    law[s] += weight * wy * np.prod([P_AB[t] for t in tail])
    return law


def correct_rule(x, q, p, eta):
    big_p, h = rejection.block_weights(x, q, p)
    tau = rejection.last_passing(eta, h)
    return tau, float(big_p[tau])


@pytest.mark.parametrize("bonus", [True, False])
def test_two_symbol_stream_law_is_exact(bonus):
    want = np.array(
        [[[P_AB[a] * P_AB[b] * P_AB[c] for c in (0, 1)] for b in (0, 1)] for a in (0, 1)]
    )
    np.testing.assert_allclose(stream_law(correct_rule, bonus), want, atol=1e-12)


# -- where block verification equals token-wise ----------------------------------------


def random_rows(rng, v, k, sparse_top=None):
    """k draft rows q and k + 1 target rows p over v tokens (dense float64)."""
    q = rng.random((k, v)) ** 3
    p = rng.random((k + 1, v)) ** 3
    if sparse_top:  # zero out all but each row's top entries, so supports differ
        for a in (q, p):
            cut = np.sort(a, axis=1)[:, -sparse_top][:, None]
            a[a < cut] = 0.0
    return q / q.sum(1, keepdims=True), p / p.sum(1, keepdims=True)


_SPARSE: dict[bytes, Dists] = {}
_CDF: dict[bytes, np.ndarray] = {}


def choose(rng, row):
    """`rng.choice(len(row), p=row)`, the same draw from the same single uniform (numpy's
    inverse CDF: cumsum, normalized, searchsorted right), without its per-call checks
    (about 10x faster): the statistical tests below draw hundreds of thousands of tokens,
    and keep the random streams, hence the counts, they had with `rng.choice`."""
    row = np.asarray(row, dtype=np.float64)
    key = row.tobytes()
    cdf = _CDF.get(key)
    if cdf is None:
        cdf = _CDF[key] = np.cumsum(row) / np.cumsum(row)[-1]
    return int(cdf.searchsorted(rng.random(), side="right"))


def to_sparse(rows):
    """Dense (n, v) rows as a sparse `Dists`, supports sorted by probability (memoized:
    the statistical tests convert the same few rows over and over; a `Dists` is read,
    never written, by the rules)."""
    rows = np.asarray(rows, dtype=np.float64)
    key = rows.tobytes() + bytes(str(rows.shape), "ascii")
    if key not in _SPARSE:
        _SPARSE[key] = _to_sparse(rows)
    return _SPARSE[key]


def _to_sparse(rows):
    m = int((rows > 0).sum(1).max())
    ids = np.full((rows.shape[0], m), -1, dtype=np.int64)
    probs = np.zeros((rows.shape[0], m))
    for i, r in enumerate(rows):
        nz = np.flatnonzero(r > 0)
        nz = nz[np.lexsort((nz, -r[nz]))]
        ids[i, : nz.size], probs[i, : nz.size] = nz, r[nz]
    return Dists(ids, probs, rows.shape[1])


@pytest.mark.parametrize("sparse", [False, True])
def test_k1_equals_token_wise_for_every_seed(sparse):
    rng = np.random.default_rng(7)
    for trial in range(300):
        q, p = random_rows(rng, 6, 1, sparse_top=3 if sparse else None)
        x = np.array([int(rng.choice(6, p=q[0]))])
        qr, pr = (to_sparse(q), to_sparse(p)) if sparse else (q, p)
        token = verify(x, qr, pr, np.random.default_rng(trial))
        block = rejection.verify_block(x, qr, pr, np.random.default_rng(trial))
        assert block == token


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("sparse", [False, True])
def test_a_rounds_stages_draw_what_the_rule_draws_for_every_seed(k, sparse):
    """`stages.verify_block`, what a round runs, is `rejection.verify_block`, what the
    law tests here prove exact, seed by seed: the wiring of the rule into the round (the
    residual scaled by P_tau, the rule used from K = 2 on) is tested exactly, not only by
    the round's chi-square, which missed a residual scaled by P_0."""
    from specgen.engine import Block
    from specgen.stages import Verified, verify_block

    rng = np.random.default_rng(11)
    for trial in range(300):
        q, p = random_rows(rng, 6, k, sparse_top=3 if sparse else None)
        x = np.array([choose(rng, row) for row in q], dtype=np.int64)
        qr, pr = (to_sparse(q), to_sparse(p)) if sparse else (q, p)
        v = Verified(pr, None, np.zeros((k + 1, 6), dtype=np.float32))
        got = verify_block(Block(x, qr), v, np.random.default_rng(trial), "block")
        assert (got.n, got.x_next) == rejection.verify_block(
            x, qr, pr, np.random.default_rng(trial)
        )
        assert got.h.size == k  # block verification ran (it records h_1..h_K)


def test_one_hot_p_and_q_equal_token_wise_for_every_uniform():
    """Greedy rows: h_i is 1 up to the first mismatch, 0 after; the correction is the
    target's argmax, as in token-wise."""
    rng = np.random.default_rng(8)
    v, k = 5, 4
    for _ in range(200):
        x = rng.integers(0, v, k)
        argmax = np.where(rng.random(k + 1) < 0.7, np.append(x, 0), rng.integers(0, v, k + 1))
        q, p = Dists.one_hot(x, v), Dists.one_hot(argmax, v)
        n = rejection.accept_greedy(x, argmax)
        for u in rng.random((5, k)):
            assert rejection.block_accept(x, q, p, u) == n == rejection.accept(x, q, p, u)
        big_p = rejection.cumulative_ratios(x, q, p)
        assert rejection.block_correct(n, float(big_p[n]), q, p, rng) == int(argmax[n])


def test_a_zero_cumulative_ratio_stays_zero_past_an_overflowed_ratio():
    """P_1 = 0 (p_1(x_1) = 0), then q_2(x_2) = 1e-320 so p_2/q_2 overflows to inf: 0 * inf
    is NaN, which min(1, NaN) took for 1, so the block could pass a position that must
    reject."""
    x = np.array([0, 1])
    q = Dists(None, np.array([[0.5, 0.5], [1 - 1e-320, 1e-320]]), 2)
    p = Dists(None, np.array([[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]), 2)
    with np.errstate(over="ignore", divide="ignore"):
        assert rejection.cumulative_ratios(x, q, p).tolist() == [1.0, 0.0, 0.0]


def test_one_hot_q_equals_token_wise_in_law():
    """Prompt-lookup rows: P(tau >= i | x) = 1 - prod_{j >= i} (1 - h_j) is token-wise's
    P(n >= i) = p_1(x_1)...p_i(x_i), and the correction is the same residual."""
    rng = np.random.default_rng(9)
    v, k = 6, 4
    for _ in range(100):
        _, p = random_rows(rng, v, k, sparse_top=4)
        x = np.array([int(rng.choice(v, p=p[i])) if rng.random() < 0.8 else 0 for i in range(k)])
        q = Dists.one_hot(x, v)
        big_p, h = rejection.block_weights(x, q, p)
        at_least = [1 - np.prod(1 - h[i - 1 :]) for i in range(1, k + 1)]
        np.testing.assert_allclose(at_least, np.cumprod(p[np.arange(k), x]), atol=1e-12)
        for tau in range(k):
            if p[tau, x[tau]] == 1.0 or big_p[tau] == 0.0:
                continue  # no rejection possible there, or tau = this has probability 0
            ids, got = rejection.block_residual_row(tau, float(big_p[tau]), q, p)
            want = rejection.residual(p[tau], q.to_dense()[tau])
            np.testing.assert_allclose(dense(ids, got, v), want, atol=1e-12)


def test_tau_zero_residual_is_token_wise():
    rng = np.random.default_rng(10)
    q, p = random_rows(rng, 6, 3, sparse_top=3)
    ids, got = rejection.block_residual_row(0, 1.0, to_sparse(q), to_sparse(p))
    _, want = rejection.residual_row(to_sparse(q), to_sparse(p), 0)
    np.testing.assert_allclose(got, want)


def enumerate_paths(q, p, k):
    """Every draft prefix x^i (i <= k) of fixed per-position rows, with q(x^i)."""
    v = q.shape[1]
    for i in range(k + 1):
        for x in itertools.product(range(v), repeat=i):
            yield np.array(x, dtype=np.int64), float(np.prod(q[np.arange(i), list(x)]))


@pytest.mark.parametrize("seed", [13, 14, 15])
def test_lemma_tau_at_least_i_has_probability_p_i(seed):
    """The proof's step (1), exactly: averaged over the rest of the block (drawn from q)
    and the uniforms, P(tau >= i | x^i) = P_i(x^i); so E[tau] = sum of q(x^i) P_i and it
    beats token-wise's sum of q(x^i) prod_{j <= i} min(1, p_j / q_j) (Theorem 2)."""
    v, k = 3, 3
    q, p = random_rows(np.random.default_rng(seed), v, k, sparse_top=2 if seed == 15 else None)
    e_block = e_token = 0.0
    for x, qx in enumerate_paths(q, p, k):
        i = x.size
        if i == 0 or qx == 0.0:
            continue
        rest = 0.0
        for tail, q_tail in enumerate_paths(q[i:], p[i:], k - i):
            if tail.size != k - i or q_tail == 0.0:
                continue
            full = np.concatenate([x, tail])
            _, h = rejection.block_weights(full, q, p)
            rest += q_tail * (1 - np.prod(1 - h[i - 1 :]))
        big_p = rejection.cumulative_ratios(x, q, p)
        assert rest == pytest.approx(big_p[i], abs=1e-12)
        e_block += qx * big_p[i]
        e_token += qx * np.prod(np.minimum(1, p[np.arange(i), x] / q[np.arange(i), x]))
    assert e_block > e_token


# -- statistical: the joint law of the first tokens of the whole process ---------------

V = 4


def bigram(seed, power, zero=()):
    """(V, V) rows: the law after last token a; `zero` lists (a, token) set to 0."""
    t = np.random.default_rng(seed).random((V, V)) ** power + 0.05
    for a, b in zero:
        t[a, b] = 0.0
    return t / t.sum(1, keepdims=True)


TARGET = bigram(1, 2, zero=[(0, 3), (1, 0), (2, 2)])
DRAFT = bigram(2, 3, zero=[(0, 1), (3, 2)])  # q has tokens p lacks and lacks some of p's
DISJOINT = np.roll(np.eye(V), 3, axis=1) * 0.7 + 0.3 * np.roll(np.eye(V), 1, axis=1)


def lookup_token(a):
    """A deterministic proposal after token a (a prompt-lookup stand-in)."""
    return (a + 1) % V


# each case: (draft kind per position, draft table, bonus row scored)
CASES = {
    "k1": (("model",), DRAFT, True),
    "k2": (("model", "model"), DRAFT, True),
    "k3_no_bonus": (("model", "model", "model"), DRAFT, False),
    "mixed_lookup_then_model": (("lookup", "lookup", "model"), DRAFT, True),
    "mixed_model_then_lookup": (("model", "lookup", "model"), DRAFT, True),
    "tau_zero_often": (("model", "model"), DISJOINT, True),
}


def one_round(kinds, draft, bonus, last, rng, verifier):
    x, q_rows, p_rows = [], [], []
    a = last
    for kind in kinds:
        row = np.eye(V)[lookup_token(a)] if kind == "lookup" else draft[a]
        tok = choose(rng, row)
        x.append(tok), q_rows.append(row), p_rows.append(TARGET[a])
        a = tok
    if bonus:
        p_rows.append(TARGET[a])
    x_ = np.array(x, dtype=np.int64)
    tau, nxt = verifier(x_, to_sparse(q_rows), to_sparse(p_rows), rng)
    return x[:tau] + ([] if nxt is None else [nxt])


# 3,000 rounds per case (was 6,000): the first-passing planted bug fails every case of
# more than one proposal at it (p 2e-12 to 5e-209, measured with these seeds 2026-12-03);
# the subtler planted bugs are shown failing on the power case below
def sample_law(case, verifier, n=3000, seed=0, length=3):
    kinds, draft, bonus = CASES[case]
    rng = np.random.default_rng(seed)
    counts = np.zeros((V,) * length)
    for _ in range(n):
        text = [0]
        while len(text) <= length:
            text += one_round(kinds, draft, bonus, text[-1], rng, verifier)
        counts[tuple(text[1 : length + 1])] += 1
    return counts


def exact_law(length=3):
    law = np.zeros((V,) * length)
    for s in itertools.product(range(V), repeat=length):
        prev, pr = 0, 1.0
        for t in s:
            pr, prev = pr * TARGET[prev, t], t
        law[s] = pr
    return law


def chi2_pvalue(counts, law):
    mask = law > 0
    assert counts[~mask].sum() == 0, "text the target gives probability 0"
    return stats.chisquare(counts[mask], counts.sum() * law[mask]).pvalue


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_joint_law_of_the_first_three_tokens(case):
    counts = sample_law(case, rejection.verify_block, seed=sorted(CASES).index(case))
    assert chi2_pvalue(counts, exact_law()) > ALPHA


def test_the_tau_zero_case_exercises_tau_zero():
    taus = []

    def counting(x, q, p, rng):
        tau, nxt = rejection.verify_block(x, q, p, rng)
        taus.append(tau)
        return tau, nxt

    sample_law("tau_zero_often", counting, n=300)
    assert taus.count(0) > len(taus) / 4


# -- broken variants: exact and statistical ----------------------------------------------


def power_rows():
    """Position-dependent rows over 3 tokens, K = 3 with the bonus row: the target's law
    at position t is p_t whatever came before (q likewise), chosen (seeded) so that each
    broken variant below moves the law well away from the target's."""
    r = np.random.default_rng(3)
    q, p = r.random((3, 3)) ** 2, r.random((4, 3)) ** 2
    return q / q.sum(1, keepdims=True), p / p.sum(1, keepdims=True)


def round_law(q, p, variant="correct"):
    """Exact law of the text's first K + 1 tokens after one round then the target, from
    h: P(tau = i | x) = h_i prod_{j > i} (1 - h_j) (h_0 = 1); "first" uses
    h_i prod_{j < i} (1 - h_j), "unscaled" the residual with P_tau = 1."""
    k, v = q.shape
    law = np.zeros((v,) * (k + 1))
    for x in itertools.product(range(v), repeat=k):
        x = np.array(x)
        qx = np.prod(q[np.arange(k), x])
        big_p, h = rejection.block_weights(x, q, p)
        hh = np.concatenate([[1.0], h])
        for tau in range(k + 1):
            if variant == "first":
                pt = hh[tau] * np.prod(1 - hh[1:tau]) if tau else np.prod(1 - h)
            else:
                pt = hh[tau] * np.prod(1 - hh[tau + 1 :])
            if tau < k:
                scale = 1.0 if variant == "unscaled" else float(big_p[tau])
                y = dense(*rejection.block_residual_row(tau, scale, q, p), v)
            else:
                y = p[k]
            for s in itertools.product(range(v), repeat=k + 1):
                if tuple(s[:tau]) == tuple(x[:tau]):
                    rest = np.prod([p[t, s[t]] for t in range(tau + 1, k + 1)])
                    law[s] += qx * pt * y[s[tau]] * rest
    return law


def product_law(p):
    return np.prod(np.meshgrid(*p, indexing="ij"), axis=0)


def test_round_law_is_the_target_exactly():
    for seed in (3, 4, 5):
        r = np.random.default_rng(seed)
        q, p = r.random((3, 3)) ** 2, r.random((4, 3)) ** 2
        q, p = q / q.sum(1, keepdims=True), p / p.sum(1, keepdims=True)
        np.testing.assert_allclose(round_law(q, p), product_law(p), atol=1e-12)


@pytest.mark.parametrize("variant", ["unscaled", "first"])
def test_broken_round_laws_differ_exactly(variant):
    q, p = power_rows()
    assert np.abs(round_law(q, p, variant) - product_law(p)).max() > 0.005


def sample_power_case(verifier, n=16000, seed=0):  # twice the planted bugs' 8,000 (was 24,000)
    q, p = power_rows()
    rng = np.random.default_rng(seed)
    k, v = q.shape
    qs, ps = to_sparse(q), to_sparse(p)
    counts = np.zeros((v,) * (k + 1))
    for _ in range(n):
        x = np.array([choose(rng, q[i]) for i in range(k)])
        tau, nxt = verifier(x, qs, ps, rng)
        text = list(x[:tau]) + [nxt]
        text += [choose(rng, p[t]) for t in range(len(text), k + 1)]
        counts[tuple(text)] += 1
    return counts, product_law(p)


def unscaled_residual(x, q, p, rng):
    """Broken: the residual norm(max(p - q, 0)), P_tau dropped."""
    eta = rng.random(x.shape[0])
    tau = rejection.last_passing(eta, rejection.block_weights(x, q, p)[1])
    return tau, rejection.block_correct(tau, 1.0, q, p, rng)


def first_passing(x, q, p, rng):
    """Broken: tau = the first i with eta_i < h_i instead of the last."""
    eta = rng.random(x.shape[0])
    big_p, h = rejection.block_weights(x, q, p)
    passed = np.flatnonzero(eta < h)
    tau = int(passed[0]) + 1 if passed.size else 0
    return tau, rejection.block_correct(tau, float(big_p[tau]), q, p, rng)


def one_uniform(x, q, p, rng):
    """Broken: one uniform reused for every position."""
    eta = np.full(x.shape[0], rng.random())
    big_p, h = rejection.block_weights(x, q, p)
    tau = rejection.last_passing(eta, h)
    return tau, rejection.block_correct(tau, float(big_p[tau]), q, p, rng)


def test_power_case_passes_with_the_correct_rule():
    counts, law = sample_power_case(rejection.verify_block, seed=1)
    assert chi2_pvalue(counts, law) > ALPHA


@pytest.mark.parametrize("broken", [unscaled_residual, first_passing, one_uniform])
def test_broken_variants_are_detected(broken):
    """The statistical test has power: each broken rule fails it on the same case with a
    half of its sample (8,000 rounds; the expected chi-square excess is about 63 x 4 for
    the subtlest, the unscaled residual, against a 1e-4 critical value near 135; measured
    with this seed: p = 9e-29 for it, 3e-28 for one uniform, 0 for the first passing)."""
    counts, law = sample_power_case(broken, n=8000, seed=2)
    assert chi2_pvalue(counts, law) < ALPHA
