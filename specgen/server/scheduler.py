"""The core of `specgen serve`: slots, a bounded queue, and one worker thread that owns
llama.cpp and runs the batched rounds. No HTTP here (see notes: the seam with app.py).

Each step (`Scheduler.step`):
  1. cancelled jobs leave their slot; queued jobs take free slots (the slot whose cache
     shares the longest prefix with the prompt, which then evaluates only the rest);
  2. stage 1 for every slot that is generating: K per slot (fixed, or the batch
     controller's goodput choice; 0 in a request's first round, so that its first token
     comes at ordinary decoding's latency), then the blocks: with a draft model, ONE
     draft decode per depth holds every slot still drafting (llama-server keeps one draft
     context for all slots too), each slot sampling its own row with its own settings and random
     stream (`ModelDrafter.begin`); a model-free drafter drafts per slot. A slot's draft
     is prefilled only once it is chosen to speculate (under load it may never be): its
     prompt is then a catch-up, in the block's first depth, or by `prefill_chunk` chunks
     at K = 0 while longer (`_catch_up`);
  3. stage 2: ONE target decode holding every generating slot's [last, x_1..x_K] and a
     chunk of each prompt being prefilled (at most `prefill_chunk` tokens, so a long
     prompt stalls the others by one chunk at most; a prompt's last chunk carries its
     request's first round, see Admission below);
  4. stages 3-5 per slot through `Sequence.commit`, with that request's own sampling
     settings, random streams and stop strings; only that slot's sequence rolls back.

Admission (issue 37): a request does not wait for a speculative step.
  - Admission happens twice a step: at its start, and again after the draft depths,
    just before the target decode, so a request that arrived while the step drafted has
    its first prompt chunk in that decode (llama-server and vLLM put prompt chunks in the
    same batch as the running requests' decode rows: chunked prefill; Sarathi-Serve,
    Agrawal et al. OSDI 2024, calls such a batch stall-free).
  - An arrival while blocks are drafted (with a slot free for it) cuts every block
    short after the depth under way (`_draft_depths`): the request waits one draft
    depth, not all of them. Exact: a round's law does not depend on its K (Leviathan et
    al. 2023, Theorem 3.5), and the cut depends on the clock, never on the tokens drawn.
  - The prompt's last chunk carries the request's first round (`_first_rounds`:
    `[..., last]` with one logits row, K = 0), so its first token comes from the decode
    that ends its prefill, as llama-server's does, instead of a decode later.
  - While requests wait for their first token the batch controller counts the seconds
    speculation adds once more per waiting request and makes no probe; with
    --slo-ttft/--slo-tpot it also keeps the step within those targets
    (`specgen.batchctl.BatchController`, the goodput of SmartSpec, Liu et al. 2024,
    priced for latency). Each slot's K carries its reason (`BatchReport.reasons`,
    `Step.k_reason`).
  So a short prompt arriving mid-step gets its first token at the end of that step's
  decode; before, it waited for the rest of the step and two whole steps more.

Isolation: slot i's target cells are sequence i of the target's cache and its draft cells
sequence i of the draft's; each request gets its own drafter (q under its own settings)
and its own `Sequence` (random streams from its own seed). A drafter keeps only the prefix
its sequence shares with the new prompt (`ModelDrafter` re-syncs on the first draft), so
nothing drafted for one request is proposed for another. What requests share is
statistics of earlier rounds: the controller's pooled acceptance and prompt lookup's
pooled record per sampling setting (`_lookup_pool`), which value a slot's proposals for
the choice of K, never decide what is proposed or a round's law.

Events leave once per step: what a step sends (each slot's `Step`, the `Done` or `Failed`
that ends a job) waits in an outbox and is handed to `deliver` together when the step
ends, just before the worker goes back into llama_decode. The server's `deliver` wakes its
event loop once for them all; a wake-up per event let the loop take the GIL while the
worker still had other slots to commit (measured in `serve` at four streams: host time
per step 3.6 ms instead of 2.2 ms).

Faults: a llama.cpp failure in the batched decode ends the jobs in that decode with
`Failed(kind="engine")`; a failure while one slot drafts or commits ends that job only.
The others carry on at the next step.
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from specgen.batchctl import (
    Acceptance,
    BatchController,
    Line,
    LineFit,
    SlotState,
    recent_entry,
)
from specgen.drafters import ModelDrafter, Stepwise, common_prefix
from specgen.engine import BatchEngine, Drafter, Engine, Logits, SeqDecode
from specgen.errors import EngineError
from specgen.events import Done, Step
from specgen.generate import FixedK, GenerateConfig
from specgen.hybrid import HybridDrafter, LookupRecord
from specgen.ngram import NgramDrafter
from specgen.round import Proposal, Sequence
from specgen.sampling import SamplingParams

Clock = Callable[[], float]

#: tokens of the catch-up-shaped draft decode `Scheduler.calibrate` times (one row)
_CALIBRATE_RUN = 16
_LOOKUP_POOLS = 64  # sampling settings whose pooled prompt-lookup record is kept


@dataclass(frozen=True)
class Job:
    """One request (or one choice of a request with n > 1): token ids already templated
    and tokenized, and its settings.

    `share_from`: the id of the job (choice 0 of the same request, submitted just before)
    whose prompt cells this one shares instead of evaluating the prompt again: it is
    admitted once that job's prompt is in its slot, which then shares its cells
    (`SequenceView.copy_prefix`, llama_memory_seq_cp); when that job is no longer in a
    slot (ended, cancelled) it evaluates its prompt itself.
    """

    id: str
    prompt: list[int]
    config: GenerateConfig
    share_from: str | None = None


@dataclass(frozen=True)
class Failed:
    """The request ended by an error inside a round, a cancel or a shutdown before it
    started; `kind` is "engine", "shutdown" or "cancelled"."""

    message: str
    kind: str


JobEvent = Step | Done | Failed
Sink = Callable[[JobEvent], None]
#: hands one step's events to their sinks, in the order they were sent (`Scheduler.deliver`)
Deliver = Callable[[list[tuple["Ticket", JobEvent]]], None]


class QueueFull(Exception):
    """`submit` while --queue jobs already wait (or the scheduler is shutting down)."""


class DoesNotFit(Exception):
    """The prompt plus max_tokens can never fit a slot's context (-c), or is empty."""


