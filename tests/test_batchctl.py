"""The batch controller: exact, with fixed costs and acceptance rates."""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest

from specgen.control import costs
from specgen.control.acceptance import Acceptance
from specgen.control.batch import BatchController, SlotState, recent_entry
from specgen.control.costs import DraftFit, Line, LineFit
from specgen.control.goodput import (
    SlotInput,
    _catch_up_share,
    choose,
    expected_gains,
    expected_tokens,
    step_seconds,
)
from specgen.sampling import SamplingParams

# FIELD.md's costs on the 2-core CPU: one row 38 ms, each extra row ~6 ms, a draft token 19 ms
TARGET = Line(0.038, 0.006)
DRAFT_PER_SLOT = Line(0.0, 0.019)  # one draft decode per slot and depth
DRAFT_BATCHED = Line(0.019, 0.002)  # one draft decode per depth across slots


def slot(alpha: float, k_max: int = 3) -> SlotInput:
    return SlotInput((alpha,), k_max)


def test_one_stream_by_hand():
    # K=0: 1/0.044 = 22.7; K=1: 1.8/0.069 = 26.1; K=2: 2.44/0.094 = 26.0; K=3: 2.952/0.119
    got = choose([slot(0.8)], TARGET, DRAFT_PER_SLOT)
    assert got.k == (1,)
    assert got.expected_tokens == pytest.approx(1.8)
    assert got.step_s == pytest.approx(0.069)
    assert got.goodput == pytest.approx(1.8 / 0.069)
    assert got.goodput_ordinary == pytest.approx(1 / 0.044)


def test_four_streams_drafting_per_slot_do_not_speculate_but_batched_drafting_does():
    slots = [slot(0.9)] * 4
    # all K=0: 4/0.062 = 64.5; all K=1: 7.6/0.162 = 46.9; one K=1: 4.9/0.087 = 56.3
    assert choose(slots, TARGET, DRAFT_PER_SLOT).k == (0, 0, 0, 0)
    # one draft decode per depth: all K=1 cost 0.038 + 8 * 0.006 + 0.019 + 4 * 0.002 = 0.113
    # (67.3 tokens/s); all K=2: 10.84 / 0.164 = 66.1
    got = choose(slots, TARGET, DRAFT_BATCHED)
    assert got.k == (1, 1, 1, 1)
    assert got.goodput == pytest.approx(7.6 / 0.113)
    assert got.goodput_ordinary == pytest.approx(4 / 0.062)


def test_no_acceptance_means_no_speculation_and_k_max_zero_is_respected():
    assert choose([slot(0.0), slot(0.0)], TARGET, DRAFT_BATCHED).k == (0, 0)
    assert choose([slot(1.0, 0), slot(1.0, 5)], TARGET, DRAFT_BATCHED).k[0] == 0


def test_certain_acceptance_with_a_cheap_draft_takes_the_largest_k():
    # alpha = 1: G(K) = (K + 1) / (a + b + (b + c) K) rises with K while a > c
    got = choose([slot(1.0, 7)], Line(0.040, 0.001), Line(0.0, 0.002))
    assert got.k == (7,)


def brute_force(slots, target, draft, fixed_s=0.0, spec_s=0.0):
    best, best_g = None, -1.0
    for ks in itertools.product(*[range(s.k_max + 1) for s in slots]):
        n = sum(expected_tokens(s.alpha_by_pos, k) for s, k in zip(slots, ks, strict=True))
        g = n / step_seconds(ks, target, draft, fixed_s, slots, spec_s)
        if g > best_g + 1e-12:
            best, best_g = ks, g
    return best, best_g


@pytest.mark.parametrize("case", range(60))
def test_equals_exhaustive_search(case):
    rng = np.random.default_rng(case)
    n = int(rng.integers(1, 5))
    slots = [
        SlotInput(
            tuple(rng.uniform(0, 1, size=int(rng.integers(1, 4)))),
            int(rng.integers(0, 5)),
            catch_up=int(rng.integers(0, 40)) * int(rng.integers(0, 2)),
            left=int(rng.integers(0, 30)),
            free=int(rng.integers(0, 4)) * int(rng.integers(0, 2)),
        )
        for _ in range(n)
    ]
    target = Line(rng.uniform(0.005, 0.05), rng.uniform(0, 0.01))
    draft = Line(rng.uniform(0, 0.02), rng.uniform(0, 0.02))
    fixed = float(rng.uniform(0, 0.01))
    spec = float(rng.uniform(0, 0.02)) * int(rng.integers(0, 2))
    got = choose(slots, target, draft, fixed, spec)
    ks, g = brute_force(slots, target, draft, fixed, spec)
    assert got.goodput == pytest.approx(g, rel=1e-12)
    assert got.step_s == pytest.approx(step_seconds(got.k, target, draft, fixed, slots, spec))


