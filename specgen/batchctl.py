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

T and S are fitted by least squares to the decodes the server actually makes: T a line
over the rows of each target decode (`LineFit`), S over the logits rows of each draft
decode and, apart, its tokens without a row (`DraftFit`: on a CPU a draft row costs
several times a token), so a depth drafted by n slots costs S(n) = c0 + c_row n. A slot
whose draft cache fell behind (it did not speculate for a while: the committed tokens of
those steps were never drafted) first evaluates the missing tokens in its first depth:
c_tok more seconds per token. That
catch-up is paid once and serves every later round of the request, so a step is charged
the share of it that one round is of the rounds the request has left at that K
(E_i(K) / tokens left); charging it whole to one round would keep a slot that stopped
speculating under load from ever starting again.

With linear costs the step's cost is a + b * rows + c0 * D + c_row * sum K (plus the
catch-up shares), so for a given ratio lambda the numerator minus lambda times the cost
separates per slot once D is fixed: `choose` solves the ratio exactly by Dinkelbach's
method over D, all D at once in numpy (the server calls it every step).

Pure: numpy only.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from specgen.controller import expected_gains

_RESIDUAL_WINDOW = 32  # steps in each of `BatchController.observe_step`'s medians
_FORGET_EVERY = 4  # steps without speculation that forget one speculating step's residual
_POOLS = 64  # sampling settings whose pooled acceptance `BatchController` keeps
_RUN_WINDOW = 64  # recent runs of speculative rounds `BatchController.run_rounds` averages
_RUN_MIN = 4  # runs seen before their mean bounds the catch-up share
_MIN_PER_SIZE = 3  # decodes of a size before `LineFit` fits on it (once two sizes have them)


_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


def recent_entry(
    entries: collections.OrderedDict[_K, _V], key: _K, make: Callable[[], _V], cap: int
) -> _V:
    """entries[key], made by `make` when absent, marked the most recently used (last); the
    least recently used beyond `cap` entries are dropped (the per-sampling-setting pools
    of `BatchController` and of the server's prompt lookup)."""
    if key not in entries:
        entries[key] = make()
    entries.move_to_end(key)
    while len(entries) > cap:
        entries.popitem(last=False)
    return entries[key]


@dataclass(frozen=True)
class Line:
    """seconds = intercept_s + slope_s * x (x = rows of a target decode, or slots drafting
    one depth)."""

    intercept_s: float
    slope_s: float

    def __call__(self, x: float) -> float:
        return self.intercept_s + self.slope_s * x


class LineFit:
    """Least-squares line through one point per decode size x: the median seconds of that
    size's last `per_size` observations, every size weighing the same; a size seen fewer
    than `_MIN_PER_SIZE` times is left out while two sizes have been seen that often.

    By size, not one window of the latest decodes: a server that speculates makes its
    decodes at a few large sizes (four slots at K = 8: 36 rows), and the target's cost is
    concave in rows, so a line fitted there alone extrapolates badly to the ordinary size
    (one row per slot), the one K = 0 is judged by. Measured on the demo pair at four
    sampled streams (model drafting, prompt lookup off): 132 ms + 3.4 ms a row, where a
    four-row decode took 65 ms; every choice then favoured speculation, which measured
    0.60x ordinary batched decoding (`--draft none`), 0.79x at eight streams. A size seen
    rarely (the ordinary one, a ramp with fewer slots) keeps its last measurements until
    newer ones of that size replace them, and weighs as much as the size the server makes
    all the time. Medians, and sizes seen a few times only, because one far size carries
    much weight in a line: a single 68-row decode of 868 ms (a steady one took about 400)
    alone had made a server's line 12 ms + 12.4 ms a row.

    Until two distinct x have been seen the prior's slope is kept and the line is moved to
    pass through the mean of what was seen (one measured size fixes the level); where that
    would need a negative intercept (the prior's slope is steeper than the measured point
    allows), the line goes through the origin and that point instead. Both coefficients are
    kept >= 0 (a decode never gets cheaper with more rows), as the least-squares line under
    those bounds: a bound that binds is fitted on (intercept 0: slope sum(xy)/sum(x^2);
    slope 0: intercept mean(y)), never clamped after the fit, which would lift the whole
    line above every point measured. (Clamped, a one-stream server whose draft prior came
    out 0 ms + 40 ms a token kept predicting 40 ms per token while its re-times, all of one
    token, measured 22 ms: speculation never paid, and nothing could correct it.)
    """

    def __init__(self, prior: Line, per_size: int = 32) -> None:
        self.prior = prior
        self.per_size = per_size
        self._bins: dict[float, collections.deque[float]] = {}
        self._line: Line | None = None  # the fit, until the next `add`

    def set_prior(self, prior: Line) -> None:
        """Replace the prior (what `line` gives until two distinct x have been seen)."""
        self.prior = prior
        self._line = None

    def add(self, x: float, seconds: float) -> None:
        size = float(x)
        if size not in self._bins:
            self._bins[size] = collections.deque(maxlen=self.per_size)
        self._bins[size].append(float(seconds))
        self._line = None

    @property
    def n(self) -> int:
        return sum(len(b) for b in self._bins.values())

    def line(self) -> Line:
        if self._line is None:
            self._line = self._fit()
        return self._line

    def _fit(self) -> Line:
        if not self._bins:
            return self.prior
        # one point per size: the sizes a server rarely makes weigh as much as those it
        # makes all the time, so the line stays true at both ends
        sizes = [x for x, b in self._bins.items() if len(b) >= _MIN_PER_SIZE]
        if len(sizes) < 2:
            sizes = list(self._bins)
        x = np.asarray(sizes, dtype=np.float64)
        y = np.asarray([statistics.median(self._bins[size]) for size in sizes])
        if np.ptp(x) == 0:
            slope = self.prior.slope_s
            if x[0] > 0:
                slope = min(slope, max(0.0, float(y.mean() / x[0])))
            return Line(max(0.0, float(y.mean() - slope * x[0])), slope)
        slope, intercept = (float(c) for c in np.polyfit(x, y, 1))
        if slope < 0.0:
            return Line(max(0.0, float(y.mean())), 0.0)
        if intercept < 0.0:
            return Line(0.0, max(0.0, float(x @ y / (x @ x))))
        return Line(intercept, slope)


