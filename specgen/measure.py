"""Measurement of the run itself: the ordinary-pass meter behind every speedup figure.

`Baseline` times ordinary decoding (the target alone, one token a pass) over the whole run.
It belongs to no choice of K (the controller prices from its own fitted lines): the live
view, the summary and `--json`'s speedup divide by it.

Pure: the standard library only.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Sequence


class Baseline:
    """Seconds of one ordinary decoding pass (the target alone, one token): the one figure
    every speedup is measured against, kept current by the run.

    It starts from the single-token passes timed right after the prompt (`add_initial`);
    every K = 0 round is an ordinary pass too and updates it (`add_round`). Once the run
    has `settle` ordinary rounds of its own, they alone decide (the median of the last
    `window`), so a machine that was busy for the first passes cannot make a run of
    ordinary rounds claim a speedup. One slow round counts at most twice the current
    estimate.

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