@pytest.mark.parametrize("alpha", [(), (0.3,), (0.9, 0.5), (1.0, 0.2, 0.7, 0.1)])
def test_expected_gains_equal_expected_tokens_for_every_k(alpha):
    got = expected_gains(alpha, 6)
    assert got.shape == (7,)
    assert got == pytest.approx([expected_tokens(alpha, k) for k in range(7)], rel=1e-12)


def test_a_catch_up_is_charged_by_the_share_of_the_rounds_left():
    # DRAFT_BATCHED slope 2 ms a token: 30 missing tokens are 60 ms, 1.8 / 90 of it at K=1
    t, d = TARGET, DRAFT_BATCHED
    up = SlotInput((0.8,), 1)
    far = SlotInput((0.8,), 1, catch_up=30, left=90)
    whole = SlotInput((0.8,), 1, catch_up=30)
    plain = step_seconds((1,), t, d)
    assert step_seconds((1,), t, d, slots=[up]) == pytest.approx(plain)
    assert step_seconds((1,), t, d, slots=[far]) == pytest.approx(plain + 0.060 * 1.8 / 90)
    assert step_seconds((1,), t, d, slots=[whole]) == pytest.approx(plain + 0.060)
    assert step_seconds((0,), t, d, slots=[whole]) == pytest.approx(step_seconds((0,), t, d))
    # one stream at 0.9 speculates when up to date or when the share is small, not when a
    # 100-token catch-up (200 ms) falls on one round
    assert choose([SlotInput((0.9,), 4)], t, d).k[0] > 0
    assert choose([SlotInput((0.9,), 4, catch_up=100, left=500)], t, d).k[0] > 0
    assert choose([SlotInput((0.9,), 4, catch_up=100)], t, d).k == (0,)


def test_step_seconds_counts_rows_and_depths():
    # rows 3 + 1 + 2 = 6; depth 1: 2 slots, depth 2: 1 slot
    t, d = Line(1.0, 0.1), Line(0.5, 0.01)
    assert step_seconds((2, 0, 1), t, d, 0.25) == pytest.approx(1.6 + 0.52 + 0.51 + 0.25)


def test_line_fit():
    fit = LineFit(Line(1.0, 0.5))
    assert fit.line() == Line(1.0, 0.5)
    fit.add(2, 3.0)  # one size: the prior's slope through what was seen
    assert fit.line() == Line(2.0, 0.5)
    for x in (1, 3, 4):
        fit.add(x, 0.04 + 0.005 * x)
    fit = LineFit(Line(1.0, 0.5))
    for x in (1, 3, 4, 9):
        fit.add(x, 0.04 + 0.005 * x)
    line = fit.line()
    assert line.intercept_s == pytest.approx(0.04) and line.slope_s == pytest.approx(0.005)
    falling = LineFit(Line(0.0, 0.0))
    falling.add(1, 0.2)
    falling.add(2, 0.1)
    assert falling.line() == Line(pytest.approx(0.15), 0.0)


def test_a_line_fitted_by_size_stays_true_at_a_size_the_server_seldom_makes():
    # a server that speculates decodes at 33-40 rows almost always, where the demo
    # target's concave cost looked locally like 132 ms + 3.4 ms a row (measured at four
    # sampled streams), and at the ordinary four rows (65 ms) a few times: the line must
    # still price four rows near 65 ms, or K = 0 is judged at twice its cost
    rng = np.random.default_rng(7)
    fit = LineFit(Line(0.040, 0.005))
    for _ in range(4):
        fit.add(4, 0.065 + rng.normal(0, 0.003))
    xs, ys = [], []
    for _ in range(400):
        x = int(rng.integers(33, 41))
        y = 0.132 + 0.0034 * x + rng.normal(0, 0.015)
        fit.add(x, y)
        xs.append(x)
        ys.append(y)
    assert fit.line()(4) == pytest.approx(0.065, rel=0.1)
    assert fit.line()(36) == pytest.approx(0.132 + 0.0034 * 36, rel=0.05)
    # one window of the latest 256 decodes (the rule before) priced four rows at 2.3x
    slope, intercept = np.polyfit(xs[-256:], ys[-256:], 1)
    assert intercept + 4 * slope > 1.5 * 0.065
    # each size keeps its last `per_size` measurements: a size measured anew moves
    for _ in range(32):
        fit.add(4, 0.080)
    assert fit.line()(4) == pytest.approx(0.080, rel=0.1)
    for _ in range(32):
        fit.add(4, 0.065)
    assert fit.line()(4) == pytest.approx(0.065, rel=0.1)
    # one far decode that took twice its cost (a 68-row one, 868 ms against about 400 ms
    # steady) moves nothing; that size counts once seen three times, by its median
    before = fit.line()
    fit.add(68, 0.868)
    assert fit.line() == before
    for _ in range(2):
        fit.add(68, 0.400)
    assert fit.line() != before
    assert fit.line()(68) < 0.5


