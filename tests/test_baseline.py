"""The ordinary-decoding baseline is one estimate, kept current by the run (issue: a busy
machine during the first passes made a run of ordinary rounds claim an 11x speedup).

A fake clock drives every timing: each target decode costs 10 ms plus 1 ms per extra row,
each draft decode 12 ms (a draft slower than its target: no block size can pay), and the
machine is "busy" for the first decodes after the prompt, which cost 10x."""

from __future__ import annotations

import time

import pytest
from fakes import FakeEngine

from specgen.drafters import ModelDrafter
from specgen.events import Done, Prefilled, Step
from specgen.generate import AutoK, GenerateConfig, generate
from specgen.measure import Baseline
from specgen.sampling import SamplingParams
from specgen.ui.state import ViewState, apply

GREEDY = SamplingParams(temp=0.0)
TARGET_S, ROW_S, DRAFT_S, BUSY = 0.010, 0.001, 0.012, 10.0


def test_baseline_is_the_initial_passes_until_the_run_has_its_own() -> None:
    b = Baseline(settle=3)
    assert b.token_s is None
    b.add_initial([0.3, 0.1, 0.2])
    assert b.token_s == pytest.approx(0.2)
    b.add_round(0.01)
    assert b.token_s == pytest.approx(0.15)  # median of the four passes
    b.add_round(0.01)
    b.add_round(0.01)
    assert b.token_s == pytest.approx(0.01)  # three ordinary rounds: they decide
    # the first passes were 20x slower, and the ranges do not overlap: said
    assert b.disagreement() == pytest.approx(20.0)
    assert "20.0x slower" in (b.disagreement_note() or "")


def test_one_slow_round_counts_at_most_twice_the_estimate() -> None:
    b = Baseline(settle=1)
    b.add_round(0.01)
    b.add_round(1.0)  # a pause: capped at 0.02
    b.add_round(0.01)
    assert b.token_s == pytest.approx(0.01)
    b2 = Baseline(settle=1)
    b2.add_round(0.01)
    b2.add_round(1.0)
    assert b2.token_s == pytest.approx(0.015)  # median of 0.01 and the capped 0.02


def test_agreeing_passes_raise_no_note() -> None:
    b = Baseline(settle=3)
    b.add_initial([0.010, 0.012, 0.011])
    for s in (0.011, 0.009, 0.0115):
        b.add_round(s)
    assert b.disagreement() is None and b.disagreement_note() is None


def _clocked(monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], FakeEngine, FakeEngine]:
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])  # the drafter's own timings
    target = FakeEngine(n_vocab=9, seed=0, n_ctx=512)
    draft = FakeEngine(n_vocab=9, seed=0, noise=2.0, n_ctx=512)
    calls = {"target": 0}

    def target_decode(tokens, all_logits=False, rows=None, _real=target.decode):
        calls["target"] += 1
        # the prompt and the first (ordinary) round are call 1; the start-up's warm-up
        # pass and the 3 timed passes after it are "busy"
        busy = BUSY if 2 <= calls["target"] <= 5 else 1.0
        n_rows = len(rows) if rows is not None else (len(tokens) if all_logits else 1)
        clock[0] += busy * (TARGET_S + ROW_S * (max(1, n_rows) - 1))
        return _real(tokens, all_logits, rows)

    def draft_decode(tokens, all_logits=False, rows=None, _real=draft.decode):
        clock[0] += DRAFT_S
        return _real(tokens, all_logits, rows)

    monkeypatch.setattr(target, "decode", target_decode)
    monkeypatch.setattr(draft, "decode", draft_decode)
    return clock, target, draft


def test_a_busy_start_does_not_make_ordinary_rounds_claim_a_speedup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, target, draft = _clocked(monkeypatch)
    config = GenerateConfig(max_tokens=200, params=GREEDY, ignore_eos=True, measure_ordinary=3)
    drafter = ModelDrafter(draft, GREEDY, 9)
    events = list(generate(target, drafter, [1, 2, 3], config, AutoK(8), lambda: clock[0]))
    pre, done = events[0], events[-1]
    assert isinstance(pre, Prefilled) and isinstance(done, Done)
    steps = [e for e in events if isinstance(e, Step)]
    s = done.stats
    truth = s.tokens_per_s * TARGET_S  # tokens/s over the true ordinary rate
    # the stale figure (the busy passes alone) would claim about 10x: the test can fail
    # the passes are timed after the first round (its token waits for none of them)
    assert pre.ordinary_token_s is None and steps[0].timed_ordinary_s is None
    timed = steps[1].timed_ordinary_s
    assert timed is not None and s.tokens_per_s * timed > 5.0 * truth
    assert s.speedup == pytest.approx(truth, rel=0.10)
    view = ViewState(target_name="t", draft_name="d")
    for ev in events:
        apply(view, ev)
    assert view.speedup == pytest.approx(truth, rel=0.10)
    # the controller does not speculate where it loses: the run keeps ordinary decoding's
    # speed on the same busy machine (its warm-up rounds aside), nearly every round ordinary
    clock2, target2, _ = _clocked(monkeypatch)
    plain = list(generate(target2, None, [1, 2, 3], config, None, lambda: clock2[0]))[-1]
    assert s.tokens_per_s >= 0.9 * plain.stats.tokens_per_s
    assert sum(st.k > 0 for st in steps) <= 0.05 * len(steps)
    # and the summary says the first passes and the run disagreed
    assert s.baseline_note is not None and "slower" in s.baseline_note
