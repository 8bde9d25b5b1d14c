"""A server whose start-up was timed on a busy machine speculates again once the machine
is quiet (2026-12-05: a `specgen serve` whose first request ran in a slow moment made no
proposal for 17 requests in a row): the controller compares the target's ordinary
decodes with its calibration and, where the machine's speed changed 2x or more, rescales
its cost lines (`BatchController.observe_target`); and the block sizes and draft decodes
measured in a slow moment leave the fits once stale (`LineFit`, `DraftFit.tick`).

A fake clock drives every timing: a target decode costs 10 ms plus 1 ms a row, a draft
decode 2 ms plus 0.5 ms a token, and the first `BUSY_DECODES` target decodes (and every
draft decode made meanwhile) cost 10x: the start-up's calibration and the first request's
first rounds."""

from __future__ import annotations

import time

import pytest
from fakes import FakeBatchEngine

from specgen.drafters import ModelDrafter
from specgen.events import Done
from specgen.generate import GenerateConfig
from specgen.sampling import SamplingParams
from specgen.sched.jobs import Job
from specgen.sched.scheduler import Scheduler

V = 9
GREEDY = SamplingParams(temp=0.0)
BUSY_DECODES = 80


def clocked(
    monkeypatch: pytest.MonkeyPatch, busy_from: int = 1, busy_to: int = BUSY_DECODES
) -> tuple[list[float], Scheduler]:
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    target = FakeBatchEngine(1, 64, n_vocab=V, seed=0, n_ctx=2048)
    draft = FakeBatchEngine(1, 64, n_vocab=V, seed=0, noise=0.3, n_ctx=2048)
    calls = [0]

    def busy() -> float:
        return 10.0 if busy_from <= calls[0] <= busy_to else 1.0

    def target_batch(parts, copy=True, _real=target.decode_batch):
        calls[0] += 1
        rows = sum(p.n_rows for p in parts)
        clock[0] += busy() * (0.010 + 0.001 * rows)
        return _real(parts, copy)

    def draft_batch(parts, copy=True, _real=draft.decode_batch):
        clock[0] += busy() * (0.002 + 0.0005 * sum(len(p.tokens) for p in parts))
        return _real(parts, copy)

    monkeypatch.setattr(target, "decode_batch", target_batch)
    monkeypatch.setattr(draft, "decode_batch", draft_batch)
    sched = Scheduler(
        target,
        ModelDrafter(draft, GREEDY, V),
        n_parallel=1,
        queue_max=8,
        draft_max=None,
        clock=lambda: clock[0],
    )
    return clock, sched


@pytest.mark.parametrize("busy", ["calibration", "first rounds"])
def test_a_busy_start_does_not_hold_the_server_at_ordinary_decoding(monkeypatch, busy) -> None:
    """Busy through the calibration and the first request's first rounds (its priors and
    its block sizes measured slow: the speed check rescales), or through those rounds
    only (a calibration true to the quiet machine; the slow block sizes leave the target's
    fit once stale, `LineFit`)."""
    # the calibration (`start` runs it before any request) makes 8 target decodes
    _, sched = clocked(monkeypatch, *((1, BUSY_DECODES) if busy == "calibration" else (9, 60)))
    sched.calibrate()
    done: list[Done] = []
    for i in range(12):
        sched.submit(
            Job(f"r{i}", [1, 2, 3, 4, 5, 6, 7, 8][: 3 + i % 5], GenerateConfig(
                max_tokens=80, params=GREEDY, ignore_eos=True)),
            lambda ev: done.append(ev) if isinstance(ev, Done) else None,
        )  # fmt: skip
        sched.run_until_idle()
    assert len(done) == 12
    # a draft 5x cheaper than its target and close to it: worth speculating, once the
    # machine is quiet (the planted trap: each of the last requests ordinary throughout)
    late = done[-4:]
    assert all(d.stats.n_drafted > 0 for d in late), [d.stats.n_drafted for d in done]
    assert all(d.stats.n_generated / d.stats.target_passes > 1.5 for d in late)
    assert sched.controller is not None
    # a busy calibration: rescaled once the machine is quiet; busy first rounds (their
    # blocks within the five rows a single slot's calibration times): rescaled to the busy
    # machine, then back
    assert sched.controller.speed_changes == (1 if busy == "calibration" else 2)


def test_a_steady_machine_never_rescales() -> None:
    from specgen.control.batch import BatchController
    from specgen.control.costs import Line

    ctl = BatchController()
    ctl.calibrated(Line(0.010, 0.001), 4, Line(0.0, 0.003), 0.0005)
    for i in range(200):  # up to 1.9x slower and faster than calibrated, by turns
        ctl.observe_target(1 + i % 4, (0.011 + 0.001 * (i % 4)) * (1.9 if i % 2 else 0.53))
    assert ctl.speed_changes == 0
    for _ in range(16):  # then 3x slower: decided once most of the window is
        ctl.observe_target(2, 0.036)
    assert ctl.speed_changes == 1
    assert ctl.target.line()(2) == pytest.approx(0.036, rel=0.05)  # refitted since
    assert 2 * 0.0005 <= ctl.draft.token_s <= 3 * 0.0005  # the draft's prior, scaled


def test_stale_sizes_leave_the_fit_but_the_smallest_stays() -> None:
    from specgen.control.costs import _STALE, DraftFit, Line, LineFit

    fit = LineFit(Line(0.010, 0.001))
    for _ in range(3):
        fit.add(1, 0.011)  # the ordinary size, then only block sizes for a long while
    for _ in range(_STALE + 10):
        fit.add(9, 0.019)
    assert fit.line()(1) == pytest.approx(0.011) and fit.line()(9) == pytest.approx(0.019)
    for _ in range(3):
        fit.add(9, 0.190)  # a slow moment at a block size, then ordinary decodes only
    for _ in range(_STALE + 1):
        fit.add(1, 0.011)
    assert fit.line()(9) == pytest.approx(0.019)  # the prior's slope through the ordinary
    fit.add(9, 0.019)  # the stale size measured again: afresh, not among the slow ones
    assert fit.line()(9) == pytest.approx(0.019)

    draft = DraftFit(Line(0.0, 0.003), 0.0005)
    for _ in range(20):
        draft.add(1, 1, 0.030)  # measured 10x slow, then no draft decode
    assert draft.line()(1) == pytest.approx(0.030, rel=0.01)
    for _ in range(_STALE + 1):
        draft.tick()
    assert draft.line()(1) == pytest.approx(0.003)  # back on the prior