def test_a_line_fitted_under_its_bounds_passes_through_what_was_measured():
    # one size only, a prior steeper than the measurement allows (the one-stream server's
    # draft line after a disturbed calibration: 0 ms + 40 ms a token, re-timed at one token,
    # 22 ms): through the origin and the measured point, not 40 ms at x = 1 for ever
    steep = LineFit(Line(0.0, 0.040))
    for _ in range(3):
        steep.add(1, 0.022)
    assert steep.line()(1) == pytest.approx(0.022)
    assert steep.line() == Line(0.0, pytest.approx(0.022))
    # two sizes whose free line has a negative intercept: the least-squares line through
    # the origin (sum xy / sum x^2), below the clamped fit's at every measured x
    low = LineFit(Line(0.0, 0.0))
    low.add(1, 0.010)
    low.add(3, 0.050)
    assert low.line() == Line(0.0, pytest.approx((0.010 + 0.150) / 10))
    x, y = np.array([1.0, 3.0]), np.array([0.010, 0.050])
    slope, intercept = np.polyfit(x, y, 1)
    clamped = Line(0.0, slope)  # what clamping the free fit's intercept gave
    assert all(low.line()(xi) < clamped(xi) for xi in x)
    # the constrained fit minimizes the squared error among lines with both terms >= 0
    err = lambda ln: float(((ln.intercept_s + ln.slope_s * x - y) ** 2).sum())  # noqa: E731
    grid = [Line(a, b) for a in np.linspace(0, 0.02, 41) for b in np.linspace(0, 0.03, 61)]
    assert err(low.line()) <= min(err(g) for g in grid) + 1e-12


def test_acceptance_counts_tested_positions():
    a = Acceptance(prior=0.5, weight=2.0, depth=4)
    a.update(3, 1)  # x_1 accepted, x_2 rejected, x_3 untested
    a.update(2, 2)  # both accepted
    np.testing.assert_array_equal(a.tested, [2, 2, 0, 0])
    np.testing.assert_array_equal(a.hits, [2, 1, 0, 0])
    # each position shrunk toward the one before: (2 + 2 * 0.5) / 4, (1 + 2 * 0.75) / 4
    assert a.alpha_by_pos(3) == pytest.approx((3 / 4, 5 / 8, 5 / 8))


def test_a_request_served_at_k_1_that_is_always_accepted_grows_its_k():
    ctl = BatchController(warmup_rounds=0, k_max=8)
    for rows in (1, 2, 5):
        ctl.observe_target(rows, 0.04 + 0.006 * rows)
    ctl.observe_draft(1, 0.005)  # the draft line passes through it: 5 ms a token
    acc = ctl.new_acceptance()
    # nothing known yet: the prior, 0.79 at every position; E(K) / (46 ms + 11 ms K) is
    # 35.5, 36.8 and 36.6 tokens/s at K = 2, 3, 4
    assert ctl.choose([SlotState(acc, 8)]).k[0] == 3
    for _ in range(20):
        acc.update(1, 1)
    assert ctl.choose([SlotState(acc, 8)]).k[0] >= 4


@pytest.mark.parametrize("fade", [0.8, 1.0])
def test_a_deep_position_rejected_once_is_tried_again(fade: float) -> None:
    """One early rejection at position 3, then rounds at K = 2 all accepted: the untested
    position fades back toward position 2's estimate, so K grows past 2 again. The planted
    twin (no fading) keeps alpha_3 where one round left it, and K at 2."""
    ctl = BatchController(k_max=8, draft_batched=True, warmup_rounds=0)
    _demo_costs(ctl, 0.022)
    acc = Acceptance(0.79, fade=fade)
    acc.update(4, 2)  # x_1, x_2 accepted, x_3 rejected
    for _ in range(30):
        acc.update(2, 2)
    k = ctl.choose([SlotState(acc, 8)]).k[0]
    if fade < 1.0:
        assert acc.alpha_by_pos(3)[2] > 0.9 and k > 2
    else:
        assert acc.alpha_by_pos(3)[2] < 0.7 and k <= 2


