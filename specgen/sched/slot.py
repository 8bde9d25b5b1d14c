"""A slot: one llama.cpp sequence in the target's cache (and one in the draft's) and the
job in it, with its state and its life: placed with a job (`Slots.place`), started once
its prompt is evaluated (`Slots.start`), ended (`Slots.end`).

Isolation: slot i's target cells are sequence i of the target's cache and its draft cells
sequence i of the draft's; each request gets its own drafter (q under its own settings)
and its own `Sequence` (random streams from its own seed). A drafter keeps only the prefix
its sequence shares with the new prompt (`ModelDrafter` re-syncs on the first draft), so
nothing drafted for one request is proposed for another. What requests share is
statistics of earlier rounds: the controller's pooled acceptance and prompt lookup's
pooled record per sampling setting (`Slots.lookup_pool`), which value a slot's proposals
for the choice of K, never decide what is proposed or a round's law.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Protocol

import numpy as np

from specgen.control.acceptance import Acceptance
from specgen.control.batch import BatchController, recent_entry
from specgen.drafters import ModelDrafter, Stepwise, common_prefix
from specgen.engine import BatchEngine, Drafter, Engine, under
from specgen.errors import EngineError, GrammarError
from specgen.hybrid import HybridDrafter, LookupRecord
from specgen.ngram import NgramDrafter
from specgen.round import Clock, Sequence
from specgen.sampling import SamplingParams
from specgen.sched.jobs import Failed, JobEvent, Ticket

_LOOKUP_POOLS = 64  # sampling settings whose pooled prompt-lookup record is kept


class BatchDrafter(Protocol):
    """A slot's drafter that drafts with the draft model in the slot's own draft sequence,
    its decodes batched across slots by depth (`Drafting`): `ModelDrafter` and
    `HybridDrafter`. A model-free drafter (n-gram) drafts per slot through its `Sequence`."""

    @property
    def model(self) -> ModelDrafter:
        """The draft-model part, whose cache is the slot's draft sequence."""
        ...

    def behind(self, context: list[int]) -> int: ...

    def prefill(self, context: list[int], evaluate: bool = True) -> None: ...

    def begin(
        self, context: list[int], k: int, rng: np.random.Generator, room: int | None = None
    ) -> Stepwise: ...


def batched(drafter: Drafter | None) -> BatchDrafter | None:
    """`drafter` where it drafts through the draft model's batched decodes, else None."""
    return drafter if isinstance(drafter, ModelDrafter | HybridDrafter) else None


class Slot:
    """One slot's state: its sequences, the job in it and where that job stands."""

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
        self.offer = 0  # block positions its prompt lookup offers this step (a hybrid's)
        self.run = 0  # consecutive speculative rounds so far (`BatchController.observe_run`)
        self.lookup_misses = 0  # held steps its lookup gained nothing (`_lookup_first`)
        self.lookup_held = False  # held to its lookup since a step's catch-up cost said so
        self.t_sent: float | None = None  # clock when its request was last sent tokens
        self.t_first: float | None = None  # clock when its request was sent its first token
        self.streamed = 0  # tokens its request was sent after the first (its TPOT's count)
        self.reason = "first"  # why its K is what it is this step (`goodput.REASONS`)


