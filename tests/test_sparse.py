"""Sparse rows against a deliberately simple dense reference: the vectorized warpers give
the same probabilities (<= 1e-12) for every warper combination on random and adversarial
logits, a batch gives each row exactly what a batch of one gives it, and acceptance and
the residual on sparse supports equal their dense forms. Seeded; exact where pure."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specgen import rejection, sampling
from specgen.sampling import Dists, SamplingParams, draw, warp, warp_rows


def reference(z, temp, top_k, top_p, min_p):
    """The rule of `specgen.sampling`, one token at a time over the whole vocabulary."""
    z = np.asarray(z, dtype=np.float64)
    v = z.size
    out = np.zeros(v)
    if temp <= 0.0:
        out[int(np.argmax(z))] = 1.0
        return out
    order = [int(i) for i in np.lexsort((np.arange(v), -z))]  # logit desc, then id
    keep = order[:top_k] if 0 < top_k < v else order
    if top_p < 1.0:
        w = {i: float(np.exp(z[i] - z[keep[0]])) for i in keep}
        total = 0.0
        for i in sorted(keep):  # W: ascending id order
            total += w[i]
        c, m = 0.0, len(keep)
        for j, i in enumerate(keep):
            c += w[i]
            if c / total >= top_p:
                m = j + 1
                break
        keep = keep[:m]
    if min_p > 0.0:
        keep = [i for i in keep if z[i] >= z[keep[0]] + np.log(min_p)]
    e = np.array([np.exp((z[i] - z[keep[0]]) / temp) for i in keep])
    out[keep] = e / e.sum()
    return out


TEMPS = [0.0, 0.7, 1.5]
TOP_P = [1.0, 0.95, 0.5]
MIN_P = [0.0, 0.05, 0.5, 1.0]


def top_ks(v):
    return [0, 1, 3, 40, v - 1, v, v + 5]


def logits_cases(v, seed):
    """Random and adversarial rows over v tokens (float32, like llama.cpp's)."""
    rng = np.random.default_rng(seed)
    cases = {
        "random": rng.standard_normal(v) * 3,
        "peaked": rng.standard_normal(v) * 12,
        # small integers: ties everywhere, at every top-k boundary
        "ties": rng.integers(-3, 4, size=v).astype(np.float64),
        # one token far above the rest: a single survivor under min-p / top-p
        "single": np.where(np.arange(v) == v // 2, 50.0, rng.standard_normal(v)),
        "flat": np.zeros(v),
    }
    neg = rng.standard_normal(v) * 3
    neg[rng.random(v) < 0.7] = -np.inf  # fewer finite logits than some top-k
    cases["neg_inf"] = neg
    few = np.full(v, -np.inf)
    few[[1, v - 2]] = [2.0, 2.0]  # two finite, tied
    cases["two_finite"] = few
    return {name: z.astype(np.float32) for name, z in cases.items()}


@pytest.fixture(params=["whole-rows", "small-blocks"])
def blocks(request, monkeypatch):
    """Run each case unblocked and with tiny blocks (padding, ragged block counts)."""
    if request.param == "small-blocks":
        monkeypatch.setattr(sampling, "_BLOCK", 4)
        monkeypatch.setattr(sampling, "_MIN_BLOCKS", 3)
    return request.param


@pytest.mark.parametrize("v", [7, 61])
def test_every_combination_matches_the_dense_reference(v, blocks):
    for name, z in logits_cases(v, seed=v).items():
        for temp, top_k, top_p, min_p in itertools.product(TEMPS, top_ks(v), TOP_P, MIN_P):
            params = SamplingParams(temp, top_k, top_p, min_p)
            got = warp_rows(z[None, :], params)
            want = reference(z, temp, top_k, top_p, min_p)
            dense = got.to_dense()[0]
            label = (name, temp, top_k, top_p, min_p)
            np.testing.assert_allclose(dense, want, rtol=0, atol=1e-12, err_msg=str(label))
            ids, p = got.row(0)
            assert (p > 0).all() or got.dense, label  # no zero-mass ids in a sparse support
            assert abs(p.sum() - 1.0) < 1e-12, label
            assert np.array_equal(np.flatnonzero(dense), np.flatnonzero(want)), label


@pytest.mark.parametrize("v", [1000, 262144])
@pytest.mark.parametrize("params", [
    SamplingParams(0.8, 40, 0.95, 0.05),
    SamplingParams(1.0, 40, 1.0, 0.0),
    SamplingParams(1.0, 0, 0.9, 0.0),
    SamplingParams(0.7, 0, 1.0, 0.1),
    SamplingParams(1.0, 0, 1.0, 0.0),
    SamplingParams(1.2, 200, 0.99, 0.0),
])  # fmt: skip
def test_wide_rows_match_the_dense_reference(v, params):
    rng = np.random.default_rng(v)
    z = (rng.standard_normal((3, v)) * 4).astype(np.float32)
    z[1, rng.integers(0, v, size=v // 3)] = -np.inf
    z[2, :50] = z[2].max()  # 50-way tie at the top, across the top-k boundary
    got = warp_rows(z, params).to_dense()
    for i in range(3):
        want = reference(z[i], params.temp, params.top_k, params.top_p, params.min_p)
        np.testing.assert_allclose(got[i], want, rtol=0, atol=1e-12)


def test_top_k_boundary_ties_go_to_the_lowest_ids(blocks):
    z = np.array([1, 3, 2, 2, 2, 0, 2, 3], dtype=np.float32)
    ids, _ = warp(z, SamplingParams(1.0, 4, 1.0, 0.0))
    assert ids.tolist() == [1, 7, 2, 3]  # the 3s, then the lowest-id 2s
    assert warp(np.array([1, 1, 2], dtype=np.float32), SamplingParams(1.0, 2, 1.0, 0.0))[
        0
    ].tolist() == [2, 0]


@pytest.mark.parametrize("top_p,kept", [(0.25, 1), (0.5, 2), (0.5000000000000001, 3), (0.75, 3)])
def test_top_p_landing_exactly_on_a_cumulative_sum(top_p, kept, blocks):
    """Four tied tokens (w = 1 exactly) and nothing else: C_j / W = j / 4 exactly, and a
    prefix whose mass equals top_p is enough (C_j / W >= top_p)."""
    z = np.full(40, -np.inf, dtype=np.float32)
    z[[3, 9, 17, 30]] = 1.5
    for top_k in (0, 4, 10):
        ids, p = warp(z, SamplingParams(1.0, top_k, top_p, 0.0))
        assert ids.tolist() == [3, 9, 17, 30][:kept]
        np.testing.assert_array_equal(p, np.full(kept, 1.0 / kept))


def test_top_p_at_a_computed_cumulative_sum_agrees_with_the_reference():
    rng = np.random.default_rng(5)
    z = (rng.standard_normal(300) * 2).astype(np.float32)
    full = reference(z, 1.0, 40, 1.0, 0.0)
    order = np.lexsort((np.arange(300), -full))[:40]
    w = np.exp(z[order].astype(np.float64) - float(z[order[0]]))
    total = 0.0
    for i in np.argsort(order):
        total += w[i]
    for j in (0, 5, 17, 38):
        top_p = float(np.cumsum(w)[j] / total)  # exactly C_{j+1} / W
        ids, _ = warp(z, SamplingParams(1.0, 40, top_p, 0.0))
        assert ids.tolist() == order[: j + 1].tolist()


def test_a_batch_gives_each_row_what_a_batch_of_one_gives(blocks):
    """The loop warps K+1 rows at once; ordinary decoding, the draft and `verify`'s
    reference warp one: they must agree bit for bit."""
    rng = np.random.default_rng(9)
    z = (rng.standard_normal((9, 500)) * 3).astype(np.float32)
    z[3] = np.round(z[3])  # ties
    z[5, ::2] = -np.inf
    z[6] = -np.inf  # fewer finite logits than top-k, tied, at both ends of the row
    z[6, [1, 498]] = 2.0
    # 30 ids: with small blocks, fewer ids than top-k and a padded last block
    narrow = (rng.standard_normal((3, 30)) * 3).astype(np.float32)
    for rows, params in itertools.product(
        (z, narrow),
        (SamplingParams(), SamplingParams(1.0, 0, 0.9, 0.0), SamplingParams(0.5, 0, 1.0, 0.2),
         SamplingParams(1.0, 0, 1.0, 0.0), SamplingParams(0.0)),
    ):  # fmt: skip
        batch = warp_rows(rows, params)
        for i in range(len(rows)):
            one = warp_rows(rows[i : i + 1], params)
            a_ids, a_p = batch.row(i)
            b_ids, b_p = one.row(0)
            assert np.array_equal(a_ids, b_ids) and np.array_equal(a_p, b_p), (params, i)


# -- rejection on sparse supports ---------------------------------------------------------


def random_pair(rng, k, v, params):
    zp = (rng.standard_normal((k + 1, v)) * 2).astype(np.float32)
    zq = zp[:k] + (rng.standard_normal((k, v)) * 1.5).astype(np.float32)
    p, q = warp_rows(zp, params), warp_rows(zq, params)
    x = np.array([draw(*q.row(i), rng) for i in range(k)], dtype=np.int64)
    return p, q, x


PARAMS = [
    SamplingParams(1.0, 10, 1.0, 0.0),
    SamplingParams(0.8, 40, 0.95, 0.05),
    SamplingParams(1.0, 0, 0.8, 0.0),
    SamplingParams(1.0, 0, 1.0, 0.0),
]


@pytest.mark.parametrize("params", PARAMS)
def test_sparse_acceptance_equals_dense(params):
    rng = np.random.default_rng(1)
    for _ in range(50):
        p, q, x = random_pair(rng, 6, 80, params)
        pd, qd = p.to_dense(), q.to_dense()
        np.testing.assert_array_equal(p[:6].at(x), pd[np.arange(6), x])
        np.testing.assert_array_equal(q.at(x), qd[np.arange(6), x])
        ratio = pd[np.arange(6), x] / qd[np.arange(6), x]
        # uniforms at, just below and just above the acceptance threshold
        for u in (rng.random(6), np.minimum(ratio, 0.999), np.nextafter(np.minimum(ratio, 1), 0)):
            assert rejection.accept(x, q, p, u) == rejection.accept(x, qd, pd, u)


@pytest.mark.parametrize("params", PARAMS)
def test_sparse_residual_equals_dense(params):
    rng = np.random.default_rng(2)
    for _ in range(50):
        p, q, x = random_pair(rng, 4, 80, params)
        pd, qd = p.to_dense(), q.to_dense()
        for i in range(4):
            ids, r = rejection.residual_row(q, p, i)
            got = np.zeros(80)
            got[ids] = r
            want = rejection.residual(pd[i], qd[i])
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
            assert abs(got.sum() - 1.0) < 1e-12


def test_residual_of_a_dense_p_against_a_one_hot_q():
    """Prompt lookup with every truncation off: q is one sparse id, p a whole row."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal((2, 300)).astype(np.float32)
    p = warp_rows(z, SamplingParams(1.0, 0, 1.0, 0.0))
    q = Dists.one_hot(np.array([17]), 300)
    ids, r = rejection.residual_row(q, p, 0)
    want = rejection.residual(p.to_dense()[0], np.eye(300)[17])
    np.testing.assert_allclose(r[np.argsort(ids)], want, rtol=0, atol=1e-15)
    assert r[17] == 0.0


def test_one_step_law_on_sparse_rows_is_p():
    """Exact law of the token emitted at one position, from sparse rows: sum over x of
    q(x) (min(1, p/q) [y = x] + (1 - min(1, p/q)) residual(y)) = p(y)."""
    rng = np.random.default_rng(4)
    for params in PARAMS:
        p, q, _ = random_pair(rng, 1, 60, params)
        ids_q, pq = q.row(0)
        ids_r, r = rejection.residual_row(q, p, 0)
        law = np.zeros(60)
        for x, qx in zip(ids_q.tolist(), pq.tolist(), strict=True):
            a = min(1.0, p[:1].at(np.array([x]))[0] / qx)
            law[x] += qx * a
            law[ids_r] += qx * (1 - a) * r
        np.testing.assert_allclose(law, p.to_dense()[0], rtol=0, atol=1e-12)


def test_dists_helpers():
    a = Dists(np.array([[4, 2, -1]]), np.array([[0.75, 0.25, 0.0]]), 6)
    b = Dists(np.array([[1]]), np.array([[1.0]]), 6)
    both = Dists.concat([a, b], 6)
    assert both.ids.tolist() == [[4, 2, -1], [1, -1, -1]]
    np.testing.assert_array_equal(both.at(np.array([2, 1])), [0.25, 1.0])
    np.testing.assert_array_equal(both.on(0, np.array([0, 2, 4, 5])), [0, 0.25, 0.75, 0])
    assert both.row(1)[0].tolist() == [1]
    assert both.to_dense().tolist() == [[0, 0, 0.25, 0, 0.75, 0], [0, 1, 0, 0, 0, 0]]
    assert len(Dists.concat([], 6)) == 0


def test_two_level_draw_follows_the_distribution():
    """Whole-vocabulary rows are drawn from in two levels: the law is unchanged and a
    zero-probability token is never drawn."""
    rng = np.random.default_rng(0)
    v = 5000
    w = rng.random(v) ** 8
    w[rng.random(v) < 0.5] = 0.0
    w[-1] = 0.0
    p = w / w.sum()
    ids = np.arange(v)
    n = 40000
    counts = np.bincount([draw(ids, p, rng) for _ in range(n)], minlength=v)
    assert counts[p == 0].sum() == 0
    # pool into 20 cells of roughly equal mass; 5-sigma bounds per cell
    edges = np.searchsorted(np.cumsum(p), np.linspace(0, 1, 21)[1:-1])
    obs = np.add.reduceat(counts, np.r_[0, edges])
    exp = np.add.reduceat(p, np.r_[0, edges]) * n
    assert (np.abs(obs - exp) < 5 * np.sqrt(exp) + 1).all()
