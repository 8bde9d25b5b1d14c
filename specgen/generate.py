"""`generate`: the driver of one single-stream `Stream` (a `specgen.round.Sequence` with
the single stream's start-up: prefill, baseline, rounds, Done), yielding typed events. The
stages live in `specgen.stages`, the round in `specgen.round`, the settings in
`specgen.genconfig`; their names are re-exported here for the callers that drive a
generation."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator

from specgen.drafters import ModelDrafter
from specgen.engine import Drafter, Engine, under
from specgen.events import Done, Prefilled, Step
from specgen.genconfig import VERIFY_RULES, GenerateConfig, VerifyRule
from specgen.hybrid import HybridDrafter
from specgen.round import Clock, Sequence
from specgen.stages import FixedK, KPolicy, check_prompt, prefill

__all__ = [
    "VERIFY_RULES",
    "Event",
    "FixedK",
    "GenerateConfig",
    "KPolicy",
    "Stream",
    "VerifyRule",
    "check_prompt",
    "generate",
    "prefill",
]

Event = Prefilled | Step | Done


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
    then Done. With `drafter=None` (or K = 0) this is ordinary decoding. The drafter
    samples under `config.params` (`specgen.engine.under`). The first round
    is an ordinary pass unless `ordinary_first` is False (`Stream.prefill`:
    the first token at ordinary decoding's latency; the law of the output is the same
    either way). A consumer
    interrupted between events throws ``KeyboardInterrupt`` in (``.throw``): that is
    handled as Ctrl-C inside the loop (the next event is the Done).

    On every exit (limit, stop, EOS, Ctrl-C, exception, the consumer closing the
    generator) both caches are left holding the committed tokens except the last.

    Raises:
        PromptError: empty prompt, or no room in the context (raised by the call itself).
        ConfigError: a setting the engines refuse (a logit bias past the vocabulary),
            raised by the call itself.
        EngineError: llama.cpp failed.
        KeyboardInterrupt: Ctrl-C during the generation, raised on the next iteration
            after the Done (finish reason "interrupted" unless the last round had already
            ended the generation, whose own reason it then keeps).
    """
    # built now, not at the first event: a bad prompt or setting (a logit bias past the
    # vocabulary, checked when the drafter is rebuilt under the generation's settings) is
    # raised by the call itself; q under this generation's own settings, whatever the
    # drafter was loaded with
    drafter = under(drafter, config.params)
    return _drive(Stream(target, drafter, prompt, config, policy, clock), ordinary_first)


def _drive(seq: Stream, ordinary_first: bool) -> Generator[Event, None, None]:
    """`generate`'s events from a built Sequence (see there)."""
    # A flag, not the finish reason: a Ctrl-C that lands after the final round closed
    # the emitter (during its rollback or bookkeeping) must still reach the caller.
    interrupted = False
    try:
        yield seq.prefill(ordinary_first)
        while not seq.ended():
            yield seq.step()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        seq.rollback()  # the invariant, whatever happened
    yield seq.finish("interrupted" if interrupted else None)
    if interrupted:
        # Ctrl-C is never swallowed: the consumer gets the partial Done (`run` shows the
        # text), then the interrupt itself, so a caller looping over generations (bench,
        # verify) stops instead of carrying on with the next one.
        raise KeyboardInterrupt


