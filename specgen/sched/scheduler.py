"""The core of `specgen serve`: `Scheduler`, a bounded queue of jobs and one worker thread
that owns llama.cpp and runs the batched steps (`specgen.sched.step`) over the
slots (`specgen.sched.slot`). No HTTP here (see notes: the seam with app.py).

Events leave once per step: what a step sends (each slot's `Step`, the `Done` or `Failed`
that ends a job) waits in an outbox and is handed to `deliver` together when the step
ends, just before the worker goes back into llama_decode. The server's `deliver` wakes its
event loop once for them all; a wake-up per event let the loop take the GIL while the
worker still had other slots to commit (measured in `serve` at four streams: host time
per step 3.6 ms instead of 2.2 ms).
"""

from __future__ import annotations

import collections
import statistics
import threading
from collections.abc import Callable
from typing import Literal

from specgen.control.batch import BatchController
from specgen.control.costs import Line, LineFit
from specgen.drafters import common_prefix
from specgen.engine import BatchEngine, Drafter, SeqDecode, as_batch
from specgen.errors import EngineError
from specgen.ngram import NgramDrafter
from specgen.round import Clock, now
from specgen.sched.drafting import Drafting
from specgen.sched.jobs import (
    BatchReport,
    Deliver,
    DoesNotFit,
    Failed,
    Job,
    JobEvent,
    QueueFull,
    Sink,
    Ticket,
    deliver_each,
)
from specgen.sched.promptcache import PromptCache, StateView
from specgen.sched.slot import Slot, Slots, batched
from specgen.sched.step import Stepper

#: tokens of the catch-up-shaped draft decode `Scheduler.calibrate` times (one row)
_CALIBRATE_RUN = 16

#: rows of the single stream's second timed target decode (a K = 4 block's): one row runs
#: another kernel than several (demo target, 2 AMD cores: 1, 2, 3, 9 rows in 38, 46, 49, 75
#: ms), and a line through 1 and 2 rows put a row at 8-16 ms, holding a stream at K = 0
_CALIBRATE_ROWS = 5