def test_controller_prior_probe_and_fits():
    ctl = BatchController(
        warmup_rounds=0,
        k_max=4,
        probe_every=8,
        probe_budget=0.2,
        draft_batched=True,
    )
    # the pooled rate plus one standard deviation: Beta(1, 1), then Beta(1, 2)
    assert ctl.new_acceptance().prior == pytest.approx(0.5 + (0.25 / 3) ** 0.5)
    low = Acceptance(prior=0.0, weight=1.0)
    ctl.observe_round(low, 4, 0)
    assert ctl.new_acceptance().prior == pytest.approx(1 / 3 + (2 / 9 / 4) ** 0.5)
    for rows in (1, 2, 5):
        ctl.observe_target(rows, 0.04 + 0.006 * rows)
    ctl.observe_draft(1, 0.019)
    ctl.observe_draft(2, 0.021)  # a draft depth: 17 ms + 2 ms a slot
    ctl.observe_draft(17, 0.051, n_rows=1)  # a catch-up of 16 tokens: 2 ms each
    assert ctl.choose([SlotState(low, 4)]).k == (0,)
    assert ctl.choose([SlotState(low, 4, idle_steps=7)]).k == (0,)
    # a probe costs a row and a one-token depth, 25 ms: within 20% of 8 idle steps (46 ms)
    probe = ctl.choose([SlotState(low, 4, idle_steps=8)])
    assert probe.k == (1,) and probe.goodput < probe.goodput_ordinary
    assert ctl.choose([SlotState(low, 0, idle_steps=99)]).k == (0,)  # no drafter
    # a draft 26 tokens behind adds 52 ms: 77 ms is over 20% of 8 steps (74 ms), not of 9
    assert ctl.choose([SlotState(low, 4, idle_steps=8, catch_up=26)]).k == (0,)
    assert ctl.choose([SlotState(low, 4, idle_steps=9, catch_up=26)]).k == (1,)


def _demo_costs(ctl: BatchController, draft_s: float) -> None:
    """The demo pair on the 2-core CPU: a target decode 40 ms + 6 ms a row; a draft token
    `draft_s` seconds with its row, 1.3 ms without."""
    for rows in (1, 2, 5):
        ctl.observe_target(rows, 0.040 + 0.006 * rows)
    ctl.draft.set_prior(Line(0.0, draft_s), 0.0013)


@pytest.mark.parametrize("warmup", [3, 0])
def test_one_unlucky_first_block_does_not_stop_a_cold_request(warmup: int) -> None:
    """A single stream's first block (nothing pooled yet) rejected at once: its estimate
    falls to 0.53, where K = 0 pays best; the warm-up keeps its first rounds speculating,
    at the best K >= 1 for it, so a good draft gets its chance. The planted twin (no
    warm-up, as before the single stream ran on this controller) stops."""
    ctl = BatchController(k_max=8, draft_batched=True, warmup_rounds=warmup)
    _demo_costs(ctl, 0.022)
    acc = ctl.new_acceptance()
    ctl.observe_round(acc, 2, 0)
    choice = ctl.choose([SlotState(acc, 8, idle_steps=1)])
    if warmup:
        assert choice.k[0] >= 1 and choice.reasons == ("warm_up",)
    else:
        assert choice.k == (0,)
    for _ in range(2):  # three model rounds in all: the warm-up is over
        ctl.observe_round(acc, 1, 0)
    assert ctl.choose([SlotState(acc, 8, idle_steps=1)]).k == (0,)


def test_no_warm_up_for_a_draft_that_can_never_pay_nor_once_the_pool_knows() -> None:
    ctl = BatchController(k_max=8, draft_batched=True)
    _demo_costs(ctl, 0.050)  # a draft token dearer than an ordinary pass (46 ms)
    acc = ctl.new_acceptance()
    ctl.observe_round(acc, 2, 0)
    assert ctl.choose([SlotState(acc, 8, idle_steps=1)]).k == (0,)
    ctl = BatchController(k_max=8, draft_batched=True)
    _demo_costs(ctl, 0.022)
    for _ in range(8):  # another request's 16 tested positions, mostly rejected
        ctl.observe_round(ctl.new_acceptance(), 2, 1)
    acc = ctl.new_acceptance()
    ctl.observe_round(acc, 2, 0)
    assert ctl.choose([SlotState(acc, 8, idle_steps=1)]).k == (0,)
    # no warm-up makes a waiting request wait either
    cold = BatchController(k_max=8, draft_batched=True)
    _demo_costs(cold, 0.022)
    acc = cold.new_acceptance()
    cold.observe_round(acc, 2, 0)
    assert cold.choose([SlotState(acc, 8, idle_steps=1)], waiting_s=[0.1]).k == (0,)


@pytest.mark.parametrize(("left", "warms"), [(64, False), (1000, True), (0, True)])
def test_no_warm_up_whose_catch_up_the_tokens_left_cannot_win_back(left, warms) -> None:
    """A long prompt's catch-up (2,000 draft tokens, 2.6 s) against a short answer: with
    every draft accepted the best K saves 16 ms a token, so 64 tokens left win back 1 s
    at most and no warm-up is made (its first round was the catch-up: a 1,543-token chat
    message answered in 64 tokens took twice ordinary decoding's time). 1,000 tokens
    left, or an unknown number (0), can win it back: the warm-up is made as before."""
    ctl = BatchController(k_max=8, draft_batched=True)
    _demo_costs(ctl, 0.022)
    state = SlotState(ctl.new_acceptance(), 8, idle_steps=1, catch_up=2000, left=left)
    choice = ctl.choose([state])
    assert (choice.k[0] > 0) == warms and (choice.reasons == ("warm_up",)) == warms