@dataclass(frozen=True)
class BatchReport:
    """One per step, for /metrics.

    Attributes:
        n_rows: target logits rows decoded in the step (prompt chunks add none).
        n_slots: slots generating in the step.
        k: K chosen per generating slot.
        decode_s: seconds inside the target's llama_decode.
        draft_s: seconds of stage 1 (all slots' drafting).
        step_s: wall seconds of the step.
        host_s: step_s minus the time inside llama_decode (both models).
        queue_depth, slots_busy: after the step.
        target_line, draft_line: the batch controller's cost lines after the step
            (seconds against a decode's rows, and a draft depth's slots); None with a
            fixed K.
        draft_token_s: seconds of a draft token without a logits row (a catch-up's),
            after the step; None with a fixed K.
        spec_overhead_s: the controller's `spec_overhead_s` after the step (None with a
            fixed K).
        itl: (slot index, seconds, tokens) per slot that was sent tokens in the step after
            an earlier step had sent its request some: the gap between the two sends (an
            inter-token latency per streamed chunk, as `specgen bench --url` counts ITL)
            and the tokens of this chunk; a request's first tokens (its TTFT) are not in it.
        reasons: why each K in `k` is what it is (`specgen.batchctl.REASONS`), then
            "first" for each request whose first round rode on its prefill this step.
    """

    n_rows: int
    n_slots: int
    k: tuple[int, ...]
    decode_s: float
    draft_s: float
    step_s: float
    host_s: float
    queue_depth: int
    slots_busy: int
    target_line: Line | None = None
    draft_line: Line | None = None
    spec_overhead_s: float | None = None
    draft_token_s: float | None = None
    itl: tuple[tuple[int, float, int], ...] = ()
    reasons: tuple[str, ...] = ()


class Ticket:
    """A submitted job: pass it to `Scheduler.cancel`. `t_submit`: the scheduler's clock
    when it was queued (what its wait for a first token counts from)."""

    def __init__(self, job: Job, sink: Sink, t_submit: float = 0.0) -> None:
        self.job = job
        self.sink = sink
        self.cancelled = False
        self.t_submit = t_submit


class _Slot:
    def __init__(self, index: int, target: Engine, draft: Engine | None) -> None:
        self.index = index
        self.target = target
        self.draft = draft
        self.ticket: Ticket | None = None
        self.seq: Sequence | None = None
        self.drafter: Drafter | None = None
        self.todo: list[int] = []  # prompt tokens the target has still to evaluate
        self.started = False
        self.t_admit = 0.0
        self.n_prefill = 0
        self.acceptance: Acceptance | None = None
        self.idle = 0  # steps since this slot last speculated
        self.fresh = False  # its request has not had a step that could speculate yet
        self.first = False  # its request has not had a step yet: that one is ordinary
        self.catch_up = 0  # draft tokens it lacks before its next block (as last chosen)
        self.run = 0  # consecutive speculative rounds so far (`BatchController.observe_run`)
        self.t_sent: float | None = None  # clock when its request was last sent tokens
        self.reason = "first"  # why its K is what it is this step (`batchctl.REASONS`)


def _model_part(prop: Proposal, n_accepted: int) -> tuple[int, int]:
    """(k, accepted) of the draft model's part of a round, what the controller's
    acceptance estimate learns from: prompt-lookup tokens (hybrid blocks) have their own
    record (`specgen.hybrid.LookupRecord`), and a failed lookup would otherwise mark the
    model down too, so that a slot whose draft lacks its prompt never drafted with it
    again (the catch-up's cost outweighs a low estimate). (0, 0) where the model's part
    was not reached or there is none; a block without lookup tokens counts as before,
    at the K asked for. The grammar's lead (`Proposal.lead`, always accepted) is not
    part of it."""
    sources = prop.block.sources[prop.lead :]
    n_accepted = max(0, n_accepted - prop.lead)
    if "lookup" not in sources:
        return prop.k, n_accepted
    head = 0
    while head < len(sources) and sources[head] == "lookup":
        head += 1
    m = sources.count("draft")
    if m == 0 or n_accepted < head:
        return 0, 0
    return m, min(m, n_accepted - head)