class DraftFit:
    """The draft's seconds per decode as c0 + c_row * rows + c_tok * (tokens - rows): a
    logits row (one per slot drafting a depth) and a token evaluated without one (a
    catch-up on committed tokens, lookup tokens the model's first decode takes in) cost
    apart. Measured on the demo draft (Gemma 3 270M Q4_K_M, 2 AMD EPYC cores): one token
    with its row 12.4 ms; four tokens of one sequence with one row 17.3 ms, with four rows
    39.9 ms; four slots' one token each 37.4 ms. A row costs about 9 ms (the 262,144-wide
    output layer), a token without one 1.4 ms: one line in the tokens, fitted mostly to
    catch-ups, came out 24 ms + 1.4 ms a token in a real server: a depth of four slots at
    three quarters of its cost, one of one slot at twice it.

    The fit is least squares over the last `window` decodes with each coefficient >= 0,
    plus a small ridge toward the prior (c0, c_row, c_tok): `_PRIOR_WEIGHT` *
    ||beta - prior||^2, seconds squared. It decides only what the decodes leave open (no
    catch-up seen yet: c_tok stays the prior's; one size of depth only: c0 + c_row is
    fitted, their split follows the prior), so the first real decodes replace the prior
    where they can, as `LineFit`'s do. Exact under the bounds: the penalized objective is
    strictly convex, and its minimum over the faces of the orthant is found by trying each
    set of coefficients held at 0 (eight).
    """

    def __init__(self, prior: Line, token_s: float | None = None, window: int = 256) -> None:
        self.window = window
        self._rows: list[float] = []
        self._extra: list[float] = []
        self._y: list[float] = []
        self._coef: tuple[float, float, float] | None = None
        self.set_prior(prior, token_s)

    def set_prior(self, prior: Line, token_s: float | None = None) -> None:
        """A depth of n slots at `prior`(n); a token without a row at `token_s` seconds
        (the prior's slope when None)."""
        tok = prior.slope_s if token_s is None else token_s
        self.prior = (prior.intercept_s, prior.slope_s, tok)
        self._coef = None

    def add(self, rows: int, tokens: int, seconds: float) -> None:
        self._rows.append(float(rows))
        self._extra.append(float(max(0, tokens - rows)))
        self._y.append(float(seconds))
        if len(self._y) > self.window:
            del self._rows[0], self._extra[0], self._y[0]
        self._coef = None

    @property
    def n(self) -> int:
        return len(self._y)

    def coef(self) -> tuple[float, float, float]:
        """(c0, c_row, c_tok), seconds."""
        if self._coef is None:
            self._coef = self._fit()
        return self._coef

    def line(self) -> Line:
        """Seconds of a depth drafted by n slots (n rows, n tokens): c0 + c_row n."""
        c0, c_row, _ = self.coef()
        return Line(c0, c_row)

    @property
    def token_s(self) -> float:
        """Seconds of one token evaluated without a logits row (c_tok)."""
        return self.coef()[2]

    def _fit(self) -> tuple[float, float, float]:
        if not self._y:
            return self.prior
        p = np.asarray(self.prior, dtype=np.float64)
        x = np.column_stack([np.ones(len(self._y)), self._rows, self._extra])
        y = np.asarray(self._y)
        gram, rhs = x.T @ x, x.T @ y
        best, best_obj = p.clip(0.0), np.inf
        for free in _FACES:
            beta = np.zeros(3)
            idx = list(free)
            if idx:
                beta[idx] = np.linalg.solve(
                    gram[np.ix_(idx, idx)] + _PRIOR_WEIGHT * np.eye(len(idx)),
                    rhs[idx] + _PRIOR_WEIGHT * p[idx],
                )
            if (beta < 0.0).any():
                continue
            obj = float(((x @ beta - y) ** 2).sum() + _PRIOR_WEIGHT * ((beta - p) ** 2).sum())
            if obj < best_obj:
                best, best_obj = beta, obj
        return float(best[0]), float(best[1]), float(best[2])


