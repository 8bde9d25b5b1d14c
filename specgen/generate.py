"""`generate`: one generation as the batch engine (`specgen.sched`) with one slot, yielding
typed events. `run`, `chat`, `bench`, `verify` and the Python API drive this; `specgen
serve` drives the same engine with N slots from a worker thread, so a round is drafted,
verified, accepted and timed by one code, and K is chosen by one controller
(`specgen.control.batch.BatchController`: the goodput choice of SmartSpec, Liu et al.
2024; its N = 1 case here).

The stages live in `specgen.stages`, the round in `specgen.round`, the settings in
`specgen.genconfig`; their names are re-exported here for the callers that drive a
generation.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import threading
from collections.abc import Generator

from specgen.control.batch import BatchController
from specgen.engine import Drafter, Engine, as_batch, under
from specgen.errors import EngineError
from specgen.events import Done, Prefilled, Step
from specgen.genconfig import VERIFY_RULES, GenerateConfig, VerifyRule
from specgen.round import Clock, Sequence
from specgen.sched.jobs import Failed, Job, JobEvent
from specgen.sched.scheduler import Scheduler
from specgen.stages import AutoK, FixedK, KPolicy, check_prompt, time_passes

__all__ = [
    "VERIFY_RULES",
    "AutoK",
    "Event",
    "FixedK",
    "GenerateConfig",
    "KPolicy",
    "OneSlot",
    "StartUp",
    "VerifyRule",
    "check_prompt",
    "generate",
]

Event = Prefilled | Step | Done


@dataclasses.dataclass
class StartUp:
    """A loaded pair's start-up measurements, kept for its later generations as a server
    keeps its own across requests (`specgen.Pair` holds one): the ordinary passes timed at
    the first generation with a drafter (seconds each, `specgen.measure.Baseline`'s
    initial passes), the draft's pass then (seconds, or None), and the batch controller
    calibrated then, whose cost fits and pooled acceptance go on learning from every later
    generation under ``draft_max="auto"``. Empty: the next generation measures.

    Timing only: the law of the output does not depend on K (Leviathan et al. 2023,
    Theorem 3.5), and a fixed K uses no controller."""

    passes: list[float] = dataclasses.field(default_factory=list)
    draft_s: float | None = None
    controller: BatchController | None = None


def generate(
    target: Engine,
    drafter: Drafter | None,
    prompt: list[int],
    config: GenerateConfig,
    policy: KPolicy | None = None,
    clock: Clock | None = None,
    ordinary_first: bool = True,
) -> Generator[Event, None, None]:
    """Generate from `prompt` (token ids), yielding Prefilled, then a Step per round,
    then Done. With `drafter=None` or `FixedK(0)` (the default `policy`) this is ordinary
    decoding; `AutoK` lets the controller choose K each round. The drafter samples under
    `config.params` (`specgen.engine.under`). See `OneSlot` for the start-up and the
    first round (`ordinary_first`).

    A consumer interrupted between events throws ``KeyboardInterrupt`` in (``.throw``):
    that is handled as Ctrl-C inside the loop (the next event is the Done).

    On every exit (limit, stop, EOS, Ctrl-C, exception, the consumer closing the
    generator) both caches are left holding the committed tokens except the last.

    Raises:
        PromptError: empty prompt, or no room in the context (raised by the call itself).
        ConfigError: a setting the engines refuse (a logit bias past the vocabulary),
            raised by the call itself.
        GrammarError: the grammar does not compile (raised by the call itself).
        EngineError: llama.cpp failed.
        KeyboardInterrupt: Ctrl-C during the generation, raised on the next iteration
            after the Done (finish reason "interrupted" unless the last round had already
            ended the generation, whose own reason it then keeps).
    """
    return OneSlot(target, drafter, prompt, config, policy, clock, ordinary_first).events()


class OneSlot:
    """One generation on the batch engine with one slot (built by `generate`).

    The start-up follows the server's rule for a new request: the first round is ordinary
    and rides on the prompt's last batch, so the first token comes at ordinary decoding's
    latency; the draft model's prompt is evaluated only once the controller first drafts
    with it (`specgen.sched.drafting`); then, before the second round's choice of K,
    `config.measure_ordinary` single-row target decodes are timed (the ordinary-decoding
    baseline behind every speedup figure, `specgen.measure.Baseline`) and, with the
    controller, the decodes its cost lines start from (`Scheduler.calibrate`). The law of
    the output does not depend on the K chosen (Leviathan et al. 2023, Theorem 3.5), so
    all of this changes timing only. With a `start_up` that holds them (a loaded pair's
    earlier generation measured them), the passes are not timed again, and under
    `AutoK` its controller chooses K.

    With `ordinary_first` False (`specgen verify`, whose tests must reach speculation from
    the first position), the first round may speculate too.

    Raises:
        PromptError, ConfigError, GrammarError: as `generate`, from the constructor.
    """

    def __init__(
        self,
        target: Engine,
        drafter: Drafter | None,
        prompt: list[int],
        config: GenerateConfig,
        policy: KPolicy | None = None,
        clock: Clock | None = None,
        ordinary_first: bool = True,
        start_up: StartUp | None = None,
    ) -> None:
        check_prompt(prompt, target.n_ctx)
        # q under this generation's own settings, whatever the drafter was loaded with (a
        # logit bias past the vocabulary is refused here, by the call itself)
        drafter = under(drafter, config.params)
        policy = policy or FixedK(0)
        auto = isinstance(policy, AutoK) and drafter is not None
        kwargs = {} if clock is None else {"clock": clock}
        self.start_up = start_up if start_up is not None else StartUp()
        warm = self.start_up.controller if auto else None
        if warm is not None and isinstance(policy, AutoK):
            warm.k_max = policy.k_max
        batch = as_batch(target)
        if not config.reuse_cache:
            # both caches from empty: a call's text then depends on its own settings and
            # seed only (a draft row computed at the end of a longer decode differs in its
            # last bits, and a sampled draw can flip: the same seeded call gave another
            # text after an earlier call had left the draft's cache holding its prompt)
            batch.sequence(0).truncate(0)
            if drafter is not None and drafter.engine is not None:
                drafter.engine.truncate(0)
        self.scheduler = Scheduler(
            batch,
            drafter,
            n_parallel=1,
            queue_max=1,
            draft_max=None if auto else (policy.k if isinstance(policy, FixedK) else 0),
            # a whole prompt in one decode: one request, nobody to stall
            prefill_chunk=target.n_ctx,
            k_max=policy.k_max if isinstance(policy, AutoK) else 16,
            single=True,
            ordinary_first=ordinary_first,
            controller=warm,
            **kwargs,  # type: ignore[arg-type]
        )
        self.config = config
        self._events: collections.deque[JobEvent] = collections.deque()
        self.scheduler.submit(Job("single", prompt, config), self._events.append)
        # placed now: a grammar that does not compile is an error of the call
        self.scheduler.admit()
        slot = self.scheduler.slots.all[0]
        assert slot.seq is not None
        self.seq: Sequence = slot.seq
        self._timed = config.measure_ordinary <= 0
        # the start-up's medians, for the next Step (`_time_start_up`)
        self._medians: tuple[float, float | None] | None = None
        known = self.start_up.passes
        if not self._timed and known and (not auto or warm is not None):
            self._timed = True
            self.seq.baseline.add_initial(known)
            self._medians = (statistics.median(known), self.start_up.draft_s)
        self._reasons: collections.Counter[str] = collections.Counter()
        self._cancelled = threading.Event()  # `cancel`, from any thread

    def cancel(self) -> None:
        """Stop the generation from any thread: after the round under way, the next event
        is the Done (finish "interrupted", or the reason that round already gave it)."""
        self._cancelled.set()

    def events(self) -> Generator[Event, None, None]:
        """The generation's events (see `generate`)."""
        done = False
        interrupted = False
        try:
            while not done:
                if not self._events:
                    if self._cancelled.is_set():
                        yield self._interrupt()
                        return
                    self._step()
                while self._events:
                    event = self._events.popleft()
                    if isinstance(event, Failed):  # only a cancel or shutdown: never here
                        raise EngineError(event.message)
                    done = isinstance(event, Done)
                    if isinstance(event, Step) and self._medians is not None:
                        ordinary_s, draft_s = self._medians
                        self._medians = None
                        event = dataclasses.replace(
                            event, timed_ordinary_s=ordinary_s, timed_draft_s=draft_s
                        )
                    yield event
        except KeyboardInterrupt:
            if done:
                raise  # after the Done: the generation had ended
            interrupted = True
        except BaseException:
            self._abandon()
            raise
        if interrupted:
            # Ctrl-C is never swallowed: the consumer gets the partial Done (`run` shows
            # the text), then the interrupt itself, so a caller looping over generations
            # (bench, verify) stops instead of carrying on with the next one
            yield self._interrupt()
            raise KeyboardInterrupt

    def _step(self) -> None:
        """One step of the engine; its events wait in `_events`."""
        if not self._timed and self.seq.stats.k_history:
            self._time_start_up()
        report = self.scheduler.step()
        self._reasons.update(report.reasons)  # "first" too: the round on the prefill

    def _time_start_up(self) -> None:
        """After the first round, before the second's choice of K: the timed passes (see
        the class); their medians ride on the next Step (`Step.timed_ordinary_s`,
        `timed_draft_s`). Not decoding: the rounds' clocks skip it."""
        self._timed = True
        sched, seq, n = self.scheduler, self.seq, self.config.measure_ordinary
        t0 = sched.clock()
        draft_s = None
        try:
            passes = sched.calibrate(n, quick=True)
            if passes is None:
                passes = time_passes(seq.target, seq.committed[-1], n, sched.clock)
            elif sched.controller is not None and sched.drafting.draft is not None:
                draft_s = sched.controller.draft_line()(1)
        except EngineError:  # no room left to time a pass: the run's own rounds will do
            return
        finally:
            seq.skip(sched.clock() - t0)
        if passes:
            seq.baseline.add_initial(passes)
            ordinary_s = statistics.median(passes)
            self._medians = (ordinary_s, draft_s)
            self.start_up.passes = list(passes)
            if sched.controller is not None:
                self.start_up.draft_s, self.start_up.controller = draft_s, sched.controller

    def _interrupt(self) -> Done:
        """End the job at Ctrl-C: the Done (finish "interrupted", or the reason the last
        round already gave it)."""
        slot = self.scheduler.slots.all[0]
        self.scheduler.slots.end(slot, None, "interrupted")
        self.scheduler.flush()
        done = [e for e in self._events if isinstance(e, Done)]
        self._events.clear()
        assert done, "an interrupted job ends with a Done"
        return done[-1]

    def _abandon(self) -> None:
        """An exception or the consumer closing the generator: roll the caches back to the
        committed tokens (the invariant), sending nothing."""
        try:
            self.seq.rollback()
        except Exception:  # noqa: BLE001 - the original error is the one to raise
            pass

    def summary(self) -> dict[str, object] | None:
        """With the controller (`AutoK` and a drafter), its choices for the stats output
        (`run --json`'s ``controller`` object): K per round, each K's reason
        (`specgen.control.goodput.REASONS`) counted, the fitted cost lines (seconds:
        intercept, slope; the target's against rows, the draft's against slots drafting a
        depth), a draft token's seconds without a row (a catch-up's), the times the
        machine's speed was found changed since the calibration (the lines then rescaled),
        and the acceptance estimate by block position. None with a fixed K."""
        ctl = self.scheduler.controller
        if ctl is None:
            return None
        slot = self.scheduler.slots.all[0]
        t, d = ctl.target.line(), ctl.draft_line()
        alpha = slot.acceptance.alpha_by_pos(ctl.k_max) if slot.acceptance is not None else ()
        return {
            "k_history": list(self.seq.stats.k_history),
            "reasons": dict(self._reasons),
            "target_line_s": [t.intercept_s, t.slope_s],
            "draft_line_s": [d.intercept_s, d.slope_s],
            "draft_token_s": ctl.draft.token_s,
            "spec_overhead_s": ctl.spec_overhead_s,
            "speed_changes": ctl.speed_changes,
            "alpha_by_pos": [round(float(a), 4) for a in alpha],
        }
