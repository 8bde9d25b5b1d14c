"""Cost estimators: the seconds of a decode as a function of its size, fitted online, for
the controller (`specgen.control.batch.BatchController`). `LineFit`: the target's seconds
by the rows of a decode, T; `DraftFit`: the draft's by the logits rows and the tokens of
a decode, S (`specgen.control.goodput` says how they price a step); `Line` is what they
give. On a CPU scoring 8 tokens costs 2x to 5x one token; on a GPU it is nearly flat, so
neither is assumed.

Pure: numpy only.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass

import numpy as np

_MIN_PER_SIZE = 3  # decodes of a size before `LineFit` fits on it (once two sizes have them)
_STALE = 256  # decodes after a size's last one that `LineFit` leaves it out (not the smallest)


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

    A size not seen in the last `_STALE` decodes is left out, except the smallest seen (the
    ordinary decode's end of the line, which a server that always speculates makes rarely):
    a server held at K = 0 makes only its ordinary size, so the block sizes it measured in
    a slow moment (its first rounds, on a machine busy then) would otherwise stay in the
    fit for good, every K looking too costly, and nothing could measure them again. Left
    out, the line falls back on the ordinary decodes and the prior's slope (the start-up's
    timing), under which speculation is tried again; and a stale size's next decode
    starts its measurements afresh.

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
        self._last: dict[float, int] = {}  # each size's last decode, counted by `add`
        self._adds = 0
        self._line: Line | None = None  # the fit, until the next `add`

    def set_prior(self, prior: Line) -> None:
        """Replace the prior (what `line` gives until two distinct x have been seen)."""
        self.prior = prior
        self._line = None

    def add(self, x: float, seconds: float) -> None:
        size = float(x)
        if size not in self._bins or self._adds - self._last[size] > _STALE:
            # a stale size's decodes were of another moment: this one starts it afresh
            self._bins[size] = collections.deque(maxlen=self.per_size)
        self._bins[size].append(float(seconds))
        self._adds += 1
        self._last[size] = self._adds
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
        smallest = min(self._bins)
        live = [x for x in self._bins if x == smallest or self._adds - self._last[x] <= _STALE]
        sizes = [x for x in live if len(self._bins[x]) >= _MIN_PER_SIZE]
        if len(sizes) < 2:
            sizes = live
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

    Slow outliers are left out: a decode measured more than `_STALL_SIGMAS` robust
    standard deviations (1.4826 times the median absolute deviation of the residuals) and
    more than `_STALL_SHARE` of its prediction above the first fit is a stall of the
    machine (another process, a page fault), not a cost of the decode, and the fit is made
    again without it (a trimmed least-squares fit, slow side only: a decode never runs
    faster than the machine allows). Plain least squares let one stall steer the line: in
    a server at four greedy streams under a schema, a few two-row depths of 0.3-1.3 s among
    decodes of 45-60 ms made the fit 0 ms + 88 ms a row and 16 ms a token without one
    (measured alone: about 20 ms + 9 ms a row, 3 ms a token), so that speculation looked
    hopeless, the draft fell behind, its catch-up grew and the server ran at 0.89x
    `--draft none` where a fixed K = 4 made 1.20x.
    """

    def __init__(self, prior: Line, token_s: float | None = None, window: int = 256) -> None:
        self.window = window
        self._rows: list[float] = []
        self._extra: list[float] = []
        self._y: list[float] = []
        self._at: list[int] = []  # each decode's `tick` count
        self._ticks = 0
        self._coef: tuple[float, float, float] | None = None
        self.set_prior(prior, token_s)

    def tick(self) -> None:
        """One target decode went by (`BatchController.observe_target`): draft decodes
        older than `_STALE` of them are dropped, so that a draft measured in a slow moment
        and not drafting since (held at K = 0 by that very measurement) falls back on its
        prior, as `LineFit`'s stale sizes do."""
        self._ticks += 1
        n = 0
        while n < len(self._at) and self._ticks - self._at[n] > _STALE:
            n += 1
        if n:
            del self._rows[:n], self._extra[:n], self._y[:n], self._at[:n]
            self._coef = None

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
        self._at.append(self._ticks)
        if len(self._y) > self.window:
            del self._rows[0], self._extra[0], self._y[0], self._at[0]
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
        x = np.column_stack([np.ones(len(self._y)), self._rows, self._extra])
        y = np.asarray(self._y)
        beta = self._bounded(x, y)
        residual = y - x @ beta
        spread = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
        kept = residual <= np.maximum(_STALL_SIGMAS * spread, _STALL_SHARE * (x @ beta))
        if not kept.all():
            beta = self._bounded(x[kept], y[kept])
        return float(beta[0]), float(beta[1]), float(beta[2])

    def _bounded(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The ridge-penalized least-squares (c0, c_row, c_tok) >= 0 of y on x (n, 3)."""
        p = np.asarray(self.prior, dtype=np.float64)
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
        return best


# DraftFit leaves out a decode this many robust standard deviations and this share of its
# prediction above the fit (a stall); 4 sigmas: a normal residual is never cut (p 6e-5)
_STALL_SIGMAS = 4.0
_STALL_SHARE = 0.5
# DraftFit's ridge: a coefficient 10 ms off its prior costs as much as a 0.3 ms residual
_PRIOR_WEIGHT = 1e-3
# the sets of DraftFit's coefficients left free (the others held at 0), all first
_FACES = ((0, 1, 2), (0, 1), (0, 2), (1, 2), (0,), (1,), (2,), ())