# DraftFit's ridge: a coefficient 10 ms off its prior costs as much as a 0.3 ms residual
_PRIOR_WEIGHT = 1e-3
# the sets of DraftFit's coefficients left free (the others held at 0), all first
_FACES = ((0, 1, 2), (0, 1), (0, 2), (1, 2), (0,), (1,), (2,), ())


@dataclass(frozen=True)
class SlotInput:
    """One active slot as the controller sees it.

    Attributes:
        alpha_by_pos: alpha_1, alpha_2, ...: estimated probability that block position i
            is accepted given 1..i-1 were (the last value repeats; empty = 0).
        k_max: largest K allowed (room left, -n, --draft-max; 0 = no drafter).
        catch_up: committed tokens the draft cache lacks beyond the one every first depth
            evaluates (0 when it is up to date); drafting first evaluates them.
        left: tokens the request may still emit (its share of the catch-up is E(K) / left
            per round); 0 = unknown: the whole catch-up is charged to this round.
        free: block positions a prompt-lookup match proposes (`HybridDrafter`): K <= free
            costs rows only, no draft decode; beyond, the model drafts K - free tokens,
            its first decode evaluating the free ones too (and any catch-up).
        run_rounds: speculative rounds a run of them lasts on average (learned:
            `BatchController.observe_run`); a catch-up serves no more rounds than that,
            so at least 1 / run_rounds of it is charged to one (0 = not known).
    """

    alpha_by_pos: tuple[float, ...]
    k_max: int
    catch_up: int = 0
    left: int = 0
    free: int = 0
    run_rounds: float = 0.0


@dataclass(frozen=True)
class Choice:
    """What `choose` decided for one step.

    Attributes:
        k: K per slot, in the order given.
        expected_tokens: sum of the slots' expected tokens at those K.
        step_s: predicted seconds of the step, catch-ups by their share (see the module).
        goodput: expected_tokens / step_s, tokens per second.
        goodput_ordinary: the same with K = 0 for every slot.
        reasons: why each slot got its K (`REASONS`); () where nobody said.
    """

    k: tuple[int, ...]
    expected_tokens: float
    step_s: float
    goodput: float
    goodput_ordinary: float
    reasons: tuple[str, ...] = ()


#: why a slot's K is what it is, in the per-request `speculative.k_reason_per_step` and
#: /metrics' `specgen_k_reason_total`: the batch's goodput alone ("goodput"); shortened for
#: the requests waiting behind the step ("waiting") or to keep a latency target
#: ("slo_ttft", "slo_tpot"); a K = 1 probe ("probe"); and, from the scheduler, a fixed
#: --draft-max ("fixed"), a request's first round, ordinary ("first"), a step spent on a
#: chunk of the draft's catch-up ("catch_up"), a block cut short by an arrival ("cut")
REASONS = (
    "goodput", "waiting", "slo_ttft", "slo_tpot", "probe", "fixed", "first", "catch_up", "cut",
)  # fmt: skip


def _with_reasons(choice: Choice, reasons: tuple[str, ...]) -> Choice:
    return Choice(
        choice.k,
        choice.expected_tokens,
        choice.step_s,
        choice.goodput,
        choice.goodput_ordinary,
        reasons,
    )


def _catch_up_share(slot: SlotInput, gains: np.ndarray) -> np.ndarray:
    """(K + 1,) the fraction of the slot's catch-up charged to one round at each K: one
    over the rounds it serves, those left in the request at that K (E(K) / tokens left)
    or, when fewer, those a run of speculative rounds lasts (`SlotInput.run_rounds`)."""
    share = np.ones_like(gains)
    if slot.left > 0:
        share = np.minimum(1.0, gains / slot.left)
    if slot.run_rounds > 0:
        share = np.maximum(share, min(1.0, 1.0 / slot.run_rounds))
    share[0] = 0.0  # K = 0 drafts nothing
    return share if slot.catch_up > 0 else np.zeros_like(gains)


def step_seconds(
    ks: Sequence[int],
    target: Line,
    draft: Line,
    fixed_s: float = 0.0,
    slots: Sequence[SlotInput] = (),
    spec_s: float = 0.0,
    token_s: float | None = None,
) -> float:
    """Predicted seconds of a step whose slots use block sizes `ks` (bonus rows scored);
    with `slots`, each drafting slot's catch-up by its share and its free positions (see
    `SlotInput`), `token_s` seconds a token (the draft line's slope when None); `spec_s`
    more when any K >= 1 (see `choose`)."""
    tok = draft.slope_s if token_s is None else token_s
    rows = sum(k + 1 for k in ks)
    free = [s.free for s in slots] + [0] * (len(ks) - len(slots))
    model = [max(0, k - f) for k, f in zip(ks, free, strict=True)]  # tokens the model drafts
    depth = max(model, default=0)
    drafting = sum(draft(sum(1 for m in model if m >= j)) for j in range(1, depth + 1))
    for s, k, m in zip(slots, ks, model, strict=False):
        if m > 0:
            share = _catch_up_share(s, expected_gains(s.alpha_by_pos, k))[k]
            drafting += tok * (s.catch_up * share + s.free)
    return target(rows) + drafting + fixed_s + (spec_s if any(ks) else 0.0)