def test_the_prior_of_a_new_request_tends_to_the_pooled_rate():
    ctl = BatchController(warmup_rounds=0)
    acc = ctl.new_acceptance()
    for i in range(1000):  # K = 1 rounds, 300 of 1,000 accepted
        ctl.observe_round(acc, 1, 1 if i % 10 < 3 else 0)
    mean = 301 / 1002
    assert ctl.new_acceptance().prior == pytest.approx(mean + (mean * (1 - mean) / 1003) ** 0.5)
    assert abs(ctl.new_acceptance().prior - 0.3) < 0.02


def test_each_sampling_setting_pools_its_own_rate():
    ctl = BatchController(warmup_rounds=0)
    greedy, sampled = SamplingParams(temp=0.0), SamplingParams(temp=0.8)
    acc = ctl.new_acceptance(greedy)
    for i in range(1000):  # greedy rounds: 900 of 1,000 accepted
        ctl.observe_round(acc, 1, 1 if i % 10 < 9 else 0)
    assert abs(ctl.new_acceptance(greedy).prior - 0.9) < 0.02
    # a sampled request starts from no evidence (Beta(1, 1) plus one deviation), not 0.9
    fresh = 0.5 + (0.25 / 3) ** 0.5
    assert ctl.new_acceptance(sampled).prior == pytest.approx(fresh)
    assert ctl.new_acceptance(SamplingParams(temp=0.8)).pool == sampled  # equal settings
    for t in range(1, 64):  # 62 new settings (0.8 is sampled's): 64 pools, greedy's oldest
        ctl.new_acceptance(SamplingParams(temp=t / 10))
    assert ctl.new_acceptance(sampled).prior == pytest.approx(fresh)
    ctl.new_acceptance(SamplingParams(temp=99.0))  # the 65th setting drops greedy's
    assert ctl.new_acceptance(greedy).prior == pytest.approx(fresh)


def test_no_probes_where_the_catch_up_grows_faster_than_the_budget():
    # 4 sampled streams on the 2-core CPU, as measured: a step 61 ms, a draft token 2.4 ms
    # in a batch; at 2% a step buys 1.2 ms of probing, less than the catch-up grows
    ctl = BatchController(warmup_rounds=0, k_max=8, draft_batched=True)
    for rows in (4, 5, 8):
        ctl.observe_target(rows, 0.042 + 0.0047 * rows)
    for tokens in (4, 40, 128):
        ctl.observe_draft(tokens, 0.010 + 0.0024 * tokens)
    low = [Acceptance(prior=0.3) for _ in range(4)]
    for idle in (32, 64, 256, 1024):
        got = ctl.choose([SlotState(a, 8, idle, catch_up=idle, left=500) for a in low])
        assert got.k == (0, 0, 0, 0)
    # the old rule (K = 1 every 32 idle steps) is what this budget refuses
    cheap = BatchController(warmup_rounds=0, k_max=8, draft_batched=True, probe_budget=1.0)
    cheap.target, cheap.draft = ctl.target, ctl.draft
    assert cheap.choose([SlotState(a, 8, 32, catch_up=32, left=500) for a in low]).k == (1,) * 4


def test_a_request_s_first_step_is_probed_even_where_costs_say_no():
    # costs that a slope prior made too high: no K pays, not even at alpha = 1
    ctl = BatchController(
        warmup_rounds=0,
        k_max=4,
        target_prior=Line(0.04, 0.5),
        draft_prior=Line(0.0, 0.5),
    )
    acc = ctl.new_acceptance()
    assert ctl.choose([SlotState(acc, 4)]).k == (0,)
    assert ctl.choose([SlotState(acc, 4, first=True)]).k == (1,)
    assert ctl.choose([SlotState(acc, 0, first=True)]).k == (0,)  # no drafter


def test_a_first_step_whose_draft_lacks_the_prompt_is_not_forced():
    # the server prefills a draft lazily: a first-step probe would buy the whole prompt's
    # draft prefill, so it is left to the goodput choice (with the catch-up's share)
    ctl = BatchController(
        warmup_rounds=0,
        k_max=4,
        target_prior=Line(0.04, 0.5),
        draft_prior=Line(0.0, 0.5),
    )
    acc = ctl.new_acceptance()
    assert ctl.choose([SlotState(acc, 4, catch_up=40, left=100, first=True)]).k == (0,)
    cheap = BatchController(
        warmup_rounds=0,
        k_max=4,
        target_prior=Line(0.04, 0.001),
        draft_prior=Line(0.0, 0.004),
    )
    got = cheap.choose([SlotState(cheap.new_acceptance(), 4, catch_up=40, left=100, first=True)])
    assert got.k[0] >= 1  # where speculation pays, the prompt's catch-up does not stop it


