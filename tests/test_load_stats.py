"""The load client's pure figures (`specgen.bench.loadstats`): exact against closed forms, and
the seeded arrival schedule statistically (fixed seed, stated bounds, each check shown to fail
on a planted bug)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from specgen.bench.loadstats import (
    LoadLevel,
    RequestRecord,
    Slo,
    SpecStats,
    arrival_offsets,
    dist_ms,
    e2el_s,
    itls_s,
    max_in_flight,
    paired_ratio,
    parse_int_list,
    parse_rate_list,
    parse_slo,
    prompt_order,
    summarize_level,
    tpot_s,
    ttft_s,
)
from specgen.errors import ConfigError


def rec(
    index: int,
    start: float,
    chunks: tuple[float, ...],
    end: float,
    tokens: int,
    failure: str | None = None,
    spec: SpecStats | None = None,
) -> RequestRecord:
    return RequestRecord(index, f"p{index}", "k", start, chunks, end, tokens, True, spec, failure)


def test_per_request_figures_equal_their_closed_forms() -> None:
    r = rec(0, 10.0, (10.1, 10.13, 10.16, 10.19), 10.2, 8)
    assert ttft_s(r) == pytest.approx(0.1, abs=1e-12)
    assert e2el_s(r) == pytest.approx(0.2, abs=1e-12)
    assert tpot_s(r) == pytest.approx((0.2 - 0.1) / 7, abs=1e-12)  # vLLM: (E2EL-TTFT)/(n-1)
    assert itls_s(r) == pytest.approx([0.03, 0.03, 0.03], abs=1e-12)
    one = rec(1, 0.0, (0.5,), 0.6, 1)
    assert tpot_s(one) is None and itls_s(one) == []
    assert ttft_s(rec(2, 0.0, (), 1.0, 0, failure="http 500")) is None


def test_percentiles_are_numpys_linear_interpolation() -> None:
    d = dist_ms([0.1, 0.2, 0.3, 0.4])
    # linear: p = 100 + (q/100) * 3 * 100 ms
    assert (d.n, d.mean) == (4, pytest.approx(250.0))
    assert d.p50 == pytest.approx(250.0)
    assert d.p90 == pytest.approx(370.0)
    assert d.p95 == pytest.approx(385.0)
    assert d.p99 == pytest.approx(397.0)
    assert dist_ms([]).p50 is None


def test_a_level_summary_equals_its_closed_form() -> None:
    spec = SpecStats(10, 6, "speculative")
    records = [
        rec(0, 0.0, (0.1, 0.2, 0.3), 0.3, 6, spec=spec),  # TTFT 100, TPOT 40, ITL 100, 100
        rec(1, 0.0, (0.2, 0.3), 0.4, 4, spec=spec),  # TTFT 200, TPOT 66.7, ITL 100
        rec(2, 0.1, (), 0.5, 0, failure="timeout"),
        rec(3, 0.1, (0.2,), 0.2, 0, failure="http 500"),
        rec(4, 0.2, (), 0.3, 0, failure="timeout"),
    ]
    s = summarize_level(records, duration_s=2.0, slo=Slo(ttft_ms=150, tpot_ms=50))
    assert (s.n_requests, s.n_completed, s.n_failed) == (5, 2, 3)
    assert s.failures == (("timeout", 2), ("http 500", 1))
    assert s.request_throughput == pytest.approx(1.0)
    assert s.output_throughput == pytest.approx(5.0)
    assert s.tokens_per_chunk == pytest.approx(10 / 5)
    assert s.ttft.p50 == pytest.approx(150.0)
    assert s.tpot.mean == pytest.approx((40.0 + 200 / 3) / 2)
    assert s.itl.n == 3 and s.itl.p99 == pytest.approx(100.0)
    assert s.e2el.p50 == pytest.approx(350.0)
    assert (s.num_draft_tokens, s.num_accepted_draft_tokens) == (20, 12)
    assert s.acceptance_rate == pytest.approx(0.6)
    assert s.slo_met == 1 and s.slo_goodput == pytest.approx(0.5)  # only request 0 meets both
    assert s.max_in_flight == 4


def test_max_in_flight_counts_an_end_before_a_start_at_the_same_instant() -> None:
    assert max_in_flight([rec(0, 0, (), 1, 0), rec(1, 1, (), 2, 0)]) == 1
    assert max_in_flight([rec(0, 0, (), 2, 0), rec(1, 1, (), 3, 0), rec(2, 1.5, (), 4, 0)]) == 3


def test_slo_bounds() -> None:
    fast = rec(0, 0.0, (0.1,), 0.5, 5)  # TTFT 100 ms, TPOT 100 ms, E2EL 500 ms
    assert Slo(ttft_ms=100).met_by(fast)
    assert not Slo(ttft_ms=99).met_by(fast)
    assert Slo(tpot_ms=100, e2el_ms=500).met_by(fast)
    assert not Slo(e2el_ms=499).met_by(fast)
    assert Slo(tpot_ms=1).met_by(rec(1, 0.0, (0.1,), 0.1, 1))  # no TPOT: meets, as vLLM
    assert not Slo().met_by(rec(2, 0, (), 1, 0, failure="timeout"))


def test_option_parsers() -> None:
    assert parse_slo("ttft=500, TPOT=50") == Slo(500.0, 50.0, None)
    assert parse_int_list("--concurrency", "1,2,4,8") == (1, 2, 4, 8)
    assert parse_rate_list("0.5,inf") == (0.5, math.inf)
    for bad in ("ttft", "ttft=0", "ttft=x", "foo=1", "ttft=1,ttft=2"):
        with pytest.raises(ConfigError, match="--slo"):
            parse_slo(bad)
    for bad in ("", "1,1", "0", "a"):
        with pytest.raises(ConfigError, match="--concurrency"):
            parse_int_list("--concurrency", bad)
    for bad in ("0", "-1", "x", "1,1"):
        with pytest.raises(ConfigError, match="--request-rate"):
            parse_rate_list(bad)
    assert LoadLevel(0.0, concurrency=4).name == "4 streams"
    assert LoadLevel(0.0, concurrency=1).name == "1 stream"
    assert LoadLevel(0.0, request_rate=math.inf, max_concurrency=2).name == "inf req/s, ≤2 streams"


def test_paired_ratio_is_the_median_of_per_request_ratios() -> None:
    base = [rec(i, 0.0, (0.1,), 1.0, 10) for i in range(5)]  # 10 tok/s each
    other = [rec(i, 0.0, (0.05,), 1.0 / f, 10) for i, f in enumerate((1, 2, 3, 4, 5))]
    other.append(rec(9, 0.0, (), 1.0, 0, failure="timeout"))  # unpaired: not counted
    r = paired_ratio(base, summarize_level(base, 1.0), other, summarize_level(other, 0.5))
    assert r.n_pairs == 5
    assert r.speed == pytest.approx(3.0)
    lo, hi = r.speed_ci95
    assert lo is not None and hi is not None and 1.0 <= lo <= 3.0 <= hi <= 5.0
    assert r.throughput == pytest.approx((50 / 0.5) / (50 / 1.0))
    assert r.ttft_p50 == pytest.approx(0.5)


# -- the schedule (statistical: fixed seeds, stated bounds) -------------------------------------

N = 20_000


def _rate_and_cv_match(offsets: np.ndarray, rate: float, burstiness: float) -> bool:
    """Mean gap within 5 standard errors of 1/rate (SE = 1/(rate sqrt(b N))), and the gaps'
    coefficient of variation within 10% of 1/sqrt(b) (its SE is under 1.5% at N = 20,000)."""
    gaps = np.diff(offsets)
    se = 1 / (rate * math.sqrt(burstiness * len(gaps)))
    cv = gaps.std() / gaps.mean()
    return abs(gaps.mean() - 1 / rate) < 5 * se and abs(cv * math.sqrt(burstiness) - 1) < 0.10


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 2.0])
def test_arrivals_have_the_stated_rate_and_burstiness(burstiness: float) -> None:
    off = arrival_offsets(N, 4.0, burstiness, np.random.default_rng(7))
    assert off.shape == (N,) and off[0] == 0.0 and np.all(np.diff(off) >= 0)
    assert _rate_and_cv_match(off, 4.0, burstiness)


def test_the_rate_check_fails_for_planted_schedules() -> None:
    rng = np.random.default_rng(7)
    # scale 1/rate without the burstiness factor: the mean gap is b/rate
    wrong_scale = np.concatenate([[0], np.cumsum(rng.gamma(0.5, 1 / 4.0, N - 1))])
    assert not _rate_and_cv_match(wrong_scale, 4.0, 0.5)
    # the right mean but evenly spaced (burstiness ignored)
    assert not _rate_and_cv_match(np.arange(N) / 4.0, 4.0, 1.0)


def test_poisson_gaps_are_exponential_and_the_test_can_tell() -> None:
    gaps = np.diff(arrival_offsets(N, 2.0, 1.0, np.random.default_rng(3)))
    assert sps.kstest(gaps, "expon", args=(0, 0.5)).pvalue > 1e-3
    uniform = np.random.default_rng(3).uniform(0, 1.0, N)  # mean 0.5 too, not exponential
    assert sps.kstest(uniform, "expon", args=(0, 0.5)).pvalue < 1e-3


def test_arrivals_and_prompt_order_reproduce_with_the_seed() -> None:
    a = arrival_offsets(100, 3.0, 1.0, np.random.default_rng(5))
    b = arrival_offsets(100, 3.0, 1.0, np.random.default_rng(5))
    c = arrival_offsets(100, 3.0, 1.0, np.random.default_rng(6))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(arrival_offsets(3, math.inf, 1.0, np.random.default_rng(0)), np.zeros(3))
    order = prompt_order(8, 20, np.random.default_rng(1))
    assert order == prompt_order(8, 20, np.random.default_rng(1))
    counts = np.bincount(order, minlength=8)
    assert counts.max() - counts.min() <= 1 and sorted(order[:8]) == list(range(8))