def choose(
    slots: Sequence[SlotInput],
    target: Line,
    draft: Line,
    fixed_s: float = 0.0,
    spec_s: float = 0.0,
    token_s: float | None = None,
    weight: float = 1.0,
) -> Choice:
    """The K per slot that maximizes predicted goodput for one step (exact for linear
    costs; ties go to the smaller K).

    Args:
        slots: the active slots.
        target: seconds of one target decode as a function of its rows.
        draft: seconds of one draft decode as a function of its tokens (one per slot
            drafting a depth).
        fixed_s: seconds the step costs whatever K is (host work, prompt chunks).
        spec_s: seconds a step costs more when any slot speculates, beyond its rows and
            depths (host work the lines leave out: `BatchController.observe_step`). A
            constant for every depth D >= 1, so the search over D stays exact.
        token_s: seconds of a token the draft evaluates without a logits row (a catch-up,
            free positions: `DraftFit`); the draft line's slope when None.
        weight: what each second speculation adds to the step counts for, against the
            seconds of the ordinary step (1 + the requests waiting behind the step:
            `BatchController.choose`); still linear, so the solution stays exact.
            `Choice.step_s` and `goodput` are the unweighted figures.

    Returns:
        The Choice; k is () for no slots.
    """
    if not slots:
        return Choice((), 0.0, 0.0, 0.0, 0.0)
    n, m = len(slots), max(max(0, s.k_max) for s in slots)
    gains = np.full((n, m + 1), -np.inf)  # -inf beyond a slot's k_max: never chosen
    ks_all = np.arange(m + 1)
    free = np.array([max(0, s.free) for s in slots], dtype=np.int64)
    model = np.maximum(ks_all[None, :] - free[:, None], 0)  # (n, m + 1) tokens the model drafts
    # each K's own seconds beyond the rows: its model tokens, and where the model runs at
    # all, the free tokens its first decode evaluates and the catch-up's share
    tok = draft.slope_s if token_s is None else token_s
    own = draft.slope_s * model
    for i, s in enumerate(slots):
        g = expected_gains(s.alpha_by_pos, s.k_max)
        gains[i, : g.size] = g
        runs = model[i, : g.size] > 0
        own[i, : g.size] += runs * tok * (s.catch_up * _catch_up_share(s, g) + s.free)
    own += target.slope_s * ks_all  # each proposal: one more row
    base = target.intercept_s + target.slope_s * n + fixed_s  # every slot's one row
    rows_i = np.arange(n)

    def value(ks: np.ndarray, w: float = weight) -> tuple[np.ndarray, np.ndarray]:
        """tokens and (weighted) seconds of K vectors: ks (..., n) -> arrays (...)."""
        tokens = gains[rows_i, ks].sum(axis=-1)
        seconds = base + w * (
            own[rows_i, ks].sum(axis=-1)
            + draft.intercept_s * model[rows_i, ks].max(axis=-1)
            + spec_s * (ks.max(axis=-1) > 0)
        )
        return tokens, seconds

    zero = np.zeros(n, dtype=np.int64)
    n0, c0 = value(zero)
    best, best_n, best_c = zero, float(n0), float(c0)
    for _ in range(64):  # Dinkelbach: finitely many K vectors, strictly rising ratio
        lam = best_n / best_c if best_c > 0 else 0.0
        obj = gains - lam * weight * own
        # for every depth D at once: each slot's best K <= D + free (the first of equal
        # ones), the index of the last strict new maximum of obj[:, :D + free + 1]
        run = np.maximum.accumulate(obj, axis=1)
        new = np.ones_like(obj, dtype=bool)
        new[:, 1:] = obj[:, 1:] > run[:, :-1]
        best_upto = np.maximum.accumulate(np.where(new, ks_all, 0), axis=1)  # (n, m + 1)
        reach = np.minimum(ks_all[:, None] + free[None, :], m)  # (D, n)
        cand = best_upto[rows_i[None, :], reach]  # (D, n)
        t, c = value(cand)
        score = t - lam * c
        d = int(np.argmax(score))  # the smallest D among equals
        if score[d] <= best_n - lam * best_c + 1e-12 or np.array_equal(cand[d], best):
            break
        best = cand[d]
        best_n, best_c = float(t[d]), float(c[d])
    best_c = float(value(best, 1.0)[1])
    return Choice(
        tuple(int(k) for k in best),
        best_n,
        best_c,
        best_n / best_c if best_c > 0 else 0.0,
        float(n0 / c0) if c0 > 0 else 0.0,
    )


class Acceptance:
    """One request's acceptance by block position, as counts shrunk toward the position
    before it.

    alpha_1 = (hits_1 + w * prior) / (tested_1 + w) and alpha_i = (hits_i + w * alpha_{i-1})
    / (tested_i + w): position i is tested in a round when positions 1..i-1 were accepted;
    a round with n accepted of K tested positions 1..n+1 (1..K when all were accepted).
    A position never tested takes the estimate of the one before it, not the pooled prior:
    a request served at K = 1 whose every x_1 is accepted must be able to grow its K (with
    the prior at each deeper position, K stayed 1 for a whole request). `pool` names the
    pooled rate its rounds add to (`BatchController.new_acceptance`).
    """

    def __init__(
        self, prior: float, weight: float = 2.0, depth: int = 32, pool: Hashable = None
    ) -> None:
        self.prior = prior
        self.pool = pool
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


