"""A server whose start-up was timed on a busy machine speculates again once the machine
is quiet (2026-12-05: a `specgen serve` that calibrated while another server loaded made
no proposal for 17 requests in a row): the controller compares the target's ordinary
decodes with its calibration and, where the machine's speed changed 2x or more, rescales
its cost lines (`BatchController.observe_target`).

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


def clocked(monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], Scheduler]:
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    target = FakeBatchEngine(1, 64, n_vocab=V, seed=0, n_ctx=2048)
    draft = FakeBatchEngine(1, 64, n_vocab=V, seed=0, noise=0.3, n_ctx=2048)
    calls = [0]

    def busy() -> float:
        return 10.0 if calls[0] <= BUSY_DECODES else 1.0

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


def test_a_busy_start_does_not_hold_the_server_at_ordinary_decoding(monkeypatch) -> None:
    _, sched = clocked(monkeypatch)
    sched.calibrate()  # as `start` does before any request: on the busy machine
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
    assert sched.controller is not None and sched.controller.speed_changes == 1


def test_a_steady_machine_never_rescales() -> None:
    from specgen.control.batch import BatchController
    from specgen.control.costs import Line

    ctl = BatchController()
    ctl.calibrated(Line(0.010, 0.001), Line(0.0, 0.003), 0.0005, rows=4)
    for i in range(200):  # up to 1.9x slower and faster than calibrated, by turns
        ctl.observe_target(1 + i % 4, (0.011 + 0.001 * (i % 4)) * (1.9 if i % 2 else 0.53))
    assert ctl.speed_changes == 0
    for _ in range(16):  # then 3x slower: decided once most of the window is
        ctl.observe_target(2, 0.036)
    assert ctl.speed_changes == 1
    assert ctl.target.line()(2) == pytest.approx(0.036, rel=0.05)  # refitted since
    assert 2 * 0.0005 <= ctl.draft.token_s <= 3 * 0.0005  # the draft's prior, scaled