def test_the_overhead_of_speculating_steps_is_their_residual_over_ordinary_ones():
    ctl = BatchController(
        warmup_rounds=0,
        target_prior=Line(0.040, 0.005),
        draft_prior=Line(0.010, 0.002),
        draft_batched=True,
    )
    assert ctl.spec_overhead_s == 0.0
    ctl.observe_step((0, 0), 0, 0.050 + 0.001)  # predicted 0.050: residual 1 ms
    assert ctl.spec_overhead_s == 0.0  # no speculating step seen yet
    # (2, 1): rows 5 -> 0.065, depths 0.014 + 0.012, 3 catch-up tokens 0.006: 0.097
    ctl.observe_step((2, 1), 3, 0.097 + 0.009)
    assert ctl.spec_overhead_s == pytest.approx(0.008)
    ctl.observe_step((2, 1), 3, 0.097 + 0.011)
    ctl.observe_step((2, 1), 3, 0.097 + 1.500)  # a stall of the machine moves a median little
    assert ctl.spec_overhead_s == pytest.approx(0.010)
    for _ in range(7):  # ordinary steps forget one speculating step in four (the 4th, 8th)
        ctl.observe_step((0, 0), 0, 0.050 + 0.001)
    assert ctl.spec_overhead_s == pytest.approx(1.500 - 0.001)  # only the stall is left
    for _ in range(4):
        ctl.observe_step((0, 0), 0, 0.050 + 0.001)
    assert ctl.spec_overhead_s == 0.0
    ctl.observe_step((1, 0), 0, 0.0)  # faster than predicted: never below 0
    assert ctl.spec_overhead_s == 0.0


def test_a_lookup_block_s_residual_is_against_its_rows_only():
    ctl = BatchController(
        warmup_rounds=0,
        target_prior=Line(0.040, 0.005),
        draft_prior=Line(0.010, 0.002),
        draft_batched=True,
    )
    ctl.observe_step((0,), 0, 0.045)  # residual 0
    ctl.observe_step((4,), 0, 0.065 + 0.003, free=(4,))  # 5 rows, no draft decode: 0.065
    assert ctl.spec_overhead_s == pytest.approx(0.003)
    # 2 beyond 3 free: one decode of 1 + 3 tokens, one of 1: 0.010 + 0.008 + 0.012
    ctl.observe_step((5,), 0, 0.070 + 0.030 + 0.003, free=(3,))
    assert ctl.spec_overhead_s == pytest.approx(0.003)


def test_a_measured_overhead_stops_speculation_that_pays_only_without_it():
    acc = Acceptance(0.7)
    slots = [SlotState(acc, 4)] * 4
    ctl = BatchController(
        warmup_rounds=0,
        k_max=4,
        target_prior=Line(0.040, 0.004),
        draft_prior=Line(0.005, 0.002),
        draft_batched=True,
    )
    ctl.probe_every = 0
    assert any(ctl.choose(slots).k)
    n_spec = ctl.choose(slots).expected_tokens
    ctl.observe_step((0,) * 4, 0, ctl.target.line()(4))
    ctl.observe_step((1,) * 4, 0, step_seconds((1,) * 4, ctl.target.line(), ctl.draft_line()) + 0.5)
    got = ctl.choose(slots)
    assert got.k == (0,) * 4 and n_spec > got.expected_tokens


def test_the_draft_is_re_timed_only_where_a_cheaper_one_would_speculate():
    acc = Acceptance(0.9)
    rows_rule = BatchController(
        warmup_rounds=0,
        k_max=4,
        target_prior=Line(0.040, 0.200),
        draft_prior=Line(0.0, 0.100),
        draft_batched=True,
    )
    assert rows_rule.choose([SlotState(acc, 4)]).k == (0,)  # a row costs more than it gives
    assert not rows_rule.retime_due(1, 1000.0)
    draft_rule = BatchController(
        warmup_rounds=0,
        k_max=4,
        target_prior=Line(0.040, 0.001),
        draft_prior=Line(0.0, 0.060),
        draft_batched=True,
    )
    assert draft_rule.choose([SlotState(acc, 4)]).k == (0,)  # the draft alone rules it out
    assert draft_rule.retime_due(1, 1000.0) and not draft_rule.retime_due(1, 1.0)


def test_lookup_positions_cost_rows_only():
    # a draft too dear to pay: the model alone is not worth a depth, but the 5 positions a
    # prompt-lookup match proposes cost rows only, so K = 5 exactly
    t, d = Line(0.040, 0.001), Line(0.030, 0.030)
    up = SlotInput((0.95,), 8)
    assert choose([up], t, d).k == (0,)
    assert choose([SlotInput((0.95,), 8, free=5)], t, d).k == (5,)
    # beyond the free ones the model's first decode also evaluates them: 1 + 5 tokens
    plain = step_seconds((6,), t, d)
    assert step_seconds((6,), t, d, slots=[SlotInput((0.95,), 8, free=5)]) == pytest.approx(
        t(7) + d(1) + 0.030 * 5
    )
    assert step_seconds((5,), t, d, slots=[SlotInput((0.95,), 8, free=5)]) == pytest.approx(t(6))
    assert plain == pytest.approx(t(7) + 6 * d(1))


