"""The acceptance rule: exact where it is deterministic, statistical where it is random.

Statistical tests use a fixed seed and a chi-square goodness-of-fit test against the
exact target distribution, failing when the p-value is below 1e-4 (for a correct rule a
spurious failure has probability 1e-4 per test; the seed makes each run identical).
"""

from __future__ import annotations

import numpy as np
import pytest
import reference
from reference import probs
from scipy import stats

from specgen import rejection
from specgen.sampling import SamplingParams

ALPHA = 1e-4


def normalize(w):
    w = np.asarray(w, dtype=np.float64)
    return w / w.sum()


def test_accept_exact_thresholds():
    x = np.array([0, 1, 2])
    q = np.array([[0.5, 0.5, 0, 0], [0, 0.5, 0.5, 0], [0, 0, 1.0, 0]])
    p = np.array([[0.25, 0.75, 0, 0], [0, 1.0, 0, 0], [0.5, 0, 0.5, 0], [1, 0, 0, 0]])
    # x1: p/q = 0.5 -> accepted iff u < 0.5
    assert rejection.accept(x, q, p, np.array([0.49, 0, 0])) == 3
    assert rejection.accept(x, q, p, np.array([0.5, 0, 0])) == 0
    # x2: p/q = 2 -> always accepted; x3: p/q = 0.5
    assert rejection.accept(x, q, p, np.array([0.0, 0.999, 0.6])) == 2
    assert rejection.accept(x, q, p, np.array([0.0, 0.999, 0.4])) == 3


def test_block_verifications_test_is_strict_at_its_threshold():
    # eta in [0, 1) passes with probability h exactly: an h of 0 never passes, even at 0
    h = np.array([0.5, 0.0, 0.25])
    assert rejection.last_passing(np.array([0.0, 0.0, 0.25]), h) == 1
    assert rejection.last_passing(np.array([0.5, 0.0, 0.2499]), h) == 3
    assert rejection.last_passing(np.zeros(3), np.zeros(3)) == 0


def test_accept_p_zero_always_rejects_and_p_equal_q_always_accepts():
    q = np.array([[0.2, 0.8]])
    assert rejection.accept(np.array([0]), q, np.array([[0.0, 1.0]]), np.array([0.0])) == 0
    assert rejection.accept(np.array([1]), q, q, np.array([0.999999])) == 1


def test_residual_exact():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.6, 0.2, 0.1])
    np.testing.assert_allclose(rejection.residual(p, q), [1.0, 0, 0, 0])
    p = np.array([0.4, 0.4, 0.2])
    q = np.array([0.2, 0.2, 0.6])
    np.testing.assert_allclose(rejection.residual(p, q), [0.5, 0.5, 0.0])
    # p == q: the branch has probability zero; the limit is p itself
    np.testing.assert_allclose(rejection.residual(p, p), p)


def test_accept_greedy():
    assert rejection.accept_greedy(np.array([3, 1, 2]), np.array([3, 1, 2, 0])) == 3
    assert rejection.accept_greedy(np.array([3, 1, 2]), np.array([3, 0, 2, 0])) == 1
    assert rejection.accept_greedy(np.array([], dtype=np.int64), np.array([5])) == 0


def one_step_law(p, q):
    """Exact law of the first emitted token: sum over drafted x of q(x) * (accept + reject)."""
    r = rejection.residual(p, q)
    law = np.zeros_like(p)
    for x in range(len(p)):
        if q[x] == 0:
            continue
        a = min(1.0, p[x] / q[x])
        law[x] += q[x] * a
        law += q[x] * (1 - a) * r
    return law


CASES = {
    "p_equals_q": (normalize([1, 2, 3, 4]), normalize([1, 2, 3, 4])),
    "disjoint_supports": (normalize([1, 1, 0, 0, 0]), normalize([0, 0, 1, 2, 3])),
    "one_hot_q": (normalize([3, 1, 2, 1, 1, 2]), np.eye(6)[2]),
    "q_zero_where_p_positive": (normalize([1, 1, 1, 1, 1, 1, 1]), normalize([0, 0, 5, 1, 1, 0, 0])),
    "random_10": (
        normalize(np.random.default_rng(3).random(10) ** 3),
        normalize(np.random.default_rng(4).random(10) ** 3),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_step_law_is_p_exactly(name):
    p, q = CASES[name]
    np.testing.assert_allclose(one_step_law(p, q), p, atol=1e-12)


def sample_first_token(p, q, n, seed):
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(p))
    for _ in range(n):
        x = np.array([int(rng.choice(len(q), p=q))])
        k, tok = reference.verify(x, q[None, :], np.stack([p, p]), rng)
        counts[x[0] if k == 1 else tok] += 1
    return counts


def chi2_pvalue(counts, expected_p):
    mask = expected_p > 0
    assert counts[~mask].sum() == 0, "a token with p = 0 was emitted"
    return stats.chisquare(counts[mask], counts.sum() * expected_p[mask]).pvalue


@pytest.mark.parametrize("name", sorted(CASES))
def test_verify_samples_follow_p(name):
    p, q = CASES[name]
    counts = sample_first_token(p, q, 6000, seed=sorted(CASES).index(name))
    assert chi2_pvalue(counts, p) > ALPHA


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temp=0.7, top_k=3, top_p=1.0, min_p=0.0),
        SamplingParams(temp=1.3, top_k=0, top_p=0.8, min_p=0.0),
        SamplingParams(temp=1.0, top_k=5, top_p=0.9, min_p=0.1),
    ],
)
def test_verify_with_warpers_follows_warped_p(params):
    rng = np.random.default_rng(11)
    p = probs(rng.standard_normal(8) * 2, params)
    q = probs(rng.standard_normal(8) * 2, params)
    counts = sample_first_token(p, q, 6000, seed=5)
    assert chi2_pvalue(counts, p) > ALPHA


def test_block_of_two_joint_law():
    """Two drafted positions: the joint law of the first two emitted tokens is p1 x p2."""
    rng = np.random.default_rng(21)
    v = 4
    p1 = normalize(rng.random(v))
    q1 = normalize(rng.random(v) ** 4)
    p2 = {a: normalize(rng.random(v)) for a in range(v)}  # p2 depends on the first token
    q2 = {a: normalize(rng.random(v) ** 4) for a in range(v)}
    p3 = normalize(np.ones(v))
    counts = np.zeros((v, v))
    n = 8000
    for _ in range(n):
        x1 = int(rng.choice(v, p=q1))
        x2 = int(rng.choice(v, p=q2[x1]))
        q = np.stack([q1, q2[x1]])
        p = np.stack([p1, p2[x1], p3])
        k, tok = reference.verify(np.array([x1, x2]), q, p, rng)
        if k == 0:
            first = tok
            second = int(rng.choice(v, p=p2[first]))  # next round: ordinary draw
        else:
            first, second = x1, (x2 if k == 2 else tok)
        counts[first, second] += 1
    expected = np.array([[p1[a] * p2[a][b] for b in range(v)] for a in range(v)])
    assert chi2_pvalue(counts.ravel(), expected.ravel()) > ALPHA


def test_a_broken_residual_is_detected():
    """The test above has power: residual = p (not renormalized max(0, p - q)) fails."""
    p, q = CASES["random_10"]
    rng = np.random.default_rng(0)
    counts = np.zeros(len(p))
    for _ in range(6000):
        x = int(rng.choice(len(q), p=q))
        u = rng.random()
        tok = x if u * q[x] < p[x] else int(rng.choice(len(p), p=p))
        counts[tok] += 1
    assert chi2_pvalue(counts, p) < ALPHA
