"""The online cost model that picks the block size K before each round (`--draft-max auto`).

Speculation pays only when the tokens a round is expected to emit outweigh what the
round costs. Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative
Decoding", section 3.4, eq. (1) and Theorem 3.8) give the expected number of tokens of a
round with block K under a constant acceptance rate alpha, E = (1 - alpha^(K+1)) /
(1 - alpha); the speedup is E divided by the round's cost in ordinary-decoding passes.
This module's `Controller` measures every term online instead of assuming it: acceptance
by block position and the probability that the drafter proposes it at all
(`specgen.control.acceptance.Rates`), the draft's and the verify's costs by size
(`specgen.control.costs.CostModel`), the tokens per second they predict
(`specgen.control.goodput.round_rates`).

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

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from specgen.control.acceptance import ChangeDetector, FloatArray, Rates
from specgen.control.costs import CostModel
from specgen.control.goodput import round_rates
from specgen.measure import Baseline

# a hopeless draft is re-timed at most this many times more rarely than probe_every_max
_RETIME_GAP = 4

Reason = Literal["warmup", "model", "fallback", "probe", "fixed", "limit"]


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
            estimates return to the pooled rate within a few rounds (see `Rates`).
        prior_alpha, prior_strength: optimistic Beta prior of the pooled acceptance rate
            (mean, pseudo-count); evidence outweighs it after a round or two.
        shrink: pseudo-count pulling each position's rate toward the pooled rate.
        change_p, change_keep: change detection on the acceptance (see
            `specgen.control.acceptance.ChangeDetector`);
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
        self._alpha = Rates(n, prior_alpha, prior_strength, shrink, forget, forget_untested)
        # drafted-at-all rates: prior "the drafter proposes every position it is asked for"
        self._drafted = Rates(n, 0.95, 1.0, shrink, forget)
        # a single verify size: assume scoring n tokens costs 1 + 0.15 (n - 1) passes (the
        # CPU F32 figure, 8 tokens ~ 2 passes) until a second size is measured
        self._verify = CostModel(lambda n0, y0: 0.15 * y0 / (1.0 + 0.15 * (n0 - 1)))
        # a single draft size: proportional to tokens; only m = 0 seen: 0.3 ordinary passes
        self._model_drafted = False  # a draft model proposed a token (see `observe`)
        self._draft = CostModel(lambda m0, y0: y0 / m0 if m0 > 0 else 0.3 * self.ordinary_token_s)
        self._n_spec = 0  # rounds that drafted at least one token
        self._catchup_s: float | None = None  # moving average, rounds that caught up
        self._change = ChangeDetector(change_p, change_keep)
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
        """(k_cap + 1,) float64 predicted tokens/s for K = 0..k_cap (`round_rates`)."""
        alpha, drafted = self.alpha_by_pos, self.drafted_by_pos
        return round_rates(k_cap, self.ordinary_token_s, alpha, drafted, self._draft, self._verify)

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
            self._change.observe(self._alpha, n, m)
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