class Slots:
    """The scheduler's slots (`all`, slot i holding sequence i of each cache) and each
    slot's life. `send` queues an event for its ticket (`Scheduler`'s outbox)."""

    def __init__(
        self,
        target: BatchEngine,
        draft: BatchEngine | None,
        drafter: Drafter | None,
        *,
        n_parallel: int,
        draft_max: int | None,
        controller: BatchController | None,
        clock: Clock,
        send: Callable[[Ticket, JobEvent], None],
        single: bool = False,
        ordinary_first: bool = True,
    ) -> None:
        self._drafter = drafter
        # one slot driven by its caller (`specgen.generate`): a failure is the caller's
        # exception, not a `Failed` event, and the Prefilled event is sent
        self.single = single
        # a request's first round is ordinary (its first token at ordinary decoding's
        # latency); False: the first round may speculate (`specgen verify`)
        self.ordinary_first = ordinary_first
        self.draft_max = draft_max
        self.controller = controller
        self.clock = clock
        self.send = send
        self.all = [
            Slot(i, target.sequence(i), draft.sequence(i) if draft is not None else None)
            for i in range(n_parallel)
        ]
        # prompt lookup's pooled record per sampling setting (`HybridDrafter`'s pool), the
        # least recently used first
        self._lookup_pools: collections.OrderedDict[SamplingParams, LookupRecord] = (
            collections.OrderedDict()
        )

    @property
    def busy(self) -> int:
        return sum(1 for s in self.all if s.ticket is not None)

    def place(self, slot: Slot, ticket: Ticket, source: Slot | None = None) -> None:
        job = ticket.job
        slot.ticket = ticket
        slot.t_admit = self.clock()
        slot.t_sent = slot.t_first = None
        slot.streamed = 0
        try:
            slot.drafter = self.drafter_for(slot, job.config.params)
            # no K policy: the scheduler chooses every slot's K (`Stepper._choose_ks`)
            slot.seq = Sequence(slot.target, slot.drafter, job.prompt, job.config, self.clock)
            if source is not None:  # one prefill for every choice: share its cells
                keep = len(job.prompt) - 1
                slot.target.copy_prefix(source.target, keep)  # type: ignore[attr-defined]
            else:
                keep = common_prefix(slot.target.tokens, job.prompt[:-1])
                if job.config.wants_prompt_logprobs:
                    keep = 0  # every prompt position needs its row: cached cells have none
                slot.target.truncate(keep)
        except Exception as exc:  # noqa: BLE001 - this job fails, the others go on
            self.fail(slot, exc, "engine")
            return
        slot.todo = job.prompt[keep:-1]
        slot.n_prefill = len(slot.todo)
        slot.started = False
        slot.idle = 0
        slot.lookup_misses = 0
        slot.lookup_held = False
        slot.fresh = True
        slot.first = self.ordinary_first
        slot.acceptance = (
            self.controller.new_acceptance(job.config.params) if self.controller else None
        )

    def k_cap(self) -> int:
        """The largest K of any slot's round: --draft-max, or the controller's ceiling."""
        if self.draft_max is not None:
            return self.draft_max
        return self.controller.k_max if self.controller is not None else 0

    def drafter_for(self, slot: Slot, params: SamplingParams) -> Drafter | None:
        """A drafter of the slot's own: q under this request's settings, in its own
        draft sequence (never another request's state)."""
        d = self._drafter
        if d is None:
            return None
        if self.single:  # the caller's drafter, under its request's settings
            return under(d, params)
        if isinstance(d, ModelDrafter):
            assert slot.draft is not None
            return ModelDrafter(slot.draft, params, d.n_vocab, d.p_min)
        if isinstance(d, HybridDrafter):
            assert slot.draft is not None
            m = ModelDrafter(slot.draft, params, d.n_vocab, d.model.p_min)
            pool = self.lookup_pool(params)
            return HybridDrafter(m, d.index.n_max, d.index.n_min, d.min_match, pool)
        if isinstance(d, NgramDrafter):
            return NgramDrafter(d.n_vocab, d.index.n_max, d.index.n_min)
        return d  # a single slot: its one drafter

    def lookup_pool(self, params: SamplingParams) -> LookupRecord:
        """Prompt lookup's pooled record of the requests with these settings
        (`HybridDrafter`'s pool), which values a request's lookups at match lengths it has
        not scored itself: its own record starts from the prior each time (a first lookup
        valued at 0.6 sampled, where at temperature 0.8 lookups may be right far less
        often), and under load, where its slot rarely speculates, it hardly learns before
        the end."""
        return recent_entry(
            self._lookup_pools, params, lambda: LookupRecord.for_params(params), _LOOKUP_POOLS
        )

    def start(self, slot: Slot, announce: bool = True) -> None:
        """The slot's prompt is evaluated (or its last chunk is in this step's decode):
        its request starts, its drafter is prefilled (a model draft only once the slot
        first drafts), and its Prefilled event is sent where `announces` says (unless
        `announce` is False: the step sends it once the decode holding the last chunk is
        done)."""
        assert slot.seq is not None and slot.ticket is not None
        try:
            d, b = slot.drafter, batched(slot.drafter)
            if b is not None:
                # the draft's prefill waits for the slot's first block (`Drafting.catch_up`): under
                # load the controller may never choose to speculate for this request
                b.prefill(slot.ticket.job.prompt, evaluate=False)
            elif d is not None:
                d.prefill(slot.ticket.job.prompt)
            if isinstance(d, (HybridDrafter, NgramDrafter)):
                # set (or cleared) per generation: a single stream's drafter is the caller's
                d.index.predict(slot.ticket.job.config.prediction)
            prefilled = slot.seq.start(slot.n_prefill, self.clock() - slot.t_admit)
        except EngineError as exc:
            self.fail(slot, exc, "engine")
            return
        slot.started = True
        if announce and self.announces(slot):
            self.send(slot.ticket, prefilled)
        if announce and slot.seq.ended():  # max_tokens 0: the prompt alone (its logprobs)
            self.end(slot, None)

    def announces(self, slot: Slot) -> bool:
        """Whether the slot's job gets its Prefilled event: a single stream's always, the
        server's when it asked for the prompt's log-probabilities (which it carries)."""
        assert slot.seq is not None
        return self.single or slot.seq.config.wants_prompt_logprobs

    def end(self, slot: Slot, event: JobEvent | None, reason: str | None = None) -> None:
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
                self.send(ticket, ev)

    def fail(self, slot: Slot, exc: Exception | str, kind: str) -> None:
        """End the slot's job with `Failed` (the message of `exc`); with `single`, roll the
        slot back and raise `exc` instead: the single stream's caller gets the error
        itself (an `EngineError`, a `GrammarError`), as from any call.

        Raises:
            Exception: `exc`, with `single`.
        """
        if self.single and isinstance(exc, Exception):
            if slot.seq is not None:
                try:
                    slot.seq.rollback()
                except Exception:  # noqa: BLE001 - the cache may be broken: start it afresh
                    _clear(slot)
            raise exc
        if isinstance(exc, GrammarError):  # the request's own grammar, not the engine
            kind = "grammar"
        self.end(slot, Failed(str(exc), kind))


def _clear(slot: Slot) -> None:
    """Empty both of the slot's sequences (after a failure that may have left them broken)."""
    for engine in (slot.target, slot.draft):
        if engine is not None:
            try:
                engine.truncate(0)
            except EngineError:
                pass
