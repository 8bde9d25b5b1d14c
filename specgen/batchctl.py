"""The batch controller: K per slot each step, for the most tokens per second over the batch.

With several requests in one target decode, a slot's block costs more than its own rows:
every drafted depth is a draft decode all slots wait for, and every row is a row of the
one target pass everyone shares. So K is chosen for the whole batch at once, maximizing
goodput (SmartSpec, Liu et al. 2024, arXiv 2406.14066): expected tokens emitted by the
step over the step's predicted seconds,

    G(K_1..K_N) = sum_i E_i(K_i) / (T(sum_i (K_i + 1)) + sum_{j=1..D} S(n_j) + fixed_s)

with E_i the expected tokens of slot i's round (`controller.expected_tokens` over its
acceptance by position), T the target's seconds for a decode of that many rows, S the
draft's seconds for one depth drafted by n slots, D = max K_i and n_j the slots with
K_i >= j. K = 0 everywhere (ordinary batched decoding) is always a candidate, so
speculation is used only when it is predicted to pay; acceptance alone cannot decide it
(at high load the rows speculation adds compete with other requests' rows).

T and S are straight lines fitted by least squares to the decodes the server actually
makes (`LineFit`). With linear costs the step's cost is a + b * rows + c0 * D + c1 * sum K,
so for a given ratio lambda the numerator minus lambda times the cost separates per slot
once D is fixed: `choose` solves the ratio exactly by Dinkelbach's method over D.

Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specgen.controller import expected_tokens


@dataclass(frozen=True)
class Line:
    """seconds = intercept_s + slope_s * x (x = rows of a target decode, or slots drafting
    one depth)."""

    intercept_s: float
    slope_s: float

    def __call__(self, x: float) -> float:
        return self.intercept_s + self.slope_s * x


class LineFit:
    """Least-squares line through the last `window` (x, seconds) observations.

    Until two distinct x have been seen the prior is returned, with its intercept moved so
    that the line passes through the mean of what was seen (one measured size fixes the
    level; the slope stays the prior's). Both coefficients are kept >= 0: a decode never
    gets cheaper with more rows.
    """

    def __init__(self, prior: Line, window: int = 256) -> None:
        self.prior = prior
        self.window = window
        self._x: list[float] = []
        self._y: list[float] = []

    def add(self, x: float, seconds: float) -> None:
        self._x.append(float(x))
        self._y.append(float(seconds))
        if len(self._x) > self.window:
            del self._x[0], self._y[0]

    @property
    def n(self) -> int:
        return len(self._x)

    def line(self) -> Line:
        if not self._x:
            return self.prior
        x, y = np.asarray(self._x), np.asarray(self._y)
        if np.ptp(x) == 0:
            slope = self.prior.slope_s
            return Line(max(0.0, float(y.mean() - slope * x.mean())), slope)
        slope, intercept = np.polyfit(x, y, 1)
        slope = max(0.0, float(slope))
        if slope == 0.0:
            intercept = float(y.mean())
        return Line(max(0.0, float(intercept)), slope)


@dataclass(frozen=True)
class SlotInput:
    """One active slot as the controller sees it.

    Attributes:
        alpha_by_pos: alpha_1, alpha_2, ...: estimated probability that block position i
            is accepted given 1..i-1 were (the last value repeats; empty = 0).
        k_max: largest K allowed (room left, -n, --draft-max; 0 = no drafter).
    """

    alpha_by_pos: tuple[float, ...]
    k_max: int


@dataclass(frozen=True)
class Choice:
    """What `choose` decided for one step.

    Attributes:
        k: K per slot, in the order given.
        expected_tokens: sum of the slots' expected tokens at those K.
        step_s: predicted seconds of the step.
        goodput: expected_tokens / step_s, tokens per second.
        goodput_ordinary: the same with K = 0 for every slot.
    """

    k: tuple[int, ...]
    expected_tokens: float
    step_s: float
    goodput: float
    goodput_ordinary: float


def step_seconds(ks: Sequence[int], target: Line, draft: Line, fixed_s: float = 0.0) -> float:
    """Predicted seconds of a step whose slots use block sizes `ks` (bonus rows scored)."""
    rows = sum(k + 1 for k in ks)
    depth = max(ks, default=0)
    drafting = sum(draft(sum(1 for k in ks if k >= j)) for j in range(1, depth + 1))
    return target(rows) + drafting + fixed_s


def choose(slots: Sequence[SlotInput], target: Line, draft: Line, fixed_s: float = 0.0) -> Choice:
    """The K per slot that maximizes predicted goodput for one step (exact for linear
    costs; ties go to the smaller K).

    Args:
        slots: the active slots.
        target: seconds of one target decode as a function of its rows.
        draft: seconds of one draft depth as a function of the slots drafting it.
        fixed_s: seconds the step costs whatever K is (host work, prompt chunks).

    Returns:
        The Choice; k is () for no slots.
    """
    if not slots:
        return Choice((), 0.0, 0.0, 0.0, 0.0)
    gains = [
        np.array([expected_tokens(s.alpha_by_pos, k) for k in range(max(0, s.k_max) + 1)])
        for s in slots
    ]
    zero = tuple(0 for _ in slots)

    def value(ks: tuple[int, ...]) -> tuple[float, float]:
        tokens = float(sum(g[k] for g, k in zip(gains, ks, strict=True)))
        return tokens, step_seconds(ks, target, draft, fixed_s)

    n0, c0 = value(zero)
    best, best_n, best_c = zero, n0, c0
    per_k = target.slope_s + draft.slope_s  # each proposal: one more row, one more draft slot
    depth_max = max(len(g) - 1 for g in gains)
    for _ in range(64):  # Dinkelbach: finitely many K vectors, strictly rising ratio
        lam = best_n / best_c if best_c > 0 else 0.0
        cand, cand_obj = best, best_n - lam * best_c
        for depth in range(1, depth_max + 1):
            ks = []
            for g in gains:
                cap = min(depth, len(g) - 1)
                ks.append(int(np.argmax(g[: cap + 1] - lam * per_k * np.arange(cap + 1))))
            n, c = value(tuple(ks))
            if n - lam * c > cand_obj + 1e-12:
                cand, cand_obj = tuple(ks), n - lam * c
        if cand == best:
            break
        best = cand
        best_n, best_c = value(best)
    return Choice(
        best,
        best_n,
        best_c,
        best_n / best_c if best_c > 0 else 0.0,
        n0 / c0 if c0 > 0 else 0.0,
    )


class Acceptance:
    """One request's acceptance by block position, as counts shrunk toward the position
    before it.

    alpha_1 = (hits_1 + w * prior) / (tested_1 + w) and alpha_i = (hits_i + w * alpha_{i-1})
    / (tested_i + w): position i is tested in a round when positions 1..i-1 were accepted;
    a round with n accepted of K tested positions 1..n+1 (1..K when all were accepted).
    A position never tested takes the estimate of the one before it, not the pooled prior:
    a request served at K = 1 whose every x_1 is accepted must be able to grow its K (with
    the prior at each deeper position, K stayed 1 for a whole request).
    """

    def __init__(self, prior: float, weight: float = 2.0, depth: int = 32) -> None:
        self.prior = prior
        self.weight = weight
        self.tested = np.zeros(depth)
        self.hits = np.zeros(depth)

    def update(self, k: int, n_accepted: int) -> None:
        k = min(k, self.tested.size)
        n = min(n_accepted, k)
        self.tested[: min(n + 1, k)] += 1
        self.hits[:n] += 1

    def alpha_by_pos(self, k: int) -> tuple[float, ...]:
        k = min(max(k, 1), self.tested.size)
        out, prev = [], self.prior
        for hits, tested in zip(self.hits[:k], self.tested[:k], strict=True):
            prev = float((hits + self.weight * prev) / (tested + self.weight))
            out.append(prev)
        return tuple(out)


class BatchController:
    """Fits the costs from the decodes the server makes, keeps the pooled acceptance rate
    (each new request's prior), and chooses K per slot (`choose`).

    Args:
        k_max: --draft-max's ceiling for auto (per slot, before room caps it).
        target_prior, draft_prior: the cost lines used before measurements exist.
        probe_every: a slot that could draft but got K = 0 for this many of its steps
            gets K = 1 once, so a low estimate can recover (0 = never).
        draft_batched: one draft decode per depth serves every slot (fit S(n) = c0 +
            c1 n from `observe_draft`); False when each slot drafts in its own decodes,
            so a depth drafted by n slots costs n single-slot passes (S(n) = S(1) n).
    """

    def __init__(
        self,
        k_max: int = 16,
        target_prior: Line = Line(0.040, 0.005),
        draft_prior: Line = Line(0.0, 0.020),
        probe_every: int = 32,
        draft_batched: bool = False,
    ) -> None:
        self.draft_batched = draft_batched
        self.k_max = k_max
        self.target = LineFit(target_prior)
        self.draft = LineFit(draft_prior)
        self.probe_every = probe_every
        self._tested = 0.0
        self._hits = 0.0

    def observe_target(self, rows: int, seconds: float) -> None:
        """A target decode of `rows` scored rows (and no prompt chunk) took `seconds`."""
        self.target.add(rows, seconds)

    def observe_draft(self, n_slots: int, seconds: float) -> None:
        """One draft depth for `n_slots` slots took `seconds`."""
        self.draft.add(n_slots, seconds)

    def draft_line(self) -> Line:
        """Seconds of one draft depth as a function of the slots drafting it."""
        line = self.draft.line()
        return line if self.draft_batched else Line(0.0, line(1))

    def observe_round(self, acceptance: Acceptance, k: int, n_accepted: int) -> None:
        """A slot's round: its own estimate and the pooled one."""
        if k <= 0:
            return
        acceptance.update(k, n_accepted)
        self._tested += min(n_accepted + 1, k)
        self._hits += min(n_accepted, k)

    def new_acceptance(self) -> Acceptance:
        """A fresh estimate for a new request, its prior the pooled rate so far (0.5 with
        no evidence; shrunk toward 0.5 while evidence is thin)."""
        prior = (self._hits + 1.0) / (self._tested + 2.0)
        return Acceptance(prior)

    def choose(
        self,
        acceptances: Sequence[Acceptance],
        k_caps: Sequence[int],
        idle_steps: Sequence[int] = (),
        fixed_s: float = 0.0,
    ) -> Choice:
        """K per slot for this step.

        Args:
            acceptances: each active slot's estimate.
            k_caps: each slot's room (0 for a slot without a drafter).
            idle_steps: steps since each slot last speculated (for probing).
            fixed_s: seconds the step costs whatever K is.
        """
        caps = [max(0, min(self.k_max, c)) for c in k_caps]
        slots = [SlotInput(a.alpha_by_pos(c), c) for a, c in zip(acceptances, caps, strict=True)]
        t, c = self.target.line(), self.draft_line()
        got = choose(slots, t, c, fixed_s)
        if not self.probe_every or not idle_steps:
            return got
        ks = tuple(
            1 if k == 0 and cap > 0 and idle >= self.probe_every else k
            for k, cap, idle in zip(got.k, caps, idle_steps, strict=True)
        )
        if ks == got.k:
            return got
        n = sum(expected_tokens(s.alpha_by_pos, k) for s, k in zip(slots, ks, strict=True))
        sec = step_seconds(ks, t, c, fixed_s)
        return Choice(ks, n, sec, n / sec if sec > 0 else 0.0, got.goodput_ordinary)