class Scheduler:
    """Serves jobs `n_parallel` at a time with one batched target decode per step.

    Args:
        target: the target with at least n_parallel sequences (`BatchEngine`).
        drafter: the loaded drafter: a `ModelDrafter` or `HybridDrafter` over a draft
            engine with sequences (each slot drafts in its own, all in one decode per
            depth), an `NgramDrafter` (copied per slot), or None.
        n_parallel: slots (--parallel).
        queue_max: jobs allowed to wait for a slot (--queue).
        draft_max: fixed K (--draft-max K), or None for the batch controller (auto).
        observer: called with a BatchReport after every step (from the worker thread).
        deliver: hands each step's events to their tickets' sinks at the step's end (from
            the worker thread; it must not block); default: each sink in turn.
        prefill_chunk: most prompt tokens one slot adds to a step.
        controller: the batch controller for auto (default: `BatchController()`).
        clock: seconds; tests replace it.
        slo_ttft_s, slo_tpot_s: the default controller's latency targets (--slo-ttft,
            --slo-tpot, seconds; None: none).
        prompt_cache: the cells of prompts that left their slot, restored for a request
            sharing a longer prefix than any free slot holds (--cache-ram;
            `specgen.sched.promptcache`); None: none. Needs sequences with
            `save_state` (`SequenceView`).
        single: one slot driven by its caller, step by step (`specgen.generate`, the
            single stream): a failure raises the exception itself instead of ending the
            job with `Failed`, and the job's Prefilled event is sent.
        ordinary_first: a request's first round is ordinary decoding (its first token at
            ordinary decoding's latency); False: it may speculate (`specgen verify`).
        k_max: the default controller's largest K (`BatchController.k_max`).

    Raises:
        ValueError: the target has fewer sequences than n_parallel, or a drafter that
            cannot be given to several slots.
    """

    def __init__(
        self,
        target: BatchEngine,
        drafter: Drafter | None,
        *,
        n_parallel: int,
        queue_max: int,
        draft_max: int | None,
        observer: Callable[[BatchReport], None] | None = None,
        deliver: Deliver | None = None,
        prefill_chunk: int = 256,
        controller: BatchController | None = None,
        clock: Clock = now,
        slo_ttft_s: float | None = None,
        slo_tpot_s: float | None = None,
        prompt_cache: PromptCache | None = None,
        single: bool = False,
        ordinary_first: bool = True,
        k_max: int = 16,
    ) -> None:
        if target.n_seq < n_parallel:
            raise ValueError(f"the target holds {target.n_seq} sequences, not {n_parallel}")
        self.target = target
        self._draft: BatchEngine | None = None
        batch = batched(drafter)
        if batch is not None:
            draft = as_batch(batch.model.engine)  # the loaded one
            if draft.n_seq < n_parallel:
                raise ValueError(f"the draft holds too few sequences for {n_parallel} slots")
            self._draft = draft
        elif drafter is not None and not isinstance(drafter, NgramDrafter) and n_parallel > 1:
            raise ValueError(f"{drafter.name} cannot draft for several slots")
        self.n_parallel = n_parallel
        self.queue_max = queue_max
        self.draft_max = draft_max
        self.observer = observer
        self.deliver: Deliver = deliver or deliver_each
        self._outbox: list[tuple[Ticket, JobEvent]] = []  # this step's events (worker only)
        self.prefill_chunk = max(1, prefill_chunk)
        self.clock = clock
        self.prompt_cache = prompt_cache
        # one draft decode per depth serves every slot: a depth of n slots costs c0 + c_row
        # n; one slot fades its untested deep positions (`BatchController.fade_untested`)
        default = BatchController(
            k_max,
            draft_batched=self._draft is not None,
            # a model-free drafter (n-gram) makes no draft decodes: its blocks cost the
            # target's rows only (host time is in the step's measured costs)
            draft_prior=Line(0.0, 0.020) if self._draft is not None else Line(0.0, 0.0),
            slo_ttft_s=slo_ttft_s,
            slo_tpot_s=slo_tpot_s,
            fade_untested=0.8 if single else 1.0,
        )
        self.controller = (controller or default) if draft_max is None and drafter else None
        self.slots = Slots(
            target,
            self._draft,
            drafter,
            n_parallel=n_parallel,
            draft_max=draft_max,
            controller=self.controller,
            clock=clock,
            send=self._send,
            single=single,
            ordinary_first=ordinary_first,
        )
        views = [s.target.n_ctx for s in self.slots.all]
        views += [s.draft.n_ctx for s in self.slots.all if s.draft is not None]
        self.n_ctx_slot = min(views)
        self._cond = threading.Condition()
        self._queue: collections.deque[Ticket] = collections.deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._calibrated = threading.Event()  # set once `start`'s worker has calibrated
        self.last_report: BatchReport | None = None
        self.drafting = Drafting(
            self._draft,
            self.controller,
            clock=clock,
            prefill_chunk=self.prefill_chunk,
            fail=self.slots.fail,
            arrival_waits=self._arrival_waits,
            slot_free=lambda: not self._stopping and self.slots_busy < self.n_parallel,
        )
        self._stepper = Stepper(
            target,
            self.slots,
            self.drafting,
            reap_cancelled=self._reap_cancelled,
            admit=self._admit,
            queue_depth=lambda: self.queue_depth,
        )

    # -- the HTTP side's calls (any thread) --------------------------------------------

    def start(self) -> None:
        """Start the worker thread that owns llama.cpp, and return once it has calibrated
        the controller's cost lines (`calibrate`).

        Waiting here means the server says it is ready only after the calibration, so
        that nothing else of the server's runs beside it: timed while the first requests
        were being parsed (their thread holding the GIL when a decode returned) or while
        another process loaded a model, a draft line of 0 ms + 40 ms a token was measured
        against a real 22 ms + 2.3 ms, and one greedy stream then never speculated (its
        draft's catch-up on each prompt looked too dear, and re-timing one token at a time
        cannot correct a slope)."""
        self._calibrated.clear()
        self._thread = threading.Thread(target=self._run, name="specgen-scheduler", daemon=True)
        self._thread.start()
        self._calibrated.wait()

    def submit(self, job: Job, sink: Sink) -> Ticket:
        """Queue a job; `sink` gets its events from the worker thread (it must not block).

        Raises:
            DoesNotFit: an empty prompt, or prompt + max_tokens beyond a slot's context.
            QueueFull: queue_max jobs already wait, or the scheduler is shutting down.
        """
        need = len(job.prompt) + job.config.max_tokens
        if not job.prompt:
            raise DoesNotFit("the prompt is empty")
        # a single stream stops at the context's end instead (finish reason "context")
        if need > self.n_ctx_slot and not self.slots.single:
            raise DoesNotFit(
                f"the prompt ({len(job.prompt)} tokens) plus max_tokens"
                f" ({job.config.max_tokens}) is {need} tokens, more than a slot's context of"
                f" {self.n_ctx_slot}"
            )
        ticket = Ticket(job, sink, self.clock())
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            # a job a free slot will take at the next step is not waiting: with --queue 0
            # a free slot still serves. Under the lock `_admit` takes a job from the queue
            # and reserves its slot in one move, so no job is counted twice or not at all
            free = len(self.slots.all) - self.slots.busy
            if len(self._queue) >= self.queue_max + free:
                waiting = max(0, len(self._queue) - free)
                raise QueueFull(f"{waiting} requests are already waiting")
            self._queue.append(ticket)
            self._cond.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The client went away: the job ends with Failed(kind="cancelled") and frees its
        slot at the next step."""
        with self._cond:
            ticket.cancelled = True
            self._cond.notify()

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Stop accepting; jobs in slots end with Done(finish="interrupted"), queued ones
        with Failed(kind="shutdown"); joins the worker thread, which stops after the step
        under way (a llama.cpp decode cannot be interrupted), for at most `timeout_s`
        seconds (None: however long that step takes). Idempotent.

        Returns:
            whether the worker has stopped: only then may the engines be closed (a model
            freed while a decode runs on it is a use-after-free in llama.cpp).
        """
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is None:
            self._finish_all()
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def slots_busy(self) -> int:
        return self.slots.busy

    # -- the worker ---------------------------------------------------------------------

    def _has_work(self) -> bool:
        return bool(self._queue) or self.slots_busy > 0

    def calibrate(self, repeats: int = 3, quick: bool = False) -> list[float] | None:
        """Time the decodes the batch controller's cost lines stand on (as priors,
        `LineFit.set_prior`, `DraftFit.set_prior`): target decodes of one row and of one
        row per slot (one slot: `_CALIBRATE_ROWS`); draft decodes of one token, of one per
        slot, and of `_CALIBRATE_RUN` + 1 tokens with one row (a catch-up's cost per token);
        `repeats` times each after an untimed warm-up (medians). `quick` (the single stream,
        after its first round warmed the target): no warm-ups, and the decodes of several
        rows and of a catch-up timed once, so that its start-up costs about what the ordinary passes
        and draft passes it times anyway cost. Each is appended where its sequences stand
        and removed again, so a cache holding a prompt keeps it.
        Priors, not observations: decodes at the start of empty caches were measured up to
        2x off the server's real ones, and the first real decodes must replace them.
        `start` calls it in the worker thread before any request; the single stream after
        its first round (`specgen.generate`). A no-op without the controller.

        Returns:
            the seconds of each timed one-row target decode (an ordinary pass: the single
            stream's baseline), or None without the controller.

        Raises:
            EngineError: a decode failed (`start`'s worker then serves on the defaults).
        """
        ctl = self.controller
        if ctl is None:
            return None
        n = self.n_parallel

        def timed(engine: BatchEngine, parts: list[SeqDecode], n: int = repeats) -> list[float]:
            seqs = [engine.sequence(part.seq) for part in parts]
            held = [len(seq.tokens) for seq in seqs]
            seconds = []
            for r in range(n + (0 if quick else 1)):
                t0 = self.clock()
                try:
                    engine.decode_batch(parts)
                    if quick or r > 0:
                        seconds.append(self.clock() - t0)
                finally:
                    for seq, m in zip(seqs, held, strict=True):
                        seq.truncate(m)
            return seconds

        def median_s(engine: BatchEngine, parts: list[SeqDecode], n: int = repeats) -> float:
            return statistics.median(timed(engine, parts, n))

        def line(x1: int, y1: float, x2: int, y2: float) -> Line:
            """The line through both points, within `LineFit`'s bounds."""
            fit = LineFit(Line(0.0, 0.0))
            fit.add(x1, y1)
            fit.add(x2, y2)
            return fit.line()

        # the target: one row per token (its decodes score every row)
        once = 1 if quick else repeats
        passes = timed(self.target, [SeqDecode(0, [0], 1)])
        one = statistics.median(passes)
        if n > 1:
            at, many = n, median_s(self.target, [SeqDecode(i, [0], 1) for i in range(n)])
        else:  # a single slot takes a block's rows
            at = _CALIBRATE_ROWS
            many = median_s(self.target, [SeqDecode(0, [0] * at, at)], once)
        target = line(1, one, at, many)
        if self._draft is None:
            ctl.calibrated(target, at)
            return passes
        # the draft: a row per slot drafting a depth, and a catch-up's tokens without one
        one = median_s(self._draft, [SeqDecode(0, [0], 1)])
        run = median_s(self._draft, [SeqDecode(0, [0] * (1 + _CALIBRATE_RUN), 1)], once)
        token_s = max(0.0, (run - one) / _CALIBRATE_RUN)
        if n > 1:
            many = median_s(self._draft, [SeqDecode(i, [0], 1) for i in range(n)])
            draft = line(1, one, n, many)
        else:  # one slot: a depth is always one row
            draft = Line(0.0, one)
        ctl.calibrated(target, at, draft, token_s)
        return passes

    def _run(self) -> None:
        try:
            self.calibrate()
        except EngineError:
            pass  # the default priors, until the first decodes are measured
        finally:
            self._calibrated.set()
        while True:
            with self._cond:
                while not self._stopping and not self._has_work():
                    self._cond.wait()
                if self._stopping:
                    break
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - a bug must not hang every client
                # the exception's name only: its text may quote one request's prompt or
                # grammar, and every request in flight gets this message
                for slot in self.slots.all:
                    if slot.ticket is not None:
                        self.slots.fail(slot, f"internal error ({type(exc).__name__})", "engine")
                self.flush()
        self._finish_all()

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Run steps in this thread until no job is queued or in a slot (tests, without
        `start`). Returns the steps run."""
        n = 0
        while self._has_work() and n < max_steps:
            self.step()
            n += 1
        return n

    def step(self) -> BatchReport:
        """One batched step (see the module docstring); its events are delivered when it
        ends, also when it raises. Worker thread only."""
        try:
            report = self._stepper.run()
            self.last_report = report
            if self.observer is not None:
                try:
                    self.observer(report)
                except Exception:  # noqa: BLE001 - metrics must not stop the rounds
                    pass
            return report
        finally:
            self.flush()

    def _send(self, ticket: Ticket, event: JobEvent) -> None:
        self._outbox.append((ticket, event))

    def flush(self) -> None:
        """Deliver the events sent since the last flush (each step ends with one)."""
        if self._outbox:
            batch, self._outbox = self._outbox, []
            try:
                self.deliver(batch)
            except Exception:  # noqa: BLE001 - delivery must not stop the rounds
                pass

    def _arrival_waits(self) -> bool:
        """Whether a queued request could take a free slot now (it arrived during this
        step: `_admit` at the step's start emptied the queue or the free slots)."""
        return bool(self._queue) and not self._stopping and self.slots_busy < self.n_parallel

    def _reap_cancelled(self) -> None:
        with self._cond:
            gone = [t for t in self._queue if t.cancelled]
            for t in gone:
                self._queue.remove(t)
        for t in gone:
            self._send(t, Failed("cancelled by the client", "cancelled"))
        for slot in self.slots.all:
            if slot.ticket is not None and slot.ticket.cancelled:
                self.slots.end(slot, Failed("cancelled by the client", "cancelled"))

    def admit(self) -> None:
        """Queued jobs take free slots now (a step also admits, twice: `Stepper.run`);
        the single stream places its job at once, so that a bad setting is an error of
        its call. Worker thread only."""
        self._admit()

    def _admit(self) -> None:
        while True:
            with self._cond:
                free = [s for s in self.slots.all if s.ticket is None]
                if not free or not self._queue or self._stopping:
                    return
                source = self._source_of(self._queue[0].job)
                if source is False:  # its choice 0 is still evaluating the prompt
                    return
                ticket = self._queue.popleft()
                prompt = ticket.job.prompt
                if source is not None:
                    slot = min(free, key=lambda s: len(s.target.tokens))
                else:
                    # the slot holding the longest common prefix; among equals the
                    # emptiest, which keeps the other slots' prefixes for the requests
                    # that share them
                    slot = max(free, key=lambda s: (
                        common_prefix(s.target.tokens, prompt[:-1]), -len(s.target.tokens)
                    ))  # fmt: skip
                # reserved while it is placed: a request arriving meanwhile finds the job
                # neither waiting nor its slot free (`submit` counts --queue from both)
                slot.ticket = ticket
            # a choice taking its choice 0's cells drops all the slot held: saved first
            self._reuse(slot, prompt[:-1] if source is None else [])
            self.slots.place(slot, ticket, source)

    def _reuse(self, slot: Slot, prefix: list[int]) -> None:
        """Before `slot` takes a request whose prompt (but its last token) is `prefix`:
        save the cells it would drop to the prompt cache, and give it a saved entry's
        cells where those share more of `prefix` (`specgen.sched.promptcache`)."""
        cache = self.prompt_cache
        if cache is None:
            return
        target: StateView = slot.target  # type: ignore[assignment]  # a SequenceView
        draft: StateView | None = slot.draft  # type: ignore[assignment]
        keep = common_prefix(slot.target.tokens, prefix)
        try:
            if len(slot.target.tokens) > keep:
                cache.save(target, draft)
            entry, n = cache.best(prefix)
            if entry is not None and n > keep:
                cache.restore(entry, target, draft)
        except EngineError:  # no room to restore: that sequence is empty, and evaluated
            pass

    def _source_of(self, job: Job) -> Slot | None | Literal[False]:
        """For a job sharing another's prompt cells: the slot holding that job once its
        prompt (all but the last token) is evaluated there, False while it is not yet,
        None when it is in no slot (or the job shares nothing)."""
        if job.share_from is None:
            return None
        for s in self.slots.all:
            if s.ticket is not None and s.ticket.job.id == job.share_from:
                ready = s.started and s.target.tokens[: len(job.prompt) - 1] == job.prompt[:-1]
                return s if ready else False
        return None

    def _finish_all(self) -> None:
        for slot in self.slots.all:
            if slot.ticket is not None:
                self.slots.end(slot, None, "interrupted")
        with self._cond:
            queued = list(self._queue)
            self._queue.clear()
        for t in queued:
            self._send(t, Failed("the server is shutting down", "shutdown"))
        self.flush()