class Stream(Sequence):
    """A single stream's `Sequence` (`run`, `chat`, `bench`, `verify`, the Python API):
    its own prefill, and `step`, one round with its own target decode. Its start-up
    follows the server's rule for a new request (`specgen.sched`): the first round
    is ordinary, and the draft model's prompt is evaluated only before the first round
    the model drafts in."""

    # set by `prefill`: the first round is ordinary, the start-up follows it, and the
    # draft model's prompt waits for the first round the model drafts in
    _first_ordinary = _start_due = _draft_due = False

    def prefill(self, ordinary_first: bool = True) -> Prefilled:
        """Evaluate the prompt (all but its last token) in the target only: a single
        stream's first token comes at ordinary decoding's latency.

        The first `step` is then an ordinary pass (K = 0), whatever the policy; the timed
        passes `config.measure_ordinary` asks for run after it, before the second round
        (`_start_up`); and the draft model's prompt is evaluated only before the first
        round the model drafts in (`_model_due`): one rule with the server, which
        prefills a slot's draft only once the controller chooses to speculate for it.
        Rounds of prompt lookup alone (`--draft ngram`, or a hybrid drafter whose lookup
        fills the block) never wait for it, and a run that never drafts with the model
        (a draft slower than its target, a text that only copies) never pays for it. With
        a first round that speculated, the first token waited for the draft's prefill, K
        draft decodes and a K + 1-row verify (`bench` TTFT 274 ms against 134 ms ordinary
        on the demo pair). The law of the output does not depend on the K chosen
        (Leviathan et al. 2023, Theorem 3.5), so this changes timing only.

        With `ordinary_first` False (`specgen verify`, whose tests must reach speculation
        from the first position), both models evaluate the prompt, the passes are timed
        now, and the policy chooses the first round's K.
        """
        t0 = self.clock()
        n = prefill(
            self.target, self.drafter, self.committed, self.config.reuse_cache, ordinary_first
        )
        self._first_ordinary = ordinary_first
        self._draft_due = ordinary_first and self._model is not None
        return self.start(n, self.clock() - t0, measure=not ordinary_first)

    def _start_up(self) -> tuple[float | None, float | None]:
        """After a single stream's first round (`prefill`): the timed passes, before the
        second round's choice of K, so the policy chooses from the same measurements as
        when they preceded the first round. The draft's passes are timed where its cache
        stands (its prompt is not evaluated yet: `_model_due`); a single-token pass costs
        about the same there. As then, their time is in neither `decode_s` nor the
        rounds' costs."""
        t0 = self.clock()
        timed = self._time_start()
        # the start-up is not decoding: the rounds' clocks start after it
        self._t_decode += self.clock() - t0
        self._t_last = self.clock()
        return timed

    @property
    def _model(self) -> ModelDrafter | None:
        """The drafter's draft-model part (a `HybridDrafter`'s model), None without one."""
        d = self.drafter
        return d.model if isinstance(d, ModelDrafter | HybridDrafter) else None

    def _model_due(self, k: int) -> int:
        """Before a single stream's round of block size k > 0 while the draft model's
        prompt is not evaluated yet (`prefill`): the block size to run.

        A hybrid drafter whose prompt lookup offers positions (`HybridDrafter.lookup_offer`)
        runs a round of lookup tokens alone, at most k of them: the model would only
        continue a block the lookup began, and its first token would cost the whole
        prompt's evaluation. Otherwise the model drafts this round: its prompt (the
        committed tokens but the last, `ModelDrafter.prefill`, with its rolled-back
        warm-up pass) is evaluated first, counted in `prefill_s` and not in `decode_s`
        (as when it ran before the first round), so the block's first decode evaluates
        `last` only and the policy sees no catch-up cost for it. Any K is exact: a lookup
        token's q is one-hot whatever the block size (`specgen.hybrid`)."""
        model = self._model
        assert model is not None
        if isinstance(self.drafter, HybridDrafter):
            free, _ = self.drafter.lookup_offer(self.draft_context(k), k)
            if free > 0:
                return min(k, free)
        t0 = self.clock()
        model.prefill(self.committed)
        self._draft_due = False
        seconds = self.clock() - t0
        self.stats.prefill_s += seconds
        self._t_decode += seconds
        return k

    def step(self) -> Step:
        """One round for a single stream: propose, one target decode, commit.

        After `prefill`, the first round is an ordinary pass (K = 0, chosen by no policy
        and reported to none: its pass is the first single-token decode after the
        prompt's batch, slow from graph set-up), and the start-up measurements run before
        the second (`_start_up`), whose Step carries their medians. The draft model's
        prompt is evaluated before the first round it drafts in (`_model_due`)."""
        timed = None
        forced = self._first_ordinary
        if forced:
            self._first_ordinary, self._start_due = False, True
            proposal = self.propose(0, lead=False)
        else:
            if self._start_due:
                self._start_due = False
                timed = self._start_up()
            k = self.choose_k()
            if k > 0 and self._draft_due:
                k = self._model_due(k)
            proposal = self.propose(k)
        if proposal.forced:  # rows only where the grammar leaves a choice
            logits = self.target.decode(proposal.to_score, rows=proposal.rows)
        else:
            logits = self.target.decode(proposal.to_score, all_logits=True)
        step = self.commit(proposal, logits, observe=not forced)
        if timed is not None:
            step = dataclasses.replace(step, timed_ordinary_s=timed[0], timed_draft_s=timed[1])
        return step
