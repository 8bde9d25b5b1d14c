"""The `--draft-p-min` cut-off (`specgen.cutoff`): the rule, and that stopping on the
draft's own confidence leaves the emitted tokens distributed exactly as the target's."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specgen.cutoff import should_stop, top_probability
from specgen.rejection import residual


def test_should_stop_rule() -> None:
    assert should_stop(0.3, 0.5)
    assert not should_stop(0.5, 0.5)  # llama.cpp: stop only when strictly below
    assert not should_stop(0.9, 0.5)
    assert not should_stop(0.0, 0.0)  # p_min = 0 disables the cut-off


def test_top_probability() -> None:
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    e = np.exp(logits.astype(np.float64))
    assert top_probability(logits) == pytest.approx(e.max() / e.sum(), rel=1e-12)
    assert top_probability(np.array([1000.0, 0.0])) == pytest.approx(1.0)


V = 3  # vocabulary
K = 2  # block size
T = 3  # tokens generated


def _dist(h: tuple[int, ...], salt: int) -> np.ndarray:
    """A fixed, history-dependent distribution over V tokens (p: salt 0, q: salt 1)."""
    rng = np.random.default_rng(abs(hash((h, salt))) % 2**32)
    w = rng.random(V) ** 3 + 0.02
    return w / w.sum()


def _round(h: tuple[int, ...], p_min: float, peek: bool = False) -> dict[tuple[int, ...], float]:
    """Exact law of the tokens one speculative round emits after history h.

    peek=True is the wrong rule, a control: it drops a drawn token whose own q(x) is
    below p_min, so the decision depends on the draw, not just on the draft's state.
    """
    out: dict[tuple[int, ...], float] = {}

    def add(seq: tuple[int, ...], prob: float) -> None:
        out[seq] = out.get(seq, 0.0) + prob

    def verify(i: int, xs: tuple[int, ...], prob: float, emitted: tuple[int, ...]) -> None:
        hh = h + emitted
        p = _dist(hh, 0)
        if i == len(xs):  # every proposal accepted: bonus token from p
            for y in range(V):
                add(emitted + (y,), prob * p[y])
            return
        x, q = xs[i], _dist(hh, 1)
        a = min(1.0, p[x] / q[x])
        verify(i + 1, xs, prob * a, emitted + (x,))
        r = residual(p, q)
        for y in range(V):
            add(emitted + (y,), prob * (1 - a) * r[y])

    def draft(xs: tuple[int, ...], prob: float) -> None:
        q = _dist(h + xs, 1)
        if len(xs) == K or should_stop(float(q.max()), p_min):
            verify(0, xs, prob, ())
            return
        for x in range(V):
            if peek and q[x] < p_min:
                verify(0, xs, prob * q[x], ())
            else:
                draft(xs + (x,), prob * q[x])

    draft((), 1.0)
    return out


def _generate(
    h: tuple[int, ...], n: int, p_min: float, peek: bool = False
) -> dict[tuple[int, ...], float]:
    """Exact law of the next n tokens, by rounds (the last round's tail is cut)."""
    if n == 0:
        return {(): 1.0}
    law: dict[tuple[int, ...], float] = {}
    for seq, prob in _round(h, p_min, peek).items():
        seq = seq[:n]
        for rest, p2 in _generate(h + seq, n - len(seq), p_min, peek).items():
            law[seq + rest] = law.get(seq + rest, 0.0) + prob * p2
    return law


@pytest.mark.parametrize("p_min", [0.0, 0.5, 0.6, 1.0])
def test_cut_off_preserves_the_target_distribution(p_min: float) -> None:
    law = _generate((), T, p_min)
    for seq in itertools.product(range(V), repeat=T):
        target = np.prod([_dist(seq[:i], 0)[seq[i]] for i in range(T)])
        assert law.get(seq, 0.0) == pytest.approx(target, abs=1e-12), seq


def test_cut_off_actually_stops_blocks() -> None:
    """The cases above exercise early stops (some draft states are below p_min)."""
    maxima = [
        _dist(seq, 1).max() for n in range(T) for seq in itertools.product(range(V), repeat=n)
    ]
    assert min(maxima) < 0.5 < 0.6 < max(maxima)


def test_a_rule_that_looks_at_the_draw_is_not_exact() -> None:
    law = _generate((), T, 0.3, peek=True)
    errors = [
        abs(law.get(seq, 0.0) - np.prod([_dist(seq[:i], 0)[seq[i]] for i in range(T)]))
        for seq in itertools.product(range(V), repeat=T)
    ]
    assert max(errors) > 1e-3