def test_lookup_positions_are_valued_at_the_lookups_own_rate():
    # 40 ms + 10 ms a row: ordinary decoding gives 20 tokens/s; five lookup positions at
    # the model's 0.95 give 5.5 tokens in 100 ms, at the lookup's own 0.15 K = 1 gives
    # 1.15 tokens in 60 ms (19.2/s): not worth its row
    ctl = BatchController(
        warmup_rounds=0,
        k_max=8,
        target_prior=Line(0.040, 0.010),
        draft_prior=Line(0.030, 0.030),
        draft_batched=True,
        probe_every=0,
    )
    acc = Acceptance(0.95)
    assert ctl.choose([SlotState(acc, 8, free=5)]).k == (5,)
    assert ctl.choose([SlotState(acc, 8, free=5, free_alpha=0.15)]).k == (0,)
    assert ctl.choose([SlotState(acc, 8, free=5, free_alpha=0.9)]).k == (5,)
    # beside a slot without lookup, only the lookup's positions take its rate
    both = ctl.choose([SlotState(acc, 8), SlotState(acc, 8, free=2, free_alpha=0.15)])
    assert both.k[1] == 0


def test_draft_fit_prices_a_row_and_a_token_without_one_apart():
    # the demo draft on 2 CPU cores: 3 ms + 9 ms a row + 1.4 ms a token without one; the
    # server's decodes: depths of 1-4 slots, some with a catch-up, and a chunked prefill
    c0, c_row, c_tok = 0.003, 0.009, 0.0014
    fit = DraftFit(Line(0.0, 0.020))
    shapes = [(1, 1), (4, 4), (2, 2), (4, 10), (1, 100), (3, 3), (0, 256), (2, 40)]
    for rows, tokens in shapes:
        fit.add(rows, tokens, c0 + c_row * rows + c_tok * (tokens - rows))
    # within 10 us: the ridge toward the prior pulls that little
    assert fit.coef() == pytest.approx((c0, c_row, c_tok), abs=1e-5)
    assert fit.line()(4) == pytest.approx(0.039, abs=1e-5)
    assert fit.token_s == pytest.approx(c_tok, abs=1e-6)
    # one line in the tokens, fitted to the same decodes (the controller's model before;
    # it came out 24 ms + 1.4 ms a token in a real server too) prices a depth of four
    # slots at under three quarters of its cost, and one of one slot at twice its cost
    tokens_line = LineFit(Line(0.0, 0.020))
    for rows, tokens in shapes:
        tokens_line.add(tokens, c0 + c_row * rows + c_tok * (tokens - rows))
    assert tokens_line.line()(4) < 0.75 * fit.line()(4)
    assert tokens_line.line()(1) > 2 * fit.line()(1)


def test_draft_fit_keeps_the_prior_only_where_the_decodes_leave_it_open():
    fit = DraftFit(Line(0.010, 0.002), token_s=0.0015)
    assert fit.coef() == (0.010, 0.002, 0.0015) and fit.n == 0
    for _ in range(3):  # depths of two slots only, no catch-up
        fit.add(2, 2, 0.030)
    c0, c_row, c_tok = fit.coef()
    assert c0 + 2 * c_row == pytest.approx(0.030, abs=1e-5)  # through what was measured
    assert c_tok == pytest.approx(0.0015)  # never measured: the prior's
    # the split of c0 and c_row follows the prior: equal moves from it (the ridge)
    assert (c0 - 0.010) * 2 == pytest.approx(c_row - 0.002, abs=1e-5)
    # a steep prior at one slot only: the line goes through the measured point, >= 0
    steep = DraftFit(Line(0.0, 0.040))
    for _ in range(3):
        steep.add(1, 1, 0.022)
    assert steep.line()(1) == pytest.approx(0.022, abs=1e-5)
    assert min(steep.coef()) >= 0.0


def test_draft_fit_is_the_least_squares_fit_under_its_bounds():
    # decodes whose free fit has a negative intercept: the bounded optimum has c0 = 0, and
    # no point of a grid of non-negative coefficients fits better
    data = [(1, 1, 0.008), (2, 2, 0.020), (4, 4, 0.044), (1, 9, 0.020), (3, 20, 0.062)]
    fit = DraftFit(Line(0.0, 0.0), token_s=0.0)
    for rows, tokens, y in data:
        fit.add(rows, tokens, y)
    x = np.array([[1.0, r, t - r] for r, t, _ in data])
    y = np.array([d[2] for d in data])
    free = np.linalg.lstsq(x, y, rcond=None)[0]
    assert free[0] < 0  # the bound binds
    got = np.array(fit.coef())
    assert got[0] == 0.0 and (got >= 0).all()

    def err(b):
        return float(((x @ b - y) ** 2).sum())

    grid = np.stack(
        np.meshgrid(
            np.linspace(0, 0.004, 21), np.linspace(0, 0.015, 61), np.linspace(0, 0.004, 41)
        ),
        -1,
    ).reshape(-1, 3)
    assert err(got) <= min(err(b) for b in grid) + 1e-9