@dataclass(frozen=True)
class SlotState:
    """What the scheduler knows of one active slot each step.

    Attributes:
        acceptance: the request's estimate.
        k_cap: its room (-n, context, --draft-max); 0 for a slot without a drafter.
        idle_steps: steps since it last speculated (for probing).
        catch_up: committed tokens its draft cache lacks beyond the one the first depth
            always evaluates (`SlotInput.catch_up`).
        left: tokens it may still emit (0 = unknown).
        first: the request's first step that may speculate (the server makes its first
            step ordinary, `specgen.server.scheduler`).
        free: positions a prompt-lookup match proposes this step (`SlotInput.free`).
        free_alpha: the estimated acceptance rate of each of those lookup tokens
            (`HybridDrafter.lookup_offer`), which replaces the request's estimate at
            positions 1..free; None: the request's estimate there too.
    """

    acceptance: Acceptance
    k_cap: int
    idle_steps: int = 0
    catch_up: int = 0
    left: int = 0
    first: bool = False
    free: int = 0
    free_alpha: float | None = None


class BatchController:
    """Fits the costs from the decodes the server makes, keeps the pooled acceptance rate
    (each new request's prior), and chooses K per slot (`choose`).

    A request's first step that may speculate (the server's second for it: its first is
    ordinary) is a K = 1 probe at least when its draft cache already holds
    its prompt (a prefix kept from an earlier request: the probe then costs one draft token
    and one row): it measures the costs at sizes that ordinary steps never show, and gives
    the request's own acceptance a first test. Otherwise the prompt is the draft's
    catch-up, charged by its share like any other: the server prefills a draft only once
    a slot is chosen to speculate, and a forced probe would buy a whole draft prefill per
    request (at 4 sampled streams on a CPU, about a tenth of the run).

    After that, a slot held at K = 0 is probed with K = 1 now and then, so a low acceptance
    estimate can recover, but only while a probe costs at most `probe_budget` of the time
    the slot spent idle: a probe first makes the draft catch up on every token the slot
    committed while idle (c_tok seconds each), so where the draft is slow against the steps (a
    CPU under load, where catch-up grows faster per step than the budget does) there are no
    such probes at all. Before this rule, probes every 32 steps at 4 sampled streams cost
    16% of the time.

    Latency (issue 37): goodput alone prices nothing for the requests waiting behind a
    step, nor for a slot's gap between two chunks, and a step of eight draft depths and a
    36-row decode is several hundred milliseconds on two CPU cores. So:

    - Waiting requests: with W requests waiting for their first token behind the step
      (prompts being prefilled: their first token comes after this step's decode at the
      earliest), every second that speculation adds to the step (rows beyond one per slot,
      draft depths, catch-up shares, the speculative overhead) is counted 1 + W times: once
      for the batch, once for each of them, who gain no token by it. Still linear, so the
      choice stays exact (`choose`'s weight); it shortens the step, and no probe is made
      while anyone waits. SmartSpec (Liu et al. 2024) maximizes the batch's goodput only;
      Sarathi-Serve (Agrawal et al., OSDI 2024) shows what a long step costs the requests
      behind it (generation stalls) and bounds the step instead, as llama-server and vLLM
      bound a step's prefill by chunks (`Scheduler`'s admission rule is its other half).
    - Latency targets (`slo_ttft_s`, `slo_tpot_s`: `specgen serve --slo-ttft`,
      `--slo-tpot`): a step may not be predicted to end after the first-token target of
      the longest-waiting request (its age + the step's seconds, every catch-up paid
      whole), nor to give any slot its tokens slower than the per-token target (step
      seconds over that slot's expected tokens E_i(K_i): a slot at K = 0 gets one token
      for the whole step the others speculate in). Where the best choice breaks one, the
      controller drops a draft depth at a time and solves again, down to K = 0; a target
      that even the ordinary step breaks holds the step to the ordinary one. Sarathi-Serve
      bounds its steps by a token budget derived from the TPOT target in the same spirit;
      here the bound is in predicted seconds, from the fitted lines.

    With no request waiting and no --slo-tpot (the defaults) the choice is goodput's alone,
    as before. Each slot's K carries its reason (`Choice.reasons`, `REASONS`).

    Args:
        k_max: --draft-max's ceiling for auto (per slot, before room caps it).
        target_prior, draft_prior: the cost lines used before measurements exist.
        probe_every: fewest idle steps before a probe (0 = never probe).
        probe_budget: most seconds a probe may cost (its row, its one-token depth, its
            catch-up) per second the slot has been idle (at the predicted ordinary step).
        draft_batched: one draft decode per depth serves every slot (fit S(n) = c0 +
            c_row n from `observe_draft`, `DraftFit`); False when each slot drafts in its
            own decodes, so a depth drafted by n slots costs n single-slot passes (S(n) =
            S(1) n).
        draft_token_prior: seconds of a draft token evaluated without a logits row (a
            catch-up) before measurements exist; draft_prior's slope when None.
        slo_ttft_s: the time-to-first-token target (--slo-ttft), seconds; None: none.
        slo_tpot_s: the time-per-output-token target (--slo-tpot), seconds; None: none.
    """

    def __init__(
        self,
        k_max: int = 16,
        target_prior: Line = Line(0.040, 0.005),
        draft_prior: Line = Line(0.0, 0.020),
        probe_every: int = 32,
        probe_budget: float = 0.02,
        draft_batched: bool = False,
        draft_token_prior: float | None = None,
        slo_ttft_s: float | None = None,
        slo_tpot_s: float | None = None,
    ) -> None:
        self.draft_batched = draft_batched
        self.slo_ttft_s = slo_ttft_s
        self.slo_tpot_s = slo_tpot_s
        self.k_max = k_max
        self.target = LineFit(target_prior)
        self.draft = DraftFit(draft_prior, draft_token_prior)
        self.probe_every = probe_every
        self.probe_budget = probe_budget
        # pooled (tested, hits) per sampling setting, least recently used first
        self._pools: collections.OrderedDict[Hashable, list[float]] = collections.OrderedDict()
        # (measured - predicted) seconds of recent whole steps, without and with
        # speculation: see `observe_step`
        self._residual: dict[bool, collections.deque[float]] = {
            False: collections.deque(maxlen=_RESIDUAL_WINDOW),
            True: collections.deque(maxlen=_RESIDUAL_WINDOW),
        }
        self._ordinary_steps = 0
        # speculative rounds of each recent run of them (see `observe_run`)
        self._runs: collections.deque[int] = collections.deque(maxlen=_RUN_WINDOW)
        # recent prompt chunks' target seconds per token (`observe_chunk`)
        self._chunk: collections.deque[float] = collections.deque(maxlen=_RESIDUAL_WINDOW)
        # the last all-zero choice's inputs, for `retime_due`
        self._idle_inputs: tuple[list[SlotInput], float] | None = None

    def observe_target(self, rows: int, seconds: float) -> None:
        """A target decode of `rows` scored rows (and no prompt chunk) took `seconds`."""
        self.target.add(rows, seconds)

    def observe_draft(self, n_tokens: int, seconds: float, n_rows: int | None = None) -> None:
        """One draft decode of `n_tokens` tokens with `n_rows` logits rows (a depth: one
        row per slot drafting it, the other tokens a catch-up; every token a row when
        None) took `seconds`."""
        self.draft.add(n_tokens if n_rows is None else n_rows, n_tokens, seconds)

    def observe_step(
        self, ks: Sequence[int], catch_up: int, seconds: float, free: Sequence[int] = ()
    ) -> None:
        """A whole step (no prompt chunks) whose slots used block sizes `ks` (`free` of
        each filled by prompt lookup, `SlotInput.free`), evaluating `catch_up` tokens of
        draft catch-up in all, took `seconds`. Its residual against the lines' prediction
        (everything the step does outside the fitted decodes: choosing, beginning blocks,
        building proposals) is kept for the recent steps with and without speculation
        apart; `spec_overhead_s` compares their medians."""
        t, c, tok = self.target.line(), self.draft_line(), self.draft.token_s
        free = list(free) + [0] * (len(ks) - len(free))
        slots = [SlotInput((), k, free=f) for k, f in zip(ks, free, strict=True)]
        predicted = step_seconds(ks, t, c, 0.0, slots, token_s=tok) + tok * catch_up
        spec = any(k > 0 for k in ks)
        self._residual[spec].append(seconds - predicted)
        if not spec:
            # steps without speculation say nothing new of its overhead: forget it slowly,
            # so that one busy moment while speculating cannot hold K at 0 for good
            self._ordinary_steps += 1
            if self._ordinary_steps % _FORGET_EVERY == 0 and self._residual[True]:
                self._residual[True].popleft()

    def observe_run(self, rounds: int) -> None:
        """A slot's run of consecutive speculative rounds ended after `rounds` of them (it
        was held at K = 0, or its request ended). A catch-up is paid at the start of a run
        and serves that run only: the draft falls behind again as soon as the slot stops
        drafting. The catch-up share assumed a slot, once speculating, speculates to the
        end of its request; under load, where slots start and stop as others come and go,
        runs were a few rounds long and each start paid a catch-up of the whole context
        again (at four sampled streams on 2 CPU cores, 8% of the time went to drafting
        that about 450 draft tokens used, and the server made 0.92x `--draft none`)."""
        if rounds > 0:
            self._runs.append(rounds)

    @property
    def run_rounds(self) -> float:
        """Mean speculative rounds per run over the recent runs; 0 (not known) until
        `_RUN_MIN` runs have been seen."""
        if len(self._runs) < _RUN_MIN:
            return 0.0
        return float(statistics.fmean(self._runs))

    @property
    def spec_overhead_s(self) -> float:
        """Seconds a speculating step costs beyond its rows and depths: the median residual
        of recent speculating steps less that of recent ordinary ones (0 where none were
        seen: a bias against speculation of the ordinary steps' own host time, ~1 ms on
        this CPU; medians, because a shared machine's stalls of a second must not stop
        speculation on their own). Never negative; 0 until a speculating step was seen,
        and again once `_RESIDUAL_WINDOW` * `_FORGET_EVERY` ordinary steps followed it."""
        spec, plain = self._residual[True], self._residual[False]
        if not spec:
            return 0.0
        return max(0.0, statistics.median(spec) - (statistics.median(plain) if plain else 0.0))

    def draft_line(self) -> Line:
        """Seconds of one draft depth as a function of the slots drafting it (a row and a
        token each); a token without a row costs `draft.token_s` more."""
        line = self.draft.line()
        return line if self.draft_batched else Line(0.0, line(1))

    def observe_round(self, acceptance: Acceptance, k: int, n_accepted: int) -> None:
        """A slot's round: its own estimate and its pool's."""
        if k <= 0:
            return
        acceptance.update(k, n_accepted)
        pool = self._pool(acceptance.pool)
        pool[0] += min(n_accepted + 1, k)
        pool[1] += min(n_accepted, k)

    def new_acceptance(self, pool: Hashable = None) -> Acceptance:
        """A fresh estimate for a new request, its prior the rate pooled so far over the
        requests of the same `pool` (the server's: the request's sampling settings), made
        optimistic by one standard deviation of its Beta(hits + 1, misses + 1) posterior:
        0.79 with no evidence, the pooled rate once there is much. Optimism in the face of
        uncertainty (as UCB bandits): with the plain mean (0.5) the first requests on a
        CPU never speculated, so acceptance was never measured and never could be.

        One pool per setting, because acceptance depends on it: on the demo pair greedy
        rounds accept about 0.8 of the tested positions, rounds at temperature 0.8 about
        half as many. With one pool for all, every sampled request after greedy ones began
        at a greedy prior, and its draft catch-up and first blocks at four slots were
        loss before its own counts brought K down (in-process: 0.91x `--draft none` at
        temperature 0.8 after 8 greedy requests). The last `_POOLS` settings are kept."""
        tested, hits = self._pool(pool)
        n = tested + 2.0
        mean = (hits + 1.0) / n
        prior = min(1.0, mean + math.sqrt(mean * (1.0 - mean) / (n + 1.0)))
        return Acceptance(prior, pool=pool)

    def _pool(self, key: Hashable) -> list[float]:
        return recent_entry(self._pools, key, lambda: [0.0, 0.0], _POOLS)

    def choose(
        self,
        states: Sequence[SlotState],
        fixed_s: float = 0.0,
        waiting_s: Sequence[float] = (),
        chunk_tokens: int = 0,
    ) -> Choice:
        """K per slot for this step, probes included (see the class), for the requests
        waiting behind it too (the latency rule, in the class docstring).

        Args:
            states: the active slots.
            fixed_s: seconds the step costs whatever K is.
            waiting_s: per request waiting for its first token behind this step (its
                prompt being prefilled), the seconds since it arrived.
            chunk_tokens: prompt tokens the step's decode will hold beside the rounds:
                the latency targets count them (`chunk_token_s` each), goodput does not
                (they cost the same whatever K is).

        Returns:
            The Choice, with a reason per slot (`REASONS`).
        """
        slots = []
        runs = self.run_rounds
        for st in states:
            cap = max(0, min(self.k_max, st.k_cap))
            free = min(max(0, st.free), cap)
            alpha = st.acceptance.alpha_by_pos(cap)
            if free and st.free_alpha is not None:
                # lookup tokens have their own rate; the model drafts the positions after
                alpha = (st.free_alpha,) * free + alpha[free:]
            slots.append(SlotInput(alpha, cap, st.catch_up, st.left, free, runs))
        t, c, spec = self.target.line(), self.draft_line(), self.spec_overhead_s
        tok = self.draft.token_s
        weight = 1.0 + len(waiting_s)
        got = choose(slots, t, c, fixed_s, spec, tok, weight)
        reason = "goodput"
        if waiting_s and got.k != choose(slots, t, c, fixed_s, spec, tok).k:
            reason = "waiting"
        chunk_s = self.chunk_token_s * max(0, chunk_tokens)
        got, bound = self._within_targets(slots, got, waiting_s, fixed_s + chunk_s, weight)
        reason = bound or reason
        self._idle_inputs = None if any(got.k) else (slots, fixed_s)
        got = _with_reasons(got, (reason,) * len(slots))
        if not self.probe_every or waiting_s or bound:
            return got  # no probe makes a waiting request or a latency target wait
        idle_s = got.step_s if not any(got.k) else step_seconds([0] * len(slots), t, c, fixed_s)
        ks = tuple(
            1
            if k == 0
            and (
                st.first
                and s.k_max > 0
                and not s.catch_up
                or self._probe_pays(s, st, idle_s, t, c, tok)
            )
            else k
            for k, s, st in zip(got.k, slots, states, strict=True)
        )
        if ks == got.k:
            return got
        n = sum(float(expected_gains(s.alpha_by_pos, k)[k]) for s, k in zip(slots, ks, strict=True))
        sec = step_seconds(ks, t, c, fixed_s, slots, spec, tok)
        reasons = tuple(
            "probe" if k != k0 else r for k, k0, r in zip(ks, got.k, got.reasons, strict=True)
        )
        return Choice(ks, n, sec, n / sec if sec > 0 else 0.0, got.goodput_ordinary, reasons)

    def observe_chunk(self, n_tokens: int, seconds: float) -> None:
        """A target decode holding `n_tokens` prompt tokens beside its rounds took `seconds`
        more than the target's line gives for its rows: their cost per token is kept (the
        last `_RESIDUAL_WINDOW`), for the latency targets' prediction of a step."""
        if n_tokens > 0:
            self._chunk.append(max(0.0, seconds) / n_tokens)

    @property
    def chunk_token_s(self) -> float:
        """Seconds of a prompt token in a target decode (no logits row): the median of the
        recent chunks' cost per token; the target line's slope (a row's cost, an
        overestimate) until a chunk has been seen."""
        if not self._chunk:
            return self.target.line().slope_s
        return float(statistics.median(self._chunk))

    def step_s_whole(self, ks: Sequence[int], slots: Sequence[SlotInput], fixed_s: float) -> float:
        """Predicted seconds of a step at `ks` with every catch-up paid whole (what the step
        really lasts: `Choice.step_s` charges a catch-up by its share, a price)."""
        whole = [SlotInput(s.alpha_by_pos, s.k_max, s.catch_up, 0, s.free) for s in slots]
        t, c, spec = self.target.line(), self.draft_line(), self.spec_overhead_s
        return step_seconds(ks, t, c, fixed_s, whole, spec, self.draft.token_s)

    def _broken_target(
        self,
        slots: Sequence[SlotInput],
        ks: Sequence[int],
        waiting_s: Sequence[float],
        fixed_s: float,
    ) -> str | None:
        """The latency target the step at `ks` is predicted to break ("slo_ttft",
        "slo_tpot"), or None. A target the ordinary step breaks already is held to that
        step's length instead: the shortest there is."""
        sec = self.step_s_whole(ks, slots, fixed_s)
        sec0 = self.step_s_whole([0] * len(slots), slots, fixed_s)
        eps = 1e-9
        if self.slo_ttft_s is not None and waiting_s:
            if sec > max(self.slo_ttft_s - max(waiting_s), sec0) + eps:
                return "slo_ttft"
        if self.slo_tpot_s is not None and slots:
            tokens = [
                float(expected_gains(s.alpha_by_pos, k)[k]) for s, k in zip(slots, ks, strict=True)
            ]
            if sec / min(tokens) > max(self.slo_tpot_s, sec0) + eps:
                return "slo_tpot"
        return None

    def _within_targets(
        self,
        slots: list[SlotInput],
        got: Choice,
        waiting_s: Sequence[float],
        fixed_s: float,
        weight: float,
    ) -> tuple[Choice, str | None]:
        """`got`, or the best choice with fewer draft depths that keeps the latency targets
        (one depth fewer at a time, each re-solved exactly); K = 0 everywhere at worst.
        Returns the choice and the target that bound it (None: none did)."""
        bound = None
        t, c, spec = self.target.line(), self.draft_line(), self.spec_overhead_s
        tok = self.draft.token_s
        while any(got.k):
            broken = self._broken_target(slots, got.k, waiting_s, fixed_s)
            if broken is None:
                break
            bound = bound or broken
            depth = max(got.k) - 1
            capped = [
                SlotInput(
                    s.alpha_by_pos, min(s.k_max, depth), s.catch_up, s.left,
                    min(s.free, depth), s.run_rounds,
                )
                for s in slots
            ]  # fmt: skip
            got = choose(capped, t, c, fixed_s, spec, tok, weight)
        return got, bound

    def retime_due(self, n_tokens: int, undrafted_s: float) -> bool:
        """Whether to time one draft decode of `n_tokens` now, `undrafted_s` seconds of
        steps after the draft's cost was last measured: as rarely as keeps those decodes
        within `probe_budget` of the time (Controller.retime_draft's rule), and only
        where a draft at half the fitted cost would make the last choice speculate (where
        the target's rows alone rule speculation out, re-timing the draft cannot change
        it, and would cost its 2%)."""
        if not (
            self.draft_batched
            and undrafted_s > 0
            and self.draft_line()(n_tokens) <= self.probe_budget * undrafted_s
        ):
            return False
        if self._idle_inputs is None:
            return True
        slots, fixed_s = self._idle_inputs
        c = self.draft_line()
        half = Line(c.intercept_s / 2, c.slope_s / 2)
        spec, tok = self.spec_overhead_s, self.draft.token_s / 2
        return any(choose(slots, self.target.line(), half, fixed_s, spec, tok).k)

    def _probe_pays(
        self,
        slot: SlotInput,
        st: SlotState,
        step_s: float,
        target: Line,
        draft: Line,
        token_s: float,
    ) -> bool:
        """Whether a K = 1 probe of this idle slot costs at most probe_budget of the time
        it has been idle (its steps at the ordinary step's predicted seconds)."""
        if slot.k_max <= 0 or st.idle_steps < self.probe_every:
            return False
        cost = target.slope_s + draft(1) + token_s * slot.catch_up
        return cost <= self.probe_budget * st.idle_steps * step_s
