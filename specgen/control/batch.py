"""The server's policy: K per slot each step, for the most tokens per second over the batch.

`BatchController` fits the costs from the decodes the server makes (`specgen.control.costs`),
keeps each request's acceptance (`specgen.control.acceptance`), and chooses K per slot with
the goodput optimizer (`specgen.control.goodput.choose`), under its rules for probes,
waiting requests and latency targets.

Pure: numpy only.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import InitVar, dataclass, field
from typing import TypeVar

import numpy as np

from specgen.control.acceptance import Acceptance
from specgen.control.costs import DraftFit, Line, LineFit
from specgen.control.goodput import Choice, SlotInput, choose, expected_gains, step_seconds
from specgen.control.latency import StepCosts, Targets

_RESIDUAL_WINDOW = 32  # steps in each of `BatchController.observe_step`'s medians
_FORGET_EVERY = 4  # steps without speculation that forget one speculating step's residual
_POOLS = 64  # sampling settings whose pooled acceptance `BatchController` keeps
_RUN_WINDOW = 64  # recent runs of speculative rounds `BatchController.run_rounds` averages
_RUN_MIN = 4  # runs seen before their mean bounds the catch-up share
#: pooled positions tested (per sampling setting) below which a request's first rounds
#: are warm-up rounds (`BatchController.warmup_rounds`)
_WARM_POOL = 16
#: target decodes of a calibrated size whose median speed against the calibration decides
#: whether the machine changed (`BatchController.observe_target`), and by how much it must
#: have changed, either way
_SPEED_WINDOW = 16
_SPEED_CHANGE = 2.0


_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


def recent_entry(
    entries: collections.OrderedDict[_K, _V], key: _K, make: Callable[[], _V], cap: int
) -> _V:
    """entries[key], made by `make` when absent, marked the most recently used (last); the
    least recently used beyond `cap` entries are dropped (the per-sampling-setting pools
    of `BatchController` and of the server's prompt lookup)."""
    if key not in entries:
        entries[key] = make()
    entries.move_to_end(key)
    while len(entries) > cap:
        entries.popitem(last=False)
    return entries[key]


def _with_reasons(choice: Choice, reasons: tuple[str, ...]) -> Choice:
    return Choice(
        choice.k,
        choice.expected_tokens,
        choice.step_s,
        choice.goodput,
        choice.goodput_ordinary,
        reasons,
    )


@dataclass(frozen=True)
class SlotState:
    """What the scheduler knows of one active slot each step.

    Attributes:
        acceptance: the request's estimate.
        k_cap: its room (-n, context, --draft-max); 0 for a slot without a drafter.
        idle_steps: steps since it last speculated (for probing).
        catch_up: committed tokens its draft cache lacks beyond the one the first depth
            always evaluates (`SlotInput.catch_up`).
        left: tokens it may still emit (0 = unknown).
        first: the request's first step that may speculate (the server makes its first
            step ordinary, `specgen.sched`).
        free: positions a prompt-lookup match proposes this step (`SlotInput.free`).
        free_alpha: the estimated acceptance rate of each of those lookup tokens
            (`HybridDrafter.lookup_offer`), which replaces the request's estimate at
            positions 1..free; None: the request's estimate there too.
        streamed_s, streamed: seconds since the request's first token was sent, and the
            tokens sent after it (0 and 0 before and at its first): its TPOT so far, what
            `slo_tpot_s` bounds.
    """

    acceptance: Acceptance
    k_cap: int
    idle_steps: int = 0
    catch_up: int = 0
    left: int = 0
    first: bool = False
    free: int = 0
    free_alpha: float | None = None
    streamed_s: float = 0.0
    streamed: int = 0


@dataclass(eq=False)
class BatchController:
    """Fits the costs from the decodes the engine makes, keeps the pooled acceptance rate
    (each new request's prior), and chooses K per slot (`choose`): for `specgen serve`'s N
    slots and for the single stream's one.

    A request's first step that may speculate (its first is ordinary) is a K = 1 probe at
    least when its draft cache already holds its prompt (the probe then costs one draft
    token and one row). Otherwise the prompt is the draft's
    catch-up, charged by its share like any other: the server prefills a draft only once
    a slot is chosen to speculate, and a forced probe would buy a whole draft prefill per
    request (at 4 sampled streams on a CPU, about a tenth of the run).

    After that, a slot held at K = 0 is probed with K = 1 now and then, so a low acceptance
    estimate can recover, but only while a probe costs at most `probe_budget` of the time
    the slot spent idle: a probe first makes the draft catch up on every token the slot
    committed while idle (c_tok seconds each), so where the catch-up grows faster per step
    than the budget (a CPU under load) there are none (probes every 32 steps had cost 16%
    of the time at 4 sampled streams).

    Latency (issue 37; docs/design/controller.md has the rationale and sources): with W
    requests waiting for their first token behind the step, every second speculation adds
    to it is counted 1 + W times (still linear, so `choose` stays exact), and no probe is
    made meanwhile (Sarathi-Serve, Agrawal et al., OSDI 2024, on generation stalls). With
    `slo_ttft_s` / `slo_tpot_s` (--slo-ttft, --slo-tpot) the choice is held within them
    (`specgen.control.latency`: a draft depth fewer at a time, down to K = 0).

    Warm-up: while the pooled evidence for a setting is thin (fewer than `_WARM_POOL`
    tested positions: a single stream's first rounds, a server's first requests), a
    request's first `warmup_rounds` model rounds speculate at the best K >= 1 for that slot
    alone, unless the draft can never pay (a draft token costs at least an ordinary pass),
    and never while someone waits or a latency target binds. Without it one unlucky first
    block held a single stream at K = 0 for good (its probes' catch-up grew as fast as their
    budget): 0.77 acceptance greedy on the demo pair, 0.8x the previous controller.

    With no request waiting and no --slo-tpot (the defaults) the choice is goodput's alone,
    as before. Each slot's K carries its reason (`Choice.reasons`, `REASONS`).

    Args:
        k_max: --draft-max's ceiling for auto (per slot, before room caps it).
        target_prior, draft_prior: the cost lines used before measurements exist.
        probe_every: fewest idle steps before a probe (0 = never probe).
        probe_budget: most seconds a probe may cost (its row, its one-token depth, its
            catch-up) per second the slot has been idle (at the predicted ordinary step).
        draft_batched: one draft decode per depth serves every slot (fit S(n) = c0 +
            c_row n from `observe_draft`, `DraftFit`); False when each slot drafts in its
            own decodes, so a depth drafted by n slots costs n single-slot passes (S(n) =
            S(1) n).
        draft_token_prior: seconds of a draft token evaluated without a logits row (a
            catch-up) before measurements exist; draft_prior's slope when None.
        slo_ttft_s: the time-to-first-token target (--slo-ttft), seconds; None: none.
        slo_tpot_s: the TPOT target (--slo-tpot), seconds; None: none; 0: ordinary's.
        warmup_rounds: a request's first rounds with the model that speculate while the
            pooled evidence is thin (see Warm-up above; 0 = none).
        fade_untested: each request's `Acceptance.fade` (1 = none): 0.8 for the single
            stream, whose K otherwise stayed below a deep position rejected once early
            (0.86x the previous controller at temperature 0.8 on the demo pair); none for
            the server, where it cost 6-11% at four sampled streams (the controller page).
    """

    k_max: int = 16
    target_prior: InitVar[Line] = Line(0.040, 0.005)
    draft_prior: InitVar[Line] = Line(0.0, 0.020)
    probe_every: int = 32
    probe_budget: float = 0.02
    draft_batched: bool = False
    draft_token_prior: InitVar[float | None] = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    warmup_rounds: int = 3
    fade_untested: float = 1.0
    target: LineFit = field(init=False)
    draft: DraftFit = field(init=False)

    def __post_init__(
        self, target_prior: Line, draft_prior: Line, draft_token_prior: float | None
    ) -> None:
        self.target = LineFit(target_prior)
        self.draft = DraftFit(draft_prior, draft_token_prior)
        # pooled (tested, hits) per sampling setting, least recently used first
        self._pools: collections.OrderedDict[Hashable, list[float]] = collections.OrderedDict()
        # (measured - predicted) seconds of recent whole steps, without and with
        # speculation: see `observe_step`
        self._residual: dict[bool, collections.deque[float]] = {
            False: collections.deque(maxlen=_RESIDUAL_WINDOW),
            True: collections.deque(maxlen=_RESIDUAL_WINDOW),
        }
        self._ordinary_steps = 0
        # speculative rounds of each recent run of them (see `observe_run`)
        self._runs: collections.deque[int] = collections.deque(maxlen=_RUN_WINDOW)
        # recent prompt chunks' target seconds per token (`observe_chunk`)
        self._chunk: collections.deque[float] = collections.deque(maxlen=_RESIDUAL_WINDOW)
        # the last all-zero choice's inputs, for `retime_due`
        self._idle_inputs: tuple[list[SlotInput], float] | None = None
        # the target's decodes of a calibrated size over the calibration's prediction
        self._speed: collections.deque[float] = collections.deque(maxlen=_SPEED_WINDOW)
        self._calibrated_rows = 0  # none until `calibrated`
        self.speed_changes = 0  # times the machine's speed was found changed (`observe_target`)

    def calibrated(
        self, target: Line, rows: int, draft: Line | None = None, token_s: float | None = None
    ) -> None:
        """The start-up's measurements (`Scheduler.calibrate`) as the cost lines' priors:
        the target's `target` (timed at 1 and `rows` rows) and, where a draft was timed,
        its depth `draft` and a token without a row at `token_s` seconds; from here
        `observe_target` compares the target's decodes of at most `rows` rows with them."""
        self.target.set_prior(target)
        if draft is not None:
            self.draft.set_prior(draft, token_s)
        self._calibrated_rows = rows
        self._speed.clear()

    def observe_target(self, rows: int, seconds: float) -> None:
        """A target decode of `rows` scored rows (and no prompt chunk) took `seconds`.

        A machine that changed speed since the calibration (a start-up timed while another
        process loaded a model; another tenant come or gone) is followed: where the median
        of the last `_SPEED_WINDOW` decodes of a calibrated size is `_SPEED_CHANGE` times
        faster or slower than the calibration gives, both models' priors are scaled by
        that ratio and what the fits have seen is dropped. A slow moment after a true
        calibration is left to the fits' staleness (`LineFit`, `DraftFit.tick`): either
        way, costs measured in a busy moment once held every K at 0 for good (2026-12-05,
        in a `scripts/bench_serve.sh` run: a `specgen serve` whose first request ran slow
        made no proposal for 17 requests in a row)."""
        self.target.add(rows, seconds)
        self.draft.tick()
        prior = self.target.prior
        if not 0 < rows <= self._calibrated_rows or prior(rows) <= 0:
            return
        self._speed.append(seconds / prior(rows))
        if len(self._speed) < _SPEED_WINDOW:
            return
        ratio = statistics.median(self._speed)
        if 1 / _SPEED_CHANGE < ratio < _SPEED_CHANGE:
            return
        c0, c_row, c_tok = self.draft.prior
        self.target = LineFit(Line(prior.intercept_s * ratio, prior.slope_s * ratio))
        self.draft = DraftFit(Line(c0 * ratio, c_row * ratio), c_tok * ratio)
        self._speed.clear()
        self.speed_changes += 1

    def observe_draft(self, n_tokens: int, seconds: float, n_rows: int | None = None) -> None:
        """One draft decode of `n_tokens` tokens with `n_rows` logits rows (a depth: one
        row per slot drafting it, the other tokens a catch-up; every token a row when
        None) took `seconds`."""
        self.draft.add(n_tokens if n_rows is None else n_rows, n_tokens, seconds)

    def observe_step(
        self, ks: Sequence[int], catch_up: int, seconds: float, free: Sequence[int] = ()
    ) -> None:
        """A whole step (no prompt chunks) whose slots used block sizes `ks` (`free` of
        each filled by prompt lookup, `SlotInput.free`), evaluating `catch_up` tokens of
        draft catch-up in all, took `seconds`. Its residual against the lines' prediction
        (everything the step does outside the fitted decodes: choosing, beginning blocks,
        building proposals) is kept for the recent steps with and without speculation
        apart; `spec_overhead_s` compares their medians."""
        t, c, tok = self.target.line(), self.draft_line(), self.draft.token_s
        free = list(free) + [0] * (len(ks) - len(free))
        slots = [SlotInput((), k, free=f) for k, f in zip(ks, free, strict=True)]
        predicted = step_seconds(ks, t, c, 0.0, slots, token_s=tok) + tok * catch_up
        spec = any(k > 0 for k in ks)
        self._residual[spec].append(seconds - predicted)
        if not spec:
            # steps without speculation say nothing new of its overhead: forget it slowly,
            # so that one busy moment while speculating cannot hold K at 0 for good
            self._ordinary_steps += 1
            if self._ordinary_steps % _FORGET_EVERY == 0 and self._residual[True]:
                self._residual[True].popleft()

    def observe_run(self, rounds: int) -> None:
        """A slot's run of consecutive speculative rounds ended after `rounds` of them (it
        was held at K = 0, or its request ended). A catch-up is paid at the start of a run
        and serves that run only: the draft falls behind again as soon as the slot stops
        drafting. The catch-up share assumed a slot, once speculating, speculates to the
        end of its request; under load, where slots start and stop as others come and go,
        runs were a few rounds long and each start paid a catch-up of the whole context
        again (at four sampled streams on 2 CPU cores, 8% of the time went to drafting
        that about 450 draft tokens used, and the server made 0.92x `--draft none`)."""
        if rounds > 0:
            self._runs.append(rounds)

    @property
    def run_rounds(self) -> float:
        """Mean speculative rounds per run over the recent runs; 0 (not known) until
        `_RUN_MIN` runs have been seen."""
        if len(self._runs) < _RUN_MIN:
            return 0.0
        return float(statistics.fmean(self._runs))

    @property
    def spec_overhead_s(self) -> float:
        """Seconds a speculating step costs beyond its rows and depths: the median residual
        of recent speculating steps less that of recent ordinary ones (0 where none were
        seen: a bias against speculation of the ordinary steps' own host time, ~1 ms on
        this CPU; medians, because a shared machine's stalls of a second must not stop
        speculation on their own). Never negative; 0 until a speculating step was seen,
        and again once `_RESIDUAL_WINDOW` * `_FORGET_EVERY` ordinary steps followed it."""
        spec, plain = self._residual[True], self._residual[False]
        if not spec:
            return 0.0
        return max(0.0, statistics.median(spec) - (statistics.median(plain) if plain else 0.0))

    def draft_line(self) -> Line:
        """Seconds of one draft depth as a function of the slots drafting it (a row and a
        token each); a token without a row costs `draft.token_s` more."""
        line = self.draft.line()
        return line if self.draft_batched else Line(0.0, line(1))

    def observe_round(self, acceptance: Acceptance, k: int, n_accepted: int) -> None:
        """A slot's round: its own estimate and its pool's."""
        if k <= 0:
            return
        acceptance.update(k, n_accepted)
        pool = self._pool(acceptance.pool)
        pool[0] += min(n_accepted + 1, k)
        pool[1] += min(n_accepted, k)

    def new_acceptance(self, pool: Hashable = None) -> Acceptance:
        """A fresh estimate for a new request, its prior the rate pooled so far over the
        requests of the same `pool` (the server's: the request's sampling settings), made
        optimistic by one standard deviation of its Beta(hits + 1, misses + 1) posterior:
        0.79 with no evidence, the pooled rate once there is much. Optimism in the face of
        uncertainty (as UCB bandits): with the plain mean (0.5) the first requests on a
        CPU never speculated, so acceptance was never measured and never could be.

        One pool per setting, because acceptance depends on it: on the demo pair greedy
        rounds accept about 0.8 of the tested positions, rounds at temperature 0.8 about
        half as many. With one pool for all, every sampled request after greedy ones began
        at a greedy prior, and its draft catch-up and first blocks at four slots were
        loss before its own counts brought K down (in-process: 0.91x `--draft none` at
        temperature 0.8 after 8 greedy requests). The last `_POOLS` settings are kept."""
        tested, hits = self._pool(pool)
        n = tested + 2.0
        mean = (hits + 1.0) / n
        prior = min(1.0, mean + math.sqrt(mean * (1.0 - mean) / (n + 1.0)))
        return Acceptance(prior, pool=pool, fade=self.fade_untested)

    def _pool(self, key: Hashable) -> list[float]:
        return recent_entry(self._pools, key, lambda: [0.0, 0.0], _POOLS)

    def choose(
        self,
        states: Sequence[SlotState],
        fixed_s: float = 0.0,
        waiting_s: Sequence[float] = (),
        chunk_tokens: int = 0,
    ) -> Choice:
        """K per slot for this step, probes included (see the class), for the requests
        waiting behind it too (the latency rule, in the class docstring).

        Args:
            states: the active slots.
            fixed_s: seconds the step costs whatever K is.
            waiting_s: per request waiting for its first token behind this step (its
                prompt being prefilled), the seconds since it arrived.
            chunk_tokens: prompt tokens the step's decode will hold beside the rounds:
                the latency targets count them (`chunk_token_s` each), goodput does not
                (they cost the same whatever K is).

        Returns:
            The Choice, with a reason per slot (`REASONS`).
        """
        slots = []
        runs = self.run_rounds
        for st in states:
            cap = max(0, min(self.k_max, st.k_cap))
            free = min(max(0, st.free), cap)
            alpha = st.acceptance.alpha_by_pos(cap)
            if free and st.free_alpha is not None:
                # lookup tokens have their own rate; the model drafts the positions after
                alpha = (st.free_alpha,) * free + alpha[free:]
            slots.append(SlotInput(alpha, cap, st.catch_up, st.left, free, runs))
        costs = self.costs()
        t, c, spec, tok = costs.target, costs.draft, costs.spec_s, costs.token_s
        weight = 1.0 + len(waiting_s)
        got = costs.choose(slots, fixed_s, weight)
        reason = "goodput"
        if waiting_s and got.k != costs.choose(slots, fixed_s).k:
            reason = "waiting"
        chunk_s = self.chunk_token_s * max(0, chunk_tokens)
        streams = [(st.streamed_s, st.streamed) for st in states]
        targets = Targets(self.slo_ttft_s, self.slo_tpot_s)
        got, bound = targets.within(
            costs, slots, streams, got, waiting_s, fixed_s + chunk_s, weight
        )
        reason = bound or reason
        self._idle_inputs = None if any(got.k) else (slots, fixed_s)
        got = _with_reasons(got, (reason,) * len(slots))
        if waiting_s or bound:
            return got  # no probe or warm-up makes a waiting request or a latency target wait
        ks, reasons = list(got.k), list(got.reasons)
        for i, (s, st) in enumerate(zip(slots, states, strict=True)):
            warm = self._warm_up_k(s, st, t, c, tok, spec)
            if warm > ks[i]:
                ks[i], reasons[i] = warm, "warm_up"
        if self.probe_every:
            idle_s = got.step_s if not any(got.k) else step_seconds([0] * len(slots), t, c, fixed_s)
            for i, (s, st) in enumerate(zip(slots, states, strict=True)):
                if ks[i] == 0 and (
                    st.first and s.k_max > 0 and not s.catch_up
                    or self._probe_pays(s, st, idle_s, t, c, tok)
                ):  # fmt: skip
                    ks[i], reasons[i] = 1, "probe"
        if tuple(ks) == got.k:
            return got
        n = sum(float(expected_gains(s.alpha_by_pos, k)[k]) for s, k in zip(slots, ks, strict=True))
        sec = step_seconds(ks, t, c, fixed_s, slots, spec, tok)
        return Choice(
            tuple(ks), n, sec, n / sec if sec > 0 else 0.0, got.goodput_ordinary, tuple(reasons)
        )

    def _warm_up_k(
        self, slot: SlotInput, st: SlotState, target: Line, draft: Line, token_s: float,
        spec_s: float,
    ) -> int:  # fmt: skip
        """The K a warm-up round of this slot takes (see the class), 0 where none is due:
        the K >= 1 with the most tokens per second for this slot alone, E(K) over
        T(K + 1) + K S(1) + its catch-up + the speculative overhead. No warm-up where the
        catch-up could not be won back in the tokens left even with every draft accepted
        (K + 1 tokens a round): a long prompt's catch-up made a short answer twice as
        slow as ordinary decoding (1,543 prompt tokens, -n 64: 5.3 s against 1.6 s)."""
        if (
            slot.k_max <= 0
            or st.acceptance.tested[0] >= self.warmup_rounds
            or self._pool(st.acceptance.pool)[0] >= _WARM_POOL
            or draft(1) >= target(1)  # no K can pay
        ):
            return 0
        gains = expected_gains(slot.alpha_by_pos, slot.k_max)
        ks = np.arange(1, slot.k_max + 1)
        rounds = target.intercept_s + target.slope_s * (ks + 1) + ks * draft(1) + spec_s
        catch_up_s = token_s * slot.catch_up
        if slot.left > 0 and catch_up_s > 0:
            best_saving = float(np.max(target(1) - rounds / (ks + 1)))  # a token, at best
            if catch_up_s >= slot.left * best_saving:
                return 0
        return int(ks[np.argmax(gains[1:] / (rounds + catch_up_s))])

    def observe_chunk(self, n_tokens: int, seconds: float) -> None:
        """A target decode holding `n_tokens` prompt tokens beside its rounds took `seconds`
        more than the target's line gives for its rows: their cost per token is kept (the
        last `_RESIDUAL_WINDOW`), for the latency targets' prediction of a step."""
        if n_tokens > 0:
            self._chunk.append(max(0.0, seconds) / n_tokens)

    @property
    def chunk_token_s(self) -> float:
        """Seconds of a prompt token in a target decode (no logits row): the median of the
        recent chunks' cost per token; the target line's slope (a row's cost, an
        overestimate) until a chunk has been seen."""
        if not self._chunk:
            return self.target.line().slope_s
        return float(statistics.median(self._chunk))

    def costs(self) -> StepCosts:
        """The cost lines a step is predicted from now."""
        return StepCosts(
            self.target.line(), self.draft_line(), self.spec_overhead_s, self.draft.token_s
        )

    def retime_due(self, n_tokens: int, undrafted_s: float) -> bool:
        """Whether to time one draft decode of `n_tokens` now, `undrafted_s` seconds of
        steps after the draft's cost was last measured: as rarely as keeps those decodes
        within `probe_budget` of the time, and only
        where a draft at half the fitted cost would make the last choice speculate (where
        the target's rows alone rule speculation out, re-timing the draft cannot change
        it, and would cost its 2%)."""
        if not (
            self.draft_batched
            and undrafted_s > 0
            and self.draft_line()(n_tokens) <= self.probe_budget * undrafted_s
        ):
            return False
        if self._idle_inputs is None:
            return True
        slots, fixed_s = self._idle_inputs
        c = self.draft_line()
        half = Line(c.intercept_s / 2, c.slope_s / 2)
        spec, tok = self.spec_overhead_s, self.draft.token_s / 2
        return any(choose(slots, self.target.line(), half, fixed_s, spec, tok).k)

    def _probe_pays(
        self,
        slot: SlotInput,
        st: SlotState,
        step_s: float,
        target: Line,
        draft: Line,
        token_s: float,
    ) -> bool:
        """Whether a K = 1 probe of this idle slot costs at most probe_budget of the time
        it has been idle (its steps at the ordinary step's predicted seconds)."""
        if slot.k_max <= 0 or st.idle_steps < self.probe_every:
            return False
        cost = target.slope_s + draft(1) + token_s * slot.catch_up
        return cost <= self.probe_budget * st.idle_steps * step_s