def _decode_s(engine: BatchEngine | None) -> float:
    return engine.decode_s if engine is not None else 0.0


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
        clock: Clock = time.perf_counter,
        slo_ttft_s: float | None = None,
        slo_tpot_s: float | None = None,
    ) -> None:
        if target.n_seq < n_parallel:
            raise ValueError(f"the target holds {target.n_seq} sequences, not {n_parallel}")
        self.target = target
        self._drafter = drafter
        self._draft: BatchEngine | None = None
        if isinstance(drafter, ModelDrafter | HybridDrafter):
            draft: BatchEngine = drafter.engine  # type: ignore[assignment]  # the loaded one
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
        # one draft decode per depth serves every slot: a depth of n slots costs c0 + c_row n
        # a model-free drafter (n-gram) makes no draft decodes: its blocks cost the
        # target's rows only (host time is in the step's measured costs)
        default = (
            BatchController(draft_batched=True, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
            if self._draft is not None
            else BatchController(
                draft_prior=Line(0.0, 0.0), slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s
            )
        )
        self.controller = (controller or default) if draft_max is None and drafter else None
        self._slots = [
            _Slot(
                i,
                target.sequence(i),
                self._draft.sequence(i) if self._draft is not None else None,
            )
            for i in range(n_parallel)
        ]
        views = [s.target.n_ctx for s in self._slots]
        views += [s.draft.n_ctx for s in self._slots if s.draft is not None]
        self.n_ctx_slot = min(views)
        self._cond = threading.Condition()
        self._queue: collections.deque[Ticket] = collections.deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._calibrated = threading.Event()  # set once `start`'s worker has calibrated
        self.last_report: BatchReport | None = None
        self._itl: list[tuple[int, float, int]] = []  # this step's `BatchReport.itl`
        self._cut = False  # this step's blocks were cut short by an arrival (`_draft_depths`)
        self._n_firsts = 0  # first rounds that rode on their prefill's last chunk this step
        self._undrafted_s = 0.0  # seconds of steps since the draft's cost was last measured
        # prompt lookup's pooled record per sampling setting (`HybridDrafter`'s pool), the
        # least recently used first
        self._lookup_pools: collections.OrderedDict[SamplingParams, LookupRecord] = (
            collections.OrderedDict()
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
        if need > self.n_ctx_slot:
            raise DoesNotFit(
                f"the prompt ({len(job.prompt)} tokens) plus max_tokens"
                f" ({job.config.max_tokens}) is {need} tokens, more than a slot's context of"
                f" {self.n_ctx_slot}"
            )
        ticket = Ticket(job, sink, self.clock())
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._queue) >= self.queue_max:
                raise QueueFull(f"{len(self._queue)} requests are already waiting")
            self._queue.append(ticket)
            self._cond.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The client went away: the job ends with Failed(kind="cancelled") and frees its
        slot at the next step."""
        with self._cond:
            ticket.cancelled = True
            self._cond.notify()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop accepting; jobs in slots end with Done(finish="interrupted"), queued ones
        with Failed(kind="shutdown"); joins the worker thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
        else:
            self._finish_all()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def slots_busy(self) -> int:
        return sum(1 for s in self._slots if s.ticket is not None)

    # -- the worker ---------------------------------------------------------------------

    def _has_work(self) -> bool:
        return bool(self._queue) or self.slots_busy > 0

    def calibrate(self, repeats: int = 3) -> None:
        """Time the decodes the batch controller's cost lines stand on before any request
        (as the single stream times its passes before its first round) and make them the
        lines' priors (`LineFit.set_prior`, `DraftFit.set_prior`): target decodes of one
        row and of one row per slot; draft decodes of one token, of one token per slot,
        and of `_CALIBRATE_RUN` + 1 tokens with one row (a catch-up's cost per token);
        `repeats` times each after an untimed warm-up (medians), in empty sequences that
        are emptied again.
        Priors, not observations: decodes at the start of empty caches were measured up to
        2x off the server's real ones, and the first real decodes must replace them.
        Called by `start` in the worker thread; a no-op without the controller.

        Raises:
            EngineError: a decode failed (`start`'s worker then serves on the defaults).
        """
        ctl = self.controller
        if ctl is None:
            return
        n = self.n_parallel

        def median_s(engine: BatchEngine, parts: list[SeqDecode]) -> float:
            seconds = []
            for r in range(repeats + 1):
                t0 = self.clock()
                engine.decode_batch(parts)
                if r > 0:
                    seconds.append(self.clock() - t0)
                for part in parts:
                    engine.sequence(part.seq).truncate(0)
            return statistics.median(seconds)

        def line(x1: int, y1: float, x2: int, y2: float) -> Line:
            """The line through both points, within `LineFit`'s bounds."""
            fit = LineFit(Line(0.0, 0.0))
            fit.add(x1, y1)
            fit.add(x2, y2)
            return fit.line()

        # the target: one row per token (its decodes score every row)
        one = median_s(self.target, [SeqDecode(0, [0], 1)])
        if n > 1:
            many = median_s(self.target, [SeqDecode(i, [0], 1) for i in range(n)])
        else:  # a single slot takes both tokens
            many = median_s(self.target, [SeqDecode(0, [0, 0], 2)])
        ctl.target.set_prior(line(1, one, max(n, 2), many))
        if self._draft is None:
            return
        # the draft: a row per slot drafting a depth, and a catch-up's tokens without one
        one = median_s(self._draft, [SeqDecode(0, [0], 1)])
        run = median_s(self._draft, [SeqDecode(0, [0] * (1 + _CALIBRATE_RUN), 1)])
        token_s = max(0.0, (run - one) / _CALIBRATE_RUN)
        if n > 1:
            many = median_s(self._draft, [SeqDecode(i, [0], 1) for i in range(n)])
            ctl.draft.set_prior(line(1, one, n, many), token_s)
        else:  # one slot: a depth is always one row
            ctl.draft.set_prior(Line(0.0, one), token_s)

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
                for slot in self._slots:
                    if slot.ticket is not None:
                        self._fail(slot, f"internal error: {exc}", "engine")
                self._flush()
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
            return self._step()
        finally:
            self._flush()

    def _send(self, ticket: Ticket, event: JobEvent) -> None:
        self._outbox.append((ticket, event))

    def _flush(self) -> None:
        if self._outbox:
            batch, self._outbox = self._outbox, []
            try:
                self.deliver(batch)
            except Exception:  # noqa: BLE001 - delivery must not stop the rounds
                pass

    def _step(self) -> BatchReport:
        t_step = self.clock()
        self._itl = []  # filled by `_commit`
        self._cut = False  # set by `_draft_depths` when an arrival cut the blocks short
        inside0 = _decode_s(self.target) + _decode_s(self._draft)
        self._reap_cancelled()
        self._admit()
        for slot in self._slots:
            if slot.seq is not None and not slot.started and not slot.todo:
                self._start(slot)
        active = [s for s in self._slots if s.seq is not None and s.started]
        t_choose = self.clock()
        chosen = self._choose_ks(active)

        t1 = self.clock()
        ks = self._catch_up(active, chosen)
        self._count_runs(active, chosen, ks)
        proposals = self._propose(active, ks)
        retimed = not any(ks) and self._retime_draft(active)
        # a step the controller's residual may learn from: nothing in it but the rounds
        plain = ks == chosen and not retimed and not self._cut
        draft_s = self.clock() - t1

        # a request that arrived while the step drafted joins this step's decode (its
        # first chunk), instead of waiting for the next step's draft depths
        self._admit()
        # rows only where a choice exists: positions the grammar forces get none
        parts = [
            SeqDecode(s.index, p.to_score, len(p.rows), p.rows if p.forced else None)
            for s, p in proposals
        ]
        budget = self.target.n_batch - sum(len(p.tokens) for p in parts)
        chunked = self._prompt_chunks(lambda slot: slot.todo, budget)
        budget -= sum(len(part.tokens) for _, part in chunked)
        firsts, chunked = self._first_rounds(chunked, budget)
        self._n_firsts = len(firsts)
        parts += [part for _, part in chunked]
        chunks = [(slot, len(part.tokens) - part.n_rows) for slot, part in chunked]
        decode0 = _decode_s(self.target)
        rows: list[Logits] | None = None
        verify_s = 0.0
        t2 = self.clock()
        if parts:
            try:
                rows = self.target.decode_batch(parts)
            except EngineError as exc:
                for slot in [s for s, _ in proposals] + [s for s, _ in chunks]:
                    self._fail(slot, str(exc), "engine")
            verify_s = self.clock() - t2
        decode_s = _decode_s(self.target) - decode0
        n_rows = sum(p.n_rows for p in parts)
        if rows is not None:
            for (slot, prop), r in zip(proposals, rows, strict=False):
                self._commit(slot, prop, r, verify_s)
            if self.controller is not None and not chunks:
                # the decode and every slot's stages 3-5: warping, verifying and sampling
                # grow with the rows too (at temperature > 0 over a 262,144-token
                # vocabulary, a cost the decode's own time leaves out)
                self.controller.observe_target(n_rows, self.clock() - t2)
            elif self.controller is not None:  # what the prompt tokens cost beyond the rows
                n_chunk = sum(n for _, n in chunks)
                beyond = self.clock() - t2 - self.controller.target.line()(n_rows)
                self.controller.observe_chunk(n_chunk, beyond)
            for slot, n in chunks:
                del slot.todo[:n]
            chunk_rows = dict(
                zip([s.index for s, _ in chunked], rows[len(proposals) :], strict=True)
            )
            for slot, prop in firsts:
                assert slot.seq is not None
                slot.seq.stats.prefill_s = self.clock() - slot.t_admit
                self._commit(slot, prop, chunk_rows[slot.index], verify_s)
        if self.controller is not None and plain and not chunks and rows is not None:
            # the positions lookup really filled: also those after model tokens, which
            # the choice could not foresee (`HybridDrafting.feed`); a catch-up is
            # evaluated where the model drafts, beyond them
            # and those the grammar forced (no draft pass either)
            filled = {
                slot.index: p.block.sources.count("lookup") + p.block.sources.count("grammar")
                for slot, p in proposals
            }
            free = [min(k, filled.get(s.index, 0)) for s, k in zip(active, ks, strict=True)]
            catch_up = sum(s.catch_up for s, k, f in zip(active, ks, free, strict=True) if k > f)
            self.controller.observe_step(ks, catch_up, self.clock() - t_choose, free)
        for slot in self._slots:
            if slot.seq is not None and not slot.started and not slot.todo:
                self._start(slot)

        step_s = self.clock() - t_step
        inside = _decode_s(self.target) + _decode_s(self._draft) - inside0
        ctl = self.controller
        if ctl is not None and not any(ks):
            self._undrafted_s += step_s
        report = BatchReport(
            n_rows=n_rows,
            n_slots=len(active),
            k=tuple(ks),
            decode_s=decode_s,
            draft_s=draft_s,
            step_s=step_s,
            host_s=max(0.0, step_s - inside),
            queue_depth=self.queue_depth,
            slots_busy=self.slots_busy,
            target_line=ctl.target.line() if ctl is not None else None,
            draft_line=ctl.draft_line() if ctl is not None else None,
            spec_overhead_s=ctl.spec_overhead_s if ctl is not None else None,
            draft_token_s=ctl.draft.token_s if ctl is not None else None,
            itl=tuple(self._itl),
            reasons=tuple(s.reason for s in active) + ("first",) * self._n_firsts,
        )
        self.last_report = report
        if self.observer is not None:
            try:
                self.observer(report)
            except Exception:  # noqa: BLE001 - metrics must not stop the rounds
                pass
        return report

    # -- the step's parts ---------------------------------------------------------------

    def _count_runs(self, active: list[_Slot], chosen: list[int], ks: list[int]) -> None:
        """Count each model-drafting slot's consecutive speculative rounds and report a run
        when it ends at K = 0 (`BatchController.observe_run`); a step spent on a chunk of
        catch-up (chosen K >= 1, run at 0) starts a run rather than ending one."""
        ctl = self.controller
        if ctl is None:
            return
        for slot, k_chosen, k in zip(active, chosen, ks, strict=True):
            if not isinstance(slot.drafter, ModelDrafter | HybridDrafter):
                continue
            if k > 0:
                slot.run += 1
            elif k_chosen == 0 and slot.run:
                ctl.observe_run(slot.run)
                slot.run = 0

    def _catch_up(self, active: list[_Slot], ks: list[int]) -> list[int]:
        """Bring long-behind draft caches forward by a chunk: a slot chosen to speculate
        whose draft lacks more than `prefill_chunk` committed tokens (its prompt, never
        drafted for, or a long stretch at K = 0) evaluates `prefill_chunk` of them (no
        logits rows) in one draft decode with the others' chunks, and stays at K = 0 this
        step; so a long prompt stalls the other slots by one chunk in the draft as in the
        target. Shorter catch-ups go in the block's first depth (`_draft_depths`).

        Returns:
            ks with 0 for every slot that caught up this step.

        Raises nothing: a failed draft decode fails those slots' jobs.
        """
        if self._draft is None:
            return ks
        chunks: list[tuple[_Slot, SeqDecode]] = []
        out = list(ks)
        for i, (slot, k) in enumerate(zip(active, ks, strict=True)):
            d, seq, cache = slot.drafter, slot.seq, slot.draft
            if k == 0 or not isinstance(d, ModelDrafter | HybridDrafter) or cache is None:
                continue
            if slot.catch_up <= self.prefill_chunk:  # set by `_choose_ks` this step
                continue
            assert seq is not None
            context = seq.committed
            (d.model if isinstance(d, HybridDrafter) else d).rollback(context)
            have = len(cache.tokens)
            chunks.append(
                (slot, SeqDecode(slot.index, context[have : have + self.prefill_chunk], 0))
            )
            out[i] = 0
            slot.reason = "catch_up"
        if chunks:
            parts = [part for _, part in chunks]
            t0 = self.clock()
            try:
                self._draft.decode_batch(parts)
            except EngineError as exc:
                for slot, _ in chunks:
                    self._fail(slot, str(exc), "engine")
            else:
                if self.controller is not None:  # tokens without rows: the catch-up's cost
                    n_tokens = sum(len(part.tokens) for part in parts)
                    self.controller.observe_draft(n_tokens, self.clock() - t0, n_rows=0)
        return out

    def _propose(self, active: list[_Slot], ks: list[int]) -> list[tuple[_Slot, Proposal]]:
        """Stage 1 for every generating slot: model blocks drafted together
        (`_draft_depths`), the others by their own drafter."""
        proposals: list[tuple[_Slot, Proposal]] = []
        together: list[tuple[_Slot, int, Stepwise]] = []
        for slot, k in zip(active, ks, strict=True):
            seq, d = slot.seq, slot.drafter
            if seq is None:  # failed earlier in this step
                continue
            try:
                if k > 0 and isinstance(d, ModelDrafter | HybridDrafter):
                    together.append((slot, k, d.begin(seq.draft_context(k), k, seq.draft_rng)))
                else:
                    proposals.append((slot, seq.propose(k)))
            except EngineError as exc:
                self._fail(slot, str(exc), "engine")
        if not together:
            return proposals
        t0 = self.clock()
        try:
            self._draft_depths([(s.index, w) for s, _, w in together])
        except EngineError as exc:
            for slot, _, _ in together:
                self._fail(slot, str(exc), "engine")
            return proposals
        drafted_s = self.clock() - t0
        for slot, k, w in together:
            assert slot.seq is not None
            block = w.block()
            # a block cut short is a round at the K it reached (what its acceptance tests)
            k_run = min(k, len(block.tokens)) if self._cut else k
            if k_run < k:
                slot.reason = "cut"
            proposals.append((slot, slot.seq.propose(k_run, block, drafted_s)))
        return proposals

    def _retime_draft(self, active: list[_Slot]) -> bool:
        """A step without drafting: now and then (`BatchController.retime_due`), time one
        draft decode of one token per model-drafting slot, appended where each slot's
        draft cache stands and removed again, so the draft's cost line follows the machine
        while no slot drafts (a line left high by one slow moment would hold K at 0 for
        good: no drafting, no measurement). The single stream re-times its draft likewise
        (`Controller.retime_draft`).

        Returns:
            whether a draft decode was made.
        """
        ctl, draft = self.controller, self._draft
        if ctl is None or draft is None:
            return False
        # (slot, its draft sequence, that sequence's length now, the token to append)
        held = [
            (s.index, s.draft, len(s.draft.tokens), s.seq.committed[-1]) for s in active
            if isinstance(s.drafter, ModelDrafter | HybridDrafter) and s.draft is not None
            and s.seq is not None and len(s.draft.tokens) < s.draft.n_ctx
        ]  # fmt: skip
        if not held or not ctl.retime_due(len(held), self._undrafted_s):
            return False
        parts = [SeqDecode(i, [token], 1) for i, _, _, token in held]
        t0 = self.clock()
        try:
            draft.decode_batch(parts)
            seconds = self.clock() - t0
        except EngineError:
            return True  # only a measurement: the slots' next blocks re-sync their caches
        finally:
            for _, seq, n, _ in held:
                seq.truncate(n)
        ctl.observe_draft(len(parts), seconds, n_rows=len(parts))
        self._undrafted_s = 0.0
        return True

    def _draft_depths(self, work: list[tuple[int, Stepwise]]) -> None:
        """Drive every slot's block to its end with one draft decode per depth holding
        every slot still drafting (its sequence's pending tokens, one logits row each).
        The first decode also catches each draft sequence up on what its last round
        committed; a decode beyond n_batch tokens is split into several.

        A request that arrives while the blocks are drafted, with a slot free for it,
        cuts every block short after the depth under way (`Stepwise.stop`, setting
        `_cut`): the step goes on to its target decode, which then holds the request's
        first prompt chunk (`_step` admits again before it), so a new request waits one
        draft depth instead of all of them (see `Scheduler`: the admission rule). Exact:
        where a block ends depends on the clock and the queue, never on the tokens drawn,
        and a round's law does not depend on its K (Leviathan et al. 2023, Theorem 3.5).

        Raises:
            EngineError: a draft decode failed (the caller fails every drafting slot).
        """
        assert self._draft is not None
        draft, n_batch = self._draft, self._draft.n_batch
        live = [(seq, d) for seq, d in work if d.pending]
        while live:
            for group in _groups(live, n_batch):
                t0 = self.clock()
                n_tokens = sum(len(d.pending) for _, d in group)
                n_rows = len(group)  # each slot's last pending token: its next q row
                if len(group) == 1 and len(group[0][1].pending) > n_batch:
                    seq, d = group[0]  # a long catch-up: the engine splits it itself
                    d.feed(draft.sequence(seq).decode(d.pending)[-1])
                else:
                    parts = [SeqDecode(seq, d.pending, 1) for seq, d in group]
                    # views, not a copy of the rows: each feed warps and draws from its
                    # row at once and never decodes, so no row outlives the buffer
                    rows = draft.decode_batch(parts, copy=False)
                    for (_, d), r in zip(group, rows, strict=True):
                        d.feed(r[-1])
                # every decode's cost by its tokens, a first depth's catch-up included:
                # the controller charges a slot's catch-up by the same line
                if self.controller is not None:
                    self.controller.observe_draft(n_tokens, self.clock() - t0, n_rows)
                    self._undrafted_s = 0.0
            live = [(seq, d) for seq, d in live if d.pending]
            if live and self._arrival_waits():
                for _, d in live:
                    d.stop()
                self._cut = True
                return

    def _arrival_waits(self) -> bool:
        """Whether a queued request could take a free slot now (it arrived during this
        step: `_admit` at the step's start emptied the queue or the free slots)."""
        return bool(self._queue) and not self._stopping and self.slots_busy < self.n_parallel

    def _first_rounds(
        self, chunked: list[tuple[_Slot, SeqDecode]], budget: int
    ) -> tuple[list[tuple[_Slot, Proposal]], list[tuple[_Slot, SeqDecode]]]:
        """A prompt's last chunk carries its request's first round: the slot starts now,
        and its ordinary round (K = 0: `[last]` with one logits row) joins the chunk in
        this step's decode, so that the first token comes from the decode that ends the
        prefill, as llama-server's does (the prompt's last token is in its prefill batch
        with a row), instead of a decode later, after the next step's draft depths.
        `budget`: tokens the decode has room for beyond `chunked`.

        Returns:
            (the first rounds begun, `chunked` with those slots' chunks extended and the
            slots that failed to start left out).
        """
        firsts: list[tuple[_Slot, Proposal]] = []
        out: list[tuple[_Slot, SeqDecode]] = []
        for slot, part in chunked:
            if len(part.tokens) < len(slot.todo) or budget < 1:
                out.append((slot, part))
                continue
            self._start(slot)
            if slot.seq is None or not slot.started:  # failed: its job has ended
                continue
            slot.first = False  # this round is its ordinary first
            slot.reason = "first"
            prop = slot.seq.propose(0, lead=False)
            out.append((slot, SeqDecode(slot.index, part.tokens + prop.to_score, 1)))
            firsts.append((slot, prop))
            budget -= len(prop.to_score)
        return firsts, out

    def _prompt_chunks(
        self, todo_of: Callable[[_Slot], list[int]], budget: int
    ) -> list[tuple[_Slot, SeqDecode]]:
        """A chunk (at most `prefill_chunk` tokens, no logits rows) of each prefilling
        slot's prompt tokens still to evaluate (`todo_of(slot)`: the target's or the
        draft's), `budget` tokens in all."""
        out: list[tuple[_Slot, SeqDecode]] = []
        for slot in self._slots:
            todo = todo_of(slot)
            if slot.seq is None or slot.started or not todo or budget <= 0:
                continue
            n = min(len(todo), budget, self.prefill_chunk)
            out.append((slot, SeqDecode(slot.index, todo[:n], 0)))
            budget -= n
        return out

    def _reap_cancelled(self) -> None:
        with self._cond:
            gone = [t for t in self._queue if t.cancelled]
            for t in gone:
                self._queue.remove(t)
        for t in gone:
            self._send(t, Failed("cancelled by the client", "cancelled"))
        for slot in self._slots:
            if slot.ticket is not None and slot.ticket.cancelled:
                self._end(slot, Failed("cancelled by the client", "cancelled"))

    def _admit(self) -> None:
        while True:
            free = [s for s in self._slots if s.ticket is None]
            with self._cond:
                if not free or not self._queue or self._stopping:
                    return
                source = self._source_of(self._queue[0].job)
                if source is False:  # its choice 0 is still evaluating the prompt
                    return
                ticket = self._queue.popleft()
            prompt = ticket.job.prompt
            if source is not None:
                self._place(min(free, key=lambda s: len(s.target.tokens)), ticket, source)
                continue
            # the slot holding the longest common prefix; among equals the emptiest,
            # which keeps the other slots' prefixes for the requests that share them
            slot = max(
                free,
                key=lambda s: (common_prefix(s.target.tokens, prompt[:-1]), -len(s.target.tokens)),
            )
            self._place(slot, ticket)

    def _source_of(self, job: Job) -> _Slot | None | Literal[False]:
        """For a job sharing another's prompt cells: the slot holding that job once its
        prompt (all but the last token) is evaluated there, False while it is not yet,
        None when it is in no slot (or the job shares nothing)."""
        if job.share_from is None:
            return None
        for s in self._slots:
            if s.ticket is not None and s.ticket.job.id == job.share_from:
                ready = s.started and s.target.tokens[: len(job.prompt) - 1] == job.prompt[:-1]
                return s if ready else False
        return None

    def _place(self, slot: _Slot, ticket: Ticket, source: _Slot | None = None) -> None:
        job = ticket.job
        slot.ticket = ticket
        slot.t_admit = self.clock()
        slot.t_sent = None
        try:
            slot.drafter = self._drafter_for(slot, job.config.params)
            k_cap = self.draft_max if self.draft_max is not None else self._k_cap()
            slot.seq = Sequence(
                slot.target, slot.drafter, job.prompt, job.config, FixedK(k_cap), self.clock
            )
            if source is not None:  # one prefill for every choice: share its cells
                keep = len(job.prompt) - 1
                slot.target.copy_prefix(source.target, keep)  # type: ignore[attr-defined]
            else:
                keep = common_prefix(slot.target.tokens, job.prompt[:-1])
                slot.target.truncate(keep)
        except Exception as exc:  # noqa: BLE001 - this job fails, the others go on
            self._end(slot, Failed(str(exc), "engine"))
            return
        slot.todo = job.prompt[keep:-1]
        slot.n_prefill = len(slot.todo)
        slot.started = False
        slot.idle = 0
        slot.fresh = slot.first = True
        slot.acceptance = (
            self.controller.new_acceptance(job.config.params) if self.controller else None
        )

    def _k_cap(self) -> int:
        return self.controller.k_max if self.controller is not None else 0

    def _drafter_for(self, slot: _Slot, params: SamplingParams) -> Drafter | None:
        """A drafter of the slot's own: q under this request's settings, in its own
        draft sequence (never another request's state)."""
        d = self._drafter
        if d is None:
            return None
        if isinstance(d, ModelDrafter):
            assert slot.draft is not None
            return ModelDrafter(slot.draft, params, d.n_vocab, d.p_min)
        if isinstance(d, HybridDrafter):
            assert slot.draft is not None
            m = ModelDrafter(slot.draft, params, d.n_vocab, d.model.p_min)
            pool = self._lookup_pool(params)
            return HybridDrafter(m, d.index.n_max, d.index.n_min, d.min_match, pool)
        if isinstance(d, NgramDrafter):
            return NgramDrafter(d.n_vocab, d.index.n_max, d.index.n_min)
        return d  # a single slot: its one drafter

    def _lookup_pool(self, params: SamplingParams) -> LookupRecord:
        """Prompt lookup's pooled record of the requests with these settings
        (`HybridDrafter`'s pool), which values a request's lookups at match lengths it has
        not scored itself: its own record starts from the prior each time (a first lookup
        valued at 0.6, where at temperature 0.8 lookups may be right far less often), and
        under load, where its slot rarely speculates, it hardly learns before the end."""
        return recent_entry(self._lookup_pools, params, LookupRecord, _LOOKUP_POOLS)

    def _start(self, slot: _Slot) -> None:
        assert slot.seq is not None and slot.ticket is not None
        try:
            d = slot.drafter
            if isinstance(d, ModelDrafter | HybridDrafter):
                # the draft's prefill waits for the slot's first block (`_catch_up`): under
                # load the controller may never choose to speculate for this request
                d.prefill(slot.ticket.job.prompt, evaluate=False)
            elif d is not None:
                d.prefill(slot.ticket.job.prompt)
            slot.seq.start(slot.n_prefill, self.clock() - slot.t_admit)
        except EngineError as exc:
            self._fail(slot, str(exc), "engine")
            return
        slot.started = True

    def _choose_ks(self, active: list[_Slot]) -> list[int]:
        """K per slot; also each slot's `catch_up` this step (what `_catch_up`, the
        controller and its residual read)."""
        caps = []
        # the requests whose first token waits for this step: prompts being prefilled, and
        # slots making their first round now (a prompt the cache held but its last token)
        now = self.clock()
        waiting_s = [
            now - s.ticket.t_submit
            for s in self._slots
            if s.ticket is not None and s.seq is not None and (not s.started or s.first)
        ]
        for slot in active:
            seq, d = slot.seq, slot.drafter
            assert seq is not None
            # a request's first step is ordinary decoding: its first token comes at
            # ordinary decoding's latency (the prefill and one target row), where a first
            # block would hold it back by the draft's catch-up on the prompt and K draft
            # decodes (2-4x the TTFT of --draft none on the demo pair); its draft catches
            # up in its next step
            caps.append(0 if slot.first else seq.choose_k())
            slot.reason = "first" if slot.first else "fixed"
            slot.first = False
            behind = d.behind(seq.committed) if isinstance(d, ModelDrafter | HybridDrafter) else 1
            slot.catch_up = max(0, behind - 1)
        if self.controller is None or not active:
            return caps
        states = []
        for slot, cap in zip(active, caps, strict=True):
            seq, d = slot.seq, slot.drafter
            assert seq is not None and slot.acceptance is not None
            left = seq.emitter.remaining
            free, free_alpha = (
                d.lookup_offer(seq.committed, cap) if isinstance(d, HybridDrafter) else (0, None)
            )
            states.append(
                SlotState(
                    slot.acceptance,
                    cap,
                    slot.idle,
                    slot.catch_up,
                    left,
                    slot.fresh,
                    free,
                    free_alpha,
                )
            )
        chunk_tokens = sum(
            min(len(s.todo), self.prefill_chunk)
            for s in self._slots
            if s.seq is not None and not s.started
        )
        choice = self.controller.choose(states, waiting_s=waiting_s, chunk_tokens=chunk_tokens)
        reasons = choice.reasons or ("goodput",) * len(active)
        for slot, k, cap, why in zip(active, choice.k, caps, reasons, strict=True):
            slot.idle = 0 if k > 0 else slot.idle + 1
            slot.fresh = slot.fresh and cap == 0
            slot.reason = "first" if cap == 0 and slot.reason == "first" else why
        return list(choice.k)

    def _commit(self, slot: _Slot, prop: Proposal, rows: Logits, verify_s: float) -> None:
        seq = slot.seq
        if seq is None:  # failed earlier in this step
            return
        try:
            step = replace(seq.commit(prop, rows, verify_s), k_reason=slot.reason)
        except Exception as exc:  # noqa: BLE001 - this job fails, the others go on
            self._fail(slot, str(exc), "engine")
            return
        if self.controller is not None and slot.acceptance is not None:
            k, n = _model_part(prop, step.n_accepted)
            self.controller.observe_round(slot.acceptance, k, n)
        assert slot.ticket is not None
        self._send(slot.ticket, step)
        if step.spans:  # per-slot ITL for /metrics: fairness between slots
            now = self.clock()
            if slot.t_sent is not None:
                self._itl.append((slot.index, now - slot.t_sent, len(step.spans)))
            slot.t_sent = now
        if seq.ended():
            self._end(slot, None)

    def _end(self, slot: _Slot, event: JobEvent | None, reason: str | None = None) -> None:
        """Free the slot: roll its caches back to the committed tokens and send `event`
        (the Done from `Sequence.finish` when None)."""
        seq, ticket = slot.seq, slot.ticket
        if slot.run and self.controller is not None:
            self.controller.observe_run(slot.run)  # a run the request's end ended
        slot.run = 0
        done: JobEvent | None = None
        if seq is not None:
            try:
                seq.rollback()
                if not seq.ended():  # a cancel, a failure or shutdown ends it here
                    done = seq.finish(reason or "interrupted")  # type: ignore[arg-type]
                else:
                    done = seq.finish()
            except Exception:  # noqa: BLE001 - the cache may be broken: start it afresh
                _clear(slot)
        slot.ticket = slot.seq = slot.drafter = None
        slot.started = False
        slot.todo = []
        if ticket is not None:
            ev = event if event is not None else done
            if ev is not None:
                self._send(ticket, ev)

    def _fail(self, slot: _Slot, message: str, kind: str) -> None:
        self._end(slot, Failed(message, kind))

    def _finish_all(self) -> None:
        for slot in self._slots:
            if slot.ticket is not None:
                self._end(slot, None, "interrupted")
        with self._cond:
            queued = list(self._queue)
            self._queue.clear()
        for t in queued:
            self._send(t, Failed("the server is shutting down", "shutdown"))
        self._flush()


def deliver_each(batch: list[tuple[Ticket, JobEvent]]) -> None:
    """The default `Deliver`: each event to its ticket's sink, in order; a sink that
    raises loses that event only."""
    for ticket, event in batch:
        try:
            ticket.sink(event)
        except Exception:  # noqa: BLE001 - one client's broken sink must not stop the rounds
            pass


def _groups(live: list[tuple[int, Stepwise]], n_batch: int) -> list[list[tuple[int, Stepwise]]]:
    """Consecutive groups of at most n_batch pending tokens (a part longer than n_batch
    alone in its group)."""
    groups: list[list[tuple[int, Stepwise]]] = []
    used = n_batch
    for item in live:
        n = len(item[1].pending)
        if used + n > n_batch:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += n
    return groups


def _clear(slot: _Slot) -> None:
    for engine in (slot.target, slot.draft):
        if engine is not None:
            try:
                engine.truncate(0)
            except EngineError:
                pass
