"""The online cost model that picks the block size K before each round (`--draft-max auto`).

Speculation pays only when the tokens a round is expected to emit outweigh what the
round costs. Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative
Decoding", section 3.4, eq. (1) and Theorem 3.8) give the expected number of tokens of a
round with block K under a constant acceptance rate alpha, E = (1 - alpha^(K+1)) /
(1 - alpha); the speedup is E divided by the round's cost in ordinary-decoding passes.
This module measures every term online instead of assuming it:

- acceptance per position i of the block, alpha_i = P(x_i accepted | x_1..x_{i-1}
  accepted), as Beta-like counts with exponential forgetting, shrunk toward the pooled
  rate of all positions (deep positions are seen rarely);
- the probability that the drafter proposes position i at all, s_i (a confidence
  cut-off or an n-gram lookup may stop a block early: positions never drafted are not
  rejections, they make the round shorter and its verification cheaper);
- the draft cost as a function of the number of drafted tokens, and the target's verify
  cost as a function of the number of tokens in the batch (a per-size moving average
  plus a linear fit c0 + c1 * n for sizes not seen yet). On a CPU scoring 8 tokens costs
  2x to 5x one token; on a GPU it is nearly flat, so neither is assumed.

A round with K = 0 is an ordinary decoding pass, so its measured cost *is* the ordinary
baseline 1 / `ordinary_token_s`. The controller runs one K = 0 round first to measure
it, updates it on every K = 0 round (fallback), and otherwise reads it from the verify
cost model at n = 1 (the per-size average blended with the linear fit).

A draft whose cost per token is at or above the target's ordinary pass cannot win at any
K, even if every proposal is accepted: a round of K costs at least K draft tokens plus one
target pass (verifying K + 1 tokens costs no less than verifying one) and emits at most
K + 1 tokens. Then acceptance is irrelevant (`Controller.hopeless`): the controller runs
ordinary decoding from the start (the loop times draft passes before the first round,
`observe_draft_pass`) and never probes: a probe would first make the draft catch up on
every token it missed, which costs a fixed share of ordinary decoding however rare the
probes are. Instead, now and then, the loop times one draft pass where its cache stands
(`retime_draft`), as rarely as keeps that within `probe_budget`, in case the costs change
(a busy machine, a first measurement that was unlucky).

When no K > 0 is predicted to beat ordinary decoding, the controller falls back to
K = 0 and re-probes with a small block every `probe_every` ordinary rounds (a probe
scores no bonus position, so with K = 1 the target's pass costs what an ordinary one
does and the probe costs only the drafting; see `Controller.bonus`); the gap
doubles while probes fail, up to `probe_every_max` or the gap at which failed probes
waste `probe_budget` of the time (so cheap probes come often), and a fully accepted
probe is followed at once by another, so a draft that becomes useful again is picked
up again. A run of rounds too unlikely under the estimates (the text changed) discounts
the acceptance evidence, so a draft that stops being useful is dropped quickly.

Pure: numpy only. The loop calls `choose_k` before and `observe` after every round.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

_SURPRISING = 0.1  # tail probability that makes a round count toward a change
# a hopeless draft is re-timed at most this many times more rarely than probe_every_max
_RETIME_GAP = 4

Reason = Literal["warmup", "model", "fallback", "probe", "fixed", "limit"]
FloatArray = npt.NDArray[np.float64]


def expected_gains(alpha_by_pos: Sequence[float], k_max: int) -> np.ndarray:
    """Expected tokens emitted by one round, for every block size K = 0..k_max at once.

    E(K) = 1 + sum_{i=1..K} prod_{j<=i} alpha_j: the accepted prefix plus the one token the
    target always adds (the residual draw after a rejection, or the bonus token). With a
    constant alpha this is Leviathan et al. 2023, eq. (1): (1 - alpha^(K+1)) / (1 - alpha).

    Args:
        alpha_by_pos: alpha_1, alpha_2, ...: probability that position i is accepted given
            positions 1..i-1 were (to account for a drafter that may stop early, pass
            s_i * alpha_i, the probability it is drafted *and* accepted). Shorter than
            k_max: the last value repeats. Empty: alpha = 0. Clipped to [0, 1].
        k_max: the largest block size (< 0 counts as 0).

    Returns:
        (k_max + 1,) float64, E(0) = 1 <= E(K) <= K + 1, non-decreasing in K.
    """
    k_max = max(0, k_max)
    a = np.clip(np.asarray(alpha_by_pos, dtype=np.float64)[:k_max], 0.0, 1.0)
    if a.size == 0:
        a = np.zeros(k_max)
    elif a.size < k_max:
        a = np.concatenate([a, np.full(k_max - a.size, a[-1])])
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(a))])


def expected_tokens(alpha_by_pos: Sequence[float], k: int) -> float:
    """Expected tokens emitted by one round with block size k (>= 0): `expected_gains`'s
    E(k), in [1, k + 1]."""
    return float(expected_gains(alpha_by_pos, k)[-1])


def break_even_alpha(
    k: int, draft_token_s: float, verify_s: float, ordinary_token_s: float
) -> float:
    """The constant acceptance rate below which block size k is slower than ordinary decoding.

    Speculation with block k pays when E(alpha, k) / (k * draft_token_s + verify_s) >
    1 / ordinary_token_s (E from `expected_tokens`), i.e. E(alpha, k) > c with
    c = (k * draft_token_s + verify_s) / ordinary_token_s. E rises from 1 at alpha = 0 to
    k + 1 at alpha = 1, so the root is found by bisection.

    Args:
        k: block size (>= 1).
        draft_token_s: seconds to draft one token.
        verify_s: seconds for the target to score the k + 1 tokens [last, x_1..x_k].
        ordinary_token_s: seconds of one ordinary decoding pass (one token).

    Returns:
        alpha in [0, 1]; 0.0 when speculation pays at any alpha (c <= 1), 1.0 when it
        cannot pay even at alpha = 1 (c >= k + 1).
    """
    c = (k * draft_token_s + verify_s) / ordinary_token_s
    if c <= 1.0:
        return 0.0
    if c >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):  # 2^-60: far below any timing noise
        mid = 0.5 * (lo + hi)
        if expected_tokens([mid], k) < c:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


class _Rates:
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


class _CostModel:
    """Seconds as a function of a size n (tokens): per-size moving average + linear fit.

    A size seen before is predicted by its moving average blended with the fit (weight
    of the average = number of observations, capped); an unseen size by the fit alone.
    The fit is weighted least squares of c0 + c1 * n over the per-size averages with
    c0, c1 >= 0 (cost never falls with more tokens). With a single size observed the
    slope comes from `prior_slope(n0, seconds0)`.
    """

    def __init__(
        self,
        prior_slope: Callable[[int, float], float],
        ema: float = 0.25,
        max_weight: float = 8.0,
        line_weight: float = 2.0,
    ) -> None:
        self._mean: dict[int, float] = {}
        self._count: dict[int, float] = {}
        self._prior_slope = prior_slope
        self._ema = ema
        self._max_weight = max_weight
        self._line_weight = line_weight
        self._fit: tuple[float, float] | None = None

    def __bool__(self) -> bool:
        return bool(self._mean)

    @property
    def sizes(self) -> list[int]:
        """The sizes observed so far."""
        return list(self._mean)

    def add(self, n: int, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0.0:
            return
        if n in self._mean:
            # one slow outlier (a garbage-collector pause, another process) raises the
            # average by at most a quarter: on a draft slower than its target, one such
            # ordinary round used to make speculation look possible again (`hopeless`).
            # A lasting slow-down still shows within a few rounds; speed-ups at once.
            seconds = min(seconds, 2.0 * self._mean[n])
            # a pass never runs faster than the machine allows: a faster one means the
            # earlier ones were slowed (a busy start), so it counts at once
            ema = 1.0 if seconds < 0.5 * self._mean[n] else self._ema
            self._mean[n] += ema * (seconds - self._mean[n])
            self._count[n] += 1.0
        else:
            self._mean[n] = seconds
            self._count[n] = 1.0
        self._fit = None

    def fit(self) -> tuple[float, float]:
        """(c0, c1) seconds and seconds/token. Requires at least one observation."""
        if self._fit is not None:
            return self._fit
        xs = np.array(list(self._mean), dtype=np.float64)
        ys = np.array(list(self._mean.values()))
        ws = np.minimum(np.array(list(self._count.values())), self._max_weight)
        if xs.size == 1:
            c1 = max(0.0, self._prior_slope(int(xs[0]), float(ys[0])))
            c0 = float(ys[0]) - c1 * float(xs[0])
            if c0 < 0.0:  # through the origin instead
                c0, c1 = 0.0, float(ys[0] / xs[0])
        else:
            xm, ym = np.average(xs, weights=ws), np.average(ys, weights=ws)
            sxx = float(np.sum(ws * (xs - xm) ** 2))
            c1 = float(np.sum(ws * (xs - xm) * (ys - ym)) / sxx)
            c0 = float(ym - c1 * xm)
            if c1 < 0.0:
                c0, c1 = float(ym), 0.0
            elif c0 < 0.0:
                c0, c1 = 0.0, float(np.sum(ws * xs * ys) / np.sum(ws * xs * xs))
        self._fit = (c0, c1)
        return self._fit

    def __call__(self, n: int) -> float:
        """Predicted seconds at size n; nan before any observation."""
        if not self._mean:
            return math.nan
        c0, c1 = self.fit()
        line = c0 + c1 * n
        if n in self._mean:
            w = min(self._count[n], self._max_weight)
            return line + w / (w + self._line_weight) * (self._mean[n] - line)
        return line


class Baseline:
    """Seconds of one ordinary decoding pass (the target alone, one token): the one figure
    every speedup is measured against, kept current by the run.

    It starts from the single-token passes timed right after the prompt (`add_initial`);
    every K = 0 round is an ordinary pass too and updates it (`add_round`). Once the run
    has `settle` ordinary rounds of its own, they alone decide (the median of the last
    `window`), so a machine that was busy for the first passes cannot make a run of
    ordinary rounds claim a speedup. One slow round counts at most twice the current
    estimate (the controller's outlier rule, `_CostModel.add`).

    Args:
        window: ordinary rounds kept (the newest).
        settle: ordinary rounds after which the initial passes no longer count.
        disagree: the ratio of the two medians beyond which they are said to disagree
            (a round costs a little more than a bare pass: the host's work and the
            consumer's between rounds).
    """

    def __init__(self, window: int = 32, settle: int = 3, disagree: float = 1.5) -> None:
        self._initial: list[float] = []
        self._rounds: collections.deque[float] = collections.deque(maxlen=window)
        self._settle = settle
        self._disagree = disagree

    def add_initial(self, seconds: Sequence[float]) -> None:
        """The passes timed after the prompt, seconds each."""
        self._initial.extend(s for s in seconds if math.isfinite(s) and s > 0.0)

    def add_round(self, seconds: float) -> None:
        """The decode of one K = 0 round, seconds."""
        if not math.isfinite(seconds) or seconds <= 0.0:
            return
        now = self.token_s
        self._rounds.append(seconds if now is None else min(seconds, 2.0 * now))

    @property
    def n_rounds(self) -> int:
        """Ordinary rounds measured so far (in the window)."""
        return len(self._rounds)

    @property
    def token_s(self) -> float | None:
        """The current estimate, seconds per token; None before any measurement."""
        if len(self._rounds) >= self._settle:
            return statistics.median(self._rounds)
        both = [*self._initial, *self._rounds]
        return statistics.median(both) if both else None

    def disagreement(self) -> float | None:
        """initial median / rounds' median when the two sets of passes disagree by more
        than their noise (at least `settle` of each, their [min, max] ranges do not
        overlap, and the medians differ by more than `disagree`), else None. > 1: the first
        passes were slower (a busy machine)."""
        a, b = self._initial, list(self._rounds)
        if len(a) < self._settle or len(b) < self._settle:
            return None
        if min(a) <= max(b) and min(b) <= max(a):
            return None
        r = statistics.median(a) / statistics.median(b)
        return r if max(r, 1.0 / r) > self._disagree else None

    def disagreement_note(self) -> str | None:
        """One line for the summary and --json when `disagreement` is not None."""
        r = self.disagreement()
        if r is None:
            return None
        which = "slower" if r > 1.0 else "faster"
        return (
            f"the ordinary passes timed after the prompt were {max(r, 1 / r):.1f}x {which}"
            f" than the run's {self.n_rounds} ordinary rounds (a busy machine?): the speedup"
            " uses the rounds"
        )


@dataclass(frozen=True)
class Decision:
    """One choice of block size, for stats and the live view.

    Attributes:
        round: 0-based round index.
        k: block size chosen (0 = ordinary decoding).
        reason: "warmup" (gathering the first measurements), "model" (the cost model's
            best K > 0), "fallback" (no K > 0 beats ordinary decoding), "probe" (a small
            block during fallback, to notice a draft that became useful), "fixed"
            (`--draft-max N`), "limit" (no room for a block: max_k = 0).
        predicted_tokens_per_s: the model's prediction for k when chosen (nan before data).
    """

    round: int
    k: int
    reason: Reason
    predicted_tokens_per_s: float


class Controller:
    """Chooses K each round from costs and acceptance measured online.

    Usage by the loop (one call of each per round, in this order):

        k = controller.choose_k(max_k)      # max_k: largest block allowed this round
        if k == 0 and controller.retime_draft():
            controller.observe_draft_pass(seconds of one timed draft pass)
        ... draft (may return m <= k tokens), verify, accept n ...
        controller.observe(k, n, draft_s, verify_s, n_proposed=m)

    Before the first round the loop may feed a separately timed ordinary pass
    (`observe` with k = 0) and draft pass (`observe_draft_pass`).

    Args:
        k_max: largest block size considered (>= 0).
        fixed_k: when set (`--draft-max N`) every round uses min(fixed_k, max_k); costs
            and acceptance are still measured for the stats.
        probe_every: ordinary rounds between probes at the start of a fallback episode
            (at least a quarter of the cost-based cap, see `probe_budget`).
        probe_every_max: the gap doubles after each failed probe, up to this, and up to
            the gap at which failed probes cost `probe_budget` of the time, if sooner.
        probe_budget: fraction of fallback time that failed probes may waste (a probe that
            fails still emits one token but costs more than an ordinary pass); sets the
            gap cap from the measured costs, so a cheap probe (GPU) comes often.
        probe_k: block size of a probe (small: a failed probe costs little).
        probe_bonus: whether a probe also scores the bonus position. False (default): a
            probe of K = 1 only tests x_1, so the target's pass is as cheap as an ordinary
            one and the probe costs just the drafting (see `bonus`).
        k_init: block size of the first speculative round (after one ordinary round that
            measures the baseline), before any draft cost is known.
        warmup_rounds: speculative rounds run before falling back is allowed, so one
            unlucky round cannot stop a good draft (they use the model's best K >= 1).
        forget: per-round decay of the acceptance counts (memory ~ 1 / (1 - forget) rounds).
        forget_untested: extra decay of the positions a round did not test, so their
            estimates return to the pooled rate within a few rounds (see `_Rates`).
        prior_alpha, prior_strength: optimistic Beta prior of the pooled acceptance rate
            (mean, pseudo-count); evidence outweighs it after a round or two.
        shrink: pseudo-count pulling each position's rate toward the pooled rate.
        change_p, change_keep: change detection on the acceptance (see `_detect_change`);
            change_p = 0 disables it.
    """

    def __init__(
        self,
        k_max: int,
        fixed_k: int | None = None,
        probe_every: int = 4,
        probe_every_max: int = 64,
        probe_budget: float = 0.02,
        probe_k: int = 1,
        probe_bonus: bool = False,
        k_init: int = 4,
        warmup_rounds: int = 2,
        forget: float = 0.9,
        forget_untested: float = 0.5,
        prior_alpha: float = 0.8,
        prior_strength: float = 1.0,
        shrink: float = 2.0,
        change_p: float = 1e-3,
        change_keep: float = 0.25,
    ) -> None:
        if k_max < 0 or (fixed_k is not None and fixed_k < 0):
            raise ValueError("block sizes must be >= 0")
        if not 1 <= probe_every <= probe_every_max or probe_k < 1:
            raise ValueError("need 1 <= probe_every <= probe_every_max and probe_k >= 1")
        if not (0.0 < forget <= 1.0 and 0.0 < forget_untested <= 1.0):
            raise ValueError("forget and forget_untested must be in (0, 1]")
        self.k_max = k_max if fixed_k is None else max(k_max, fixed_k)
        self.fixed_k = fixed_k
        self.probe_every = probe_every
        self.probe_every_max = probe_every_max
        self.probe_budget = probe_budget
        self.k_init = min(k_init, self.k_max)
        self.warmup_rounds = warmup_rounds
        self.probe_k = probe_k
        self.probe_bonus = probe_bonus
        n = max(self.k_max, 1)
        self._alpha = _Rates(n, prior_alpha, prior_strength, shrink, forget, forget_untested)
        # drafted-at-all rates: prior "the drafter proposes every position it is asked for"
        self._drafted = _Rates(n, 0.95, 1.0, shrink, forget)
        # a single verify size: assume scoring n tokens costs 1 + 0.15 (n - 1) passes (the
        # CPU F32 figure, 8 tokens ~ 2 passes) until a second size is measured
        self._verify = _CostModel(lambda n0, y0: 0.15 * y0 / (1.0 + 0.15 * (n0 - 1)))
        # a single draft size: proportional to tokens; only m = 0 seen: 0.3 ordinary passes
        self._model_drafted = False  # a draft model proposed a token (see `observe`)
        self._draft = _CostModel(lambda m0, y0: y0 / m0 if m0 > 0 else 0.3 * self.ordinary_token_s)
        self._n_spec = 0  # rounds that drafted at least one token
        self._catchup_s: float | None = None  # moving average, rounds that caught up
        self.change_p = change_p
        self.change_keep = change_keep
        self._streak, self._streak_dir = 1.0, 0  # see _detect_change
        self.decisions: list[Decision] = []
        self._pending: Decision | None = None
        self._since_spec = 0  # ordinary rounds since the last block was drafted
        self._gap = probe_every  # ordinary rounds before the next probe
        self._fail_gap = probe_every  # gap after the next failed probe
        self._retime = False  # see retime_draft
        self._last_timed = 0  # round of the last timed draft pass (hopeless draft)
        self._n_timed = 0  # timed draft passes observed
        self._baseline: Baseline | None = None  # see attach

    # -- estimates -------------------------------------------------------------------

    @property
    def alpha_by_pos(self) -> FloatArray:
        """(k_max,) float64: estimated P(x_i accepted | x_1..x_{i-1} accepted), i = 1..k_max."""
        return self._alpha.estimate()[: self.k_max]

    @property
    def drafted_by_pos(self) -> FloatArray:
        """(k_max,) float64: estimated P(drafter proposes x_i | it proposed x_{i-1} and was
        asked for >= i tokens). 1 for a drafter that never stops early."""
        return self._drafted.estimate()[: self.k_max]

    def verify_s(self, n_tokens: int) -> float:
        """Predicted seconds of the target's round for a batch of n_tokens (= K + 1)
        tokens: decode plus whatever else the loop reports as verify time. nan before data."""
        return self._verify(n_tokens)

    def draft_s(self, n_drafted: int) -> float:
        """Predicted seconds to draft a block that ends with n_drafted tokens. nan before data."""
        return self._draft(n_drafted)

    @property
    def draft_token_s(self) -> float:
        """Predicted seconds to draft one token (a block of one), nan before data."""
        return self._draft(1)

    @property
    def ordinary_token_s(self) -> float:
        """Seconds of one ordinary decoding pass: the verify cost model at n = 1 (measured
        directly on every K = 0 round, else extrapolated by the linear fit), or less when
        a larger batch was measured cheaper (scoring more tokens never costs less: the n = 1
        figure is then stale, say measured while the machine was busy, and K = 0 rounds,
        which would refresh it, are not chosen while it flatters speculation). nan before
        data."""
        if not self._verify:
            return math.nan
        costs = [self._verify(n) for n in {1, *self._verify.sizes}]
        b = self._baseline.token_s if self._baseline is not None else None
        if b is not None:  # the run's one baseline, which every K = 0 round refreshes
            costs = [b, *(self._verify(n) for n in self._verify.sizes if n > 1)]
        return min(costs)

    @property
    def hopeless(self) -> bool:
        """True when no block size can beat ordinary decoding, even at acceptance 1.

        A round of K costs draft_s(K) + verify_s(K + 1) >= draft_s(K) + ordinary_token_s
        (scoring more tokens never costs less) and emits at most K + 1 tokens, so when
        draft_s(K) >= K * ordinary_token_s for every K its rate is at most ordinary
        decoding's. The draft's cost per token is read at the block sizes actually
        measured (the cheapest per token of them), not extrapolated by the linear fit: a
        noisy fit through two sizes can predict a cheap long block that was never seen.
        False before both costs are measured.
        """
        if not self._verify or not self._draft:
            return False
        sizes = [m for m in self._draft.sizes if m > 0]
        if not sizes:
            return False
        per_token = min(self._draft(m) / m for m in sizes)
        return per_token >= self.ordinary_token_s

    def _rates(self, k_cap: int) -> FloatArray:
        """(k_cap + 1,) float64 predicted tokens/s for K = 0..k_cap (nan before data).

        For a block size K the number m of tokens actually drafted is random (early
        stop): P(m) = r_m (1 - s_{m+1}) for m < K and r_K for m = K, with r_m =
        prod_{j<=m} s_j. Expected cost = sum_m P(m) (draft_s(m) + verify_s(m + 1));
        expected tokens = 1 + sum_{i<=K} prod_{j<=i} s_j alpha_j.
        """
        out = np.full(k_cap + 1, math.nan)
        out[0] = 1.0 / self.ordinary_token_s if self._verify else math.nan
        if k_cap == 0 or not self._verify or not self._draft:
            return out
        s = self.drafted_by_pos[:k_cap]
        a = self.alpha_by_pos[:k_cap]
        tokens = 1.0 + np.cumsum(np.cumprod(s * a))  # (k_cap,) for K = 1..k_cap
        reach = np.concatenate([[1.0], np.cumprod(s)])  # r_0..r_{k_cap}
        m = np.arange(k_cap + 1)
        cost_m = np.array([self._draft(i) + self._verify(i + 1) for i in m])
        stop_here = reach[:-1] * (1.0 - s) * cost_m[:-1]  # m = 0..k_cap-1 and stopped
        cost = np.cumsum(stop_here) + reach[1:] * cost_m[1:]  # for K = 1..k_cap
        out[1:] = tokens / cost
        return out

    def predicted_tokens_per_s(self, k: int) -> float:
        """Expected tokens/s of block size k (0 = ordinary decoding) under the current
        estimates; nan before the costs involved have been measured."""
        return float(self._rates(min(k, self.k_max))[min(k, self.k_max)])

    # -- decisions -------------------------------------------------------------------

    def choose_k(self, max_k: int) -> int:
        """Block size for the next round.

        Args:
            max_k: the largest block this round may use. A round emits up to K + 1
                tokens, so the loop passes min(tokens still allowed - 1, context room);
                0 (one token left) forces K = 0.

        Returns:
            K in [0, min(k_max, max_k)]; 0 means an ordinary decoding pass.
        """
        cap = max(0, min(self.k_max, max_k))
        i = len(self.decisions)
        self._retime = False
        k: int
        reason: Reason
        if self.fixed_k is not None:
            k, reason = min(self.fixed_k, cap), "fixed"
        elif cap == 0:
            k, reason = 0, "limit"
        elif not self._verify:
            k, reason = 0, "warmup"  # measure ordinary decoding first: the baseline
        elif self.hopeless:
            # acceptance cannot help: no probes, only a timed draft pass now and then
            k, reason = 0, "fallback"
            if i - self._last_timed >= self._retime_gap():
                self._retime, self._last_timed = True, i
        elif self._n_spec < self.warmup_rounds:
            rates = self._rates(cap)[1:]
            best = int(np.nanargmax(rates)) + 1 if np.isfinite(rates).any() else self.k_init
            k, reason = min(best, cap), "warmup"
            if self._draft:  # a probe's cost is known: a fallback after warm-up starts there
                self._gap = self._fail_gap = max(self.probe_every, self._gap_cap() // 4)
        else:
            rates = self._rates(cap)
            best = int(np.nanargmax(rates)) if np.isfinite(rates).any() else 0
            if best > 0:
                k, reason = best, "model"
                self._gap = self._fail_gap = max(self.probe_every, self._gap_cap() // 4)
            elif self._since_spec + 1 >= self._gap:
                k, reason = min(self.probe_k, cap), "probe"
            else:
                k, reason = 0, "fallback"
        pred = self.predicted_tokens_per_s(k) if self._verify else math.nan
        self._pending = Decision(i, k, reason, pred)
        self.decisions.append(self._pending)
        return k

    def retime_draft(self) -> bool:
        """Whether the loop should time one draft pass during the round just chosen (a
        K = 0 round) and report it with `observe_draft_pass`: a hopeless draft's costs
        are re-measured this way instead of by probes (see the module docstring). The
        pass is timed where the draft's cache stands, without catching up: only its
        cost matters, and the pass is rolled back."""
        return self._retime

    def bonus(self) -> bool:
        """Whether the round just chosen scores the bonus position (see
        `specgen.generate.KPolicy.bonus`): every round but a probe, unless `probe_bonus`.
        A probe exists to test the draft, and the bonus row would cost an extra verify
        row for one token that an ordinary pass gives anyway."""
        d = self._pending
        return self.probe_bonus or d is None or d.reason != "probe"

    def observe(
        self,
        k: int,
        n_accepted: int,
        draft_s: float,
        verify_s: float,
        n_proposed: int | None = None,
        catchup_s: float = 0.0,
        n_lookup: int = 0,
    ) -> None:
        """Record the outcome of a round.

        Args:
            k: the block size asked for (what `choose_k` returned).
            n_accepted: accepted draft tokens, 0..n_proposed (count them all, even past an
                end-of-generation token: this measures the draft, not the output).
            draft_s: seconds spent drafting (0 for K = 0).
            verify_s: seconds of the rest of the round: the target's batched decode of
                n_drafted + 1 tokens plus the sampling, acceptance and rollback around it
                (all of it grows with the block, so all of it belongs in the cost).
            n_proposed: tokens actually proposed (< k when the drafter stopped early or
                found nothing); None means k. Positions not drafted are not rejections.
            catchup_s: seconds the drafter spent first evaluating the tokens committed
                while it was idle (after ordinary rounds), not included in draft_s: a
                cost of probing, not of drafting per token (see `_gap_cap`).
            n_lookup: of the n_drafted tokens, those proposed by prompt lookup (hybrid
                drafting): they cost microseconds, not a draft pass, so once a draft
                model has drafted, its cost per token is fitted on its own tokens alone
                and blocks of lookup tokens only leave the fit alone (a drafter that is
                lookup alone, `--draft ngram`, is fitted on its tokens as before).

        A call with k = 0 and no preceding `choose_k` is allowed: it feeds a separately
        timed ordinary pass into the cost model.
        """
        m = k if n_proposed is None else max(0, min(n_proposed, k))
        n = max(0, min(n_accepted, m))
        self._verify.add(max(m, 1) if not self.bonus() else m + 1, verify_s)
        if k > 0:
            n_model = max(0, m - n_lookup)
            self._model_drafted = self._model_drafted or n_model > 0
            if n_model > 0:
                self._draft.add(n_model, draft_s)
            elif not self._model_drafted:
                self._draft.add(m, draft_s)
            if catchup_s > 0.0 and math.isfinite(catchup_s):
                c = self._catchup_s
                self._catchup_s = catchup_s if c is None else c + 0.25 * (catchup_s - c)
            # the drafter tried positions 1..min(m+1, k) and continued past the first m
            self._drafted.update(min(m + 1, k), m)
        if m > 0:
            self._detect_change(n, m)
            # positions 1..n accepted, n+1 (if drafted) rejected, later ones never tested
            self._alpha.update(min(n + 1, m), n)
        d, self._pending = self._pending, None
        if d is None:
            return
        if k == 0:
            self._since_spec += 1
            return
        self._since_spec = 0
        self._last_timed = d.round
        self._n_spec += m > 0
        if d.reason == "probe":
            if m > 0 and n == m:  # fully accepted: look again next round
                self._gap, self._fail_gap = 1, max(self.probe_every, self._gap_cap() // 4)
            elif m > 0:
                self._gap = self._fail_gap
                self._fail_gap = min(2 * self._fail_gap, self._gap_cap())
            # m == 0: the drafter had nothing to offer; keep the gap as it was

    def observe_draft_pass(self, draft_s: float) -> None:
        """Record a timed single-token draft pass that drafted nothing: after the prompt,
        before the first round (the loop times it as it times the ordinary pass), and
        whenever `retime_draft` asks. The draft's cost is then known before the first
        round, so a draft slower than its target (`hopeless`) costs no speculative round
        at all, and the first block size follows the cost model instead of `k_init`.

        Args:
            draft_s: seconds of one draft pass of one token.
        """
        self._draft.add(1, draft_s)
        self._n_timed += 1

    def _detect_change(self, n: int, m: int) -> None:
        """Discount the acceptance evidence when recent rounds are too unlikely under it.

        Forgetting alone is slow to notice that the text changed (say, from copying to
        free writing): the counts of a long run of accepted blocks take many rejections
        to outweigh, and all that time the controller drafts long blocks in vain. Each
        round's accepted length N is scored by its tail probability under the current
        estimates, P(N <= n) or P(N >= n) (whichever is smaller). A round whose tail is
        below 0.1 is surprising; when the product of the tails of a run of consecutive
        surprising rounds (same direction) falls below `change_p`, that is taken as a
        change and only `change_keep` of the evidence is kept. With alpha = 0.95 -> 0.02
        that is three rounds; on stationary acceptance it fires rarely (each false alarm
        only weakens the estimates for a few rounds).
        """
        reach = np.cumprod(self._alpha.estimate()[:m])  # P(N >= j), j = 1..m
        upper = float(reach[n - 1]) if n > 0 else 1.0  # P(N >= n)
        lower = 1.0 - float(reach[n]) if n < m else 1.0  # P(N <= n)
        direction, tail = (-1, lower) if lower < upper else (1, upper)
        if tail >= _SURPRISING:
            self._streak, self._streak_dir = 1.0, 0
            return
        if direction != self._streak_dir:
            self._streak, self._streak_dir = 1.0, direction
        self._streak *= tail
        if self._streak < self.change_p:
            self._alpha.discount(self.change_keep)
            self._streak, self._streak_dir = 1.0, 0

    def _gap_cap(self) -> int:
        """Largest probe gap: probe_every_max, or sooner when failed probes are cheap.

        A failed probe of block k emits one token in catch-up + draft_s(k) + verify_s(rows)
        seconds (the drafter first evaluates the tokens of the ordinary rounds before it;
        rows = k, or k + 1 with `probe_bonus`),
        where ordinary decoding would emit (that time) / ordinary_token_s tokens: the loss
        is that ratio minus 1, in ordinary passes. A gap of loss / probe_budget passes
        keeps the loss at probe_budget of the fallback time.
        """
        k = self.probe_k
        rows = k + 1 if self.probe_bonus else k
        probe_s = (self._catchup_s or 0.0) + self.draft_s(k) + self.verify_s(rows)
        ratio = probe_s / self.ordinary_token_s
        if not math.isfinite(ratio):
            return self.probe_every_max
        by_cost = math.ceil(max(ratio - 1.0, 0.0) / self.probe_budget)
        return max(self.probe_every, min(by_cost, self.probe_every_max))

    def _retime_gap(self) -> int:
        """Rounds between two timed draft passes of a hopeless draft: each costs
        draft_s(1) / ordinary_token_s ordinary passes, kept within `probe_budget` of the
        time, up to `_RETIME_GAP` * probe_every_max rounds."""
        longest = _RETIME_GAP * self.probe_every_max
        loss = self.draft_s(1) / self.ordinary_token_s
        if not math.isfinite(loss):
            return longest
        return max(self.probe_every, min(math.ceil(loss / self.probe_budget), longest))

    # -- stats -----------------------------------------------------------------------

    @property
    def k_history(self) -> list[int]:
        """Block size chosen each round, in order."""
        return [d.k for d in self.decisions]

    @property
    def fallback_episodes(self) -> list[tuple[int, int]]:
        """(start_round, end_round) of each run of fallback rounds (probes inside count as
        part of it), end exclusive; an episode still going ends at the current round count."""
        episodes: list[tuple[int, int]] = []
        start: int | None = None
        for d in self.decisions:
            if d.reason == "fallback" and start is None:
                start = d.round
            elif d.reason not in ("fallback", "probe") and start is not None:
                episodes.append((start, d.round))
                start = None
        if start is not None:
            episodes.append((start, len(self.decisions)))
        return episodes

    def attach(self, baseline: Baseline) -> None:
        """Read the run's ordinary-decoding baseline (`specgen.round.Sequence` owns it)
        instead of this model's own n = 1 cost: one estimate for the view, the summary and
        the choice of K (a fit through a busy first round would keep a stale figure)."""
        self._baseline = baseline

    @property
    def measures_draft(self) -> bool:
        """True: the draft's cost is timed after the prompt, before the first choice."""
        return True

    def summary(self) -> dict[str, object]:
        """JSON-ready state for the stats output (seconds; None before a cost is measured)."""

        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "k_history": self.k_history,
            "fallback_episodes": [list(e) for e in self.fallback_episodes],
            "alpha_by_pos": [round(float(x), 4) for x in self.alpha_by_pos],
            "drafted_by_pos": [round(float(x), 4) for x in self.drafted_by_pos],
            "ordinary_token_s": num(self.ordinary_token_s),
            "draft_token_s": num(self.draft_token_s),
            "catchup_s": self._catchup_s,
            "hopeless": self.hopeless,
            "draft_passes_timed": self._n_timed,
            "verify_s_by_n": {n: num(self.verify_s(n)) for n in range(1, self.k_max + 2)},
        }