def test_a_catch_up_is_charged_over_the_rounds_a_run_of_them_lasts():
    # a slot 100 tokens behind with 200 tokens left: charged by the rounds left, the
    # catch-up is nearly free per round and the slot speculates; once runs are known to
    # last 2 rounds (slots under load start and stop), half of it goes to this round and
    # K = 0 is chosen
    alpha = (0.8,) * 4
    target, draft, tok = Line(0.040, 0.004), Line(0.004, 0.009), 0.0015
    slot = SlotInput(alpha, 4, catch_up=100, left=200)
    g = expected_gains(alpha, 4)
    np.testing.assert_allclose(_catch_up_share(slot, g), np.r_[0.0, g[1:] / 200])
    short = SlotInput(alpha, 4, catch_up=100, left=200, run_rounds=2.0)
    np.testing.assert_allclose(_catch_up_share(short, g), [0.0, 0.5, 0.5, 0.5, 0.5])
    long_ = SlotInput(alpha, 4, catch_up=100, left=200, run_rounds=500.0)
    np.testing.assert_allclose(_catch_up_share(long_, g), _catch_up_share(slot, g))
    assert choose([slot], target, draft, token_s=tok).k[0] > 0
    assert choose([short], target, draft, token_s=tok).k == (0,)
    # step_seconds charges the same share
    want = target(3) + 2 * draft(1) + tok * 100 * 0.5
    assert step_seconds((2,), target, draft, 0.0, [short], token_s=tok) == pytest.approx(want)


def test_the_controller_learns_how_long_runs_last():
    ctl = BatchController(warmup_rounds=0, k_max=4, draft_batched=True)
    assert ctl.run_rounds == 0.0
    for rounds in (1, 2, 0, 3):  # a run of 0 rounds is none
        ctl.observe_run(rounds)
    assert ctl.run_rounds == 0.0  # three runs: not yet known
    ctl.observe_run(6)
    assert ctl.run_rounds == pytest.approx(3.0)
    for rows in (1, 2, 5):
        ctl.observe_target(rows, 0.040 + 0.004 * rows)
    ctl.observe_draft(1, 0.013)
    ctl.observe_draft(4, 0.040)
    ctl.observe_draft(17, 0.013 + 16 * 0.0015, n_rows=1)
    acc = Acceptance(prior=0.8)
    behind = SlotState(acc, 4, catch_up=100, left=200)
    assert ctl.choose([behind]).k == (0,)  # 1/3 of 150 ms is more than K buys
    fresh = BatchController(warmup_rounds=0, k_max=4, draft_batched=True)
    fresh.target, fresh.draft = ctl.target, ctl.draft
    assert fresh.choose([behind]).k[0] > 0  # runs unknown: the rounds left, as before


def test_recent_entry_makes_marks_and_drops_the_least_recently_used():
    entries: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
    a = recent_entry(entries, "a", list, 2)
    a.append(1)
    recent_entry(entries, "b", list, 2)
    assert recent_entry(entries, "a", list, 2) is a  # kept, and now the most recent
    recent_entry(entries, "c", list, 2)
    assert list(entries) == ["a", "c"]  # "b" was the least recently used
    assert recent_entry(entries, "b", list, 2) == []  # made anew


def _stalled_decodes(fit: DraftFit) -> None:
    """The demo draft's decodes in a server (20 ms + 9 ms a row + 3 ms a token without one,
    1 ms of jitter) with 16 stalls of the machine among 240: two-row depths of 0.3-1.3 s,
    as measured at four greedy streams under a schema."""
    rng = np.random.default_rng(7)
    for i in range(240):
        rows = int(rng.integers(1, 5))
        extra = int(rng.integers(0, 40)) if i % 5 == 0 else 0
        seconds = 0.020 + 0.009 * rows + 0.003 * extra + rng.normal(0.0, 0.001)
        if i % 15 == 7:
            rows, extra, seconds = 2, 0, float(rng.uniform(0.3, 1.3))
        fit.add(rows, rows + extra, seconds)


def test_draft_fit_leaves_out_the_stalls_of_the_machine(monkeypatch):
    fit = DraftFit(Line(0.0, 0.020))
    _stalled_decodes(fit)
    assert fit.coef() == pytest.approx((0.020, 0.009, 0.003), abs=1e-3)
    # planted: the plain least-squares fit, stalls kept, is steered by them
    monkeypatch.setattr(costs, "_STALL_SIGMAS", math.inf)
    plain = DraftFit(Line(0.0, 0.020))
    _stalled_decodes(plain)
    assert plain.line()(2) > 0.038 + 0.02  # a two-row depth priced 20 ms too high at least
