"""The round as a unit: one sequence's state, with the five stages split where a batch must
split them.

A `Sequence` holds what one generation owns: the committed tokens, its `Emitter`, its two
random streams (draft sampling, acceptance), its target (an `Engine`: for the server, one
sequence of a shared context), its drafter and a clock. A round is
`propose(k)` (stage 1: the block and its q rows), a decode of `Proposal.to_score` (stage 2,
made by whoever holds the batch), and `commit(proposal, logits)` (stages 3-5: accept,
the next token, emit, roll back this sequence only). The batch engine (`specgen.sched`)
drives them, one per slot, with one batched target decode per step: `specgen serve` with
N slots, the single stream (`specgen.generate`) with one. K is chosen there, not here.

Invariant before every round (kept by `commit`'s rollback, restored by `finish`): the
target holds exactly the committed tokens except the last one, `last`, which is committed
but not yet evaluated; a model drafter holds a prefix of that.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from specgen.constraints import Chain, MinTokens, eog_ids, processor_for
from specgen.drafters import attach_grammar, attach_min_tokens
from specgen.emit import Emitter
from specgen.engine import Block, Drafter, Engine, Logits
from specgen.events import Done, FinishReason, Prefilled, Span, Stats, Step
from specgen.genconfig import GenerateConfig
from specgen.logprobs import TokenLogprob, token_logprobs
from specgen.measure import Baseline
from specgen.proposal import Proposal, forced_rows
from specgen.stages import (
    check_prompt,
    draft_block,
    make_trace,
    rollback,
    target_distributions,
    verify_block,
    with_lead,
)

if TYPE_CHECKING:
    from specgen.grammarrows import GrammarProcessor

Clock = Callable[[], float]
"""Seconds on a monotonic clock (`time.perf_counter`); tests pass a fake one."""


#: the most tokens the grammar's lead (`Sequence.draft_context`) chains in one round: a
#: bound on a round's batch (a long forced string is spelt over several rounds)
LEAD_MAX = 32


def now() -> float:
    """`time.perf_counter()`, looked up at each call (a test may replace it)."""
    return time.perf_counter()


class Sequence:
    """One generation's state and its round in phases (see the module docstring).

    Args:
        target: the target engine (or one sequence of a shared one).
        drafter: proposes blocks; None for ordinary decoding.
        prompt: token ids; must leave room in the target's context.
        config: the generation's settings (-n, sampling, stop strings, seed, ...).
        clock: seconds, monotonic; every timing the loop reports is read from it
            (`time.perf_counter` when None).

    Raises:
        PromptError: empty prompt, or no room in the context.
    """

    def __init__(
        self,
        target: Engine,
        drafter: Drafter | None,
        prompt: list[int],
        config: GenerateConfig,
        clock: Clock | None = None,
    ) -> None:
        check_prompt(prompt, target.n_ctx)
        self.target = target
        self.drafter = drafter
        self.config = config
        self.clock = clock or now
        # two independent streams: drafting never shifts the acceptance uniforms
        self.draft_rng, self.target_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(config.seed).spawn(2)
        )
        self.emitter = Emitter.of(config, target.token_bytes, target.is_eog)
        self.stats = Stats(n_prompt=len(prompt), verify_rule=config.verify_rule)
        self.committed = list(prompt)
        # the target side's constraints (the drafter holds its own, from the same settings)
        self.processor = processor_for(config.params.constraints, target.n_vocab)
        self.grammar = self._attach_grammar(config, target, drafter, len(prompt))
        self._attach_min_tokens(config, target, drafter, len(prompt))
        self.baseline = Baseline()
        self._t_decode = self.clock()
        self._t_last: float | None = None  # when the last round ended (`commit`)
        # `draft_context`'s lead for the round about to be proposed: (len(committed), lead)
        self._lead: tuple[int, list[int]] = (-1, [])
        self._prompt_lps: list[TokenLogprob] = []  # `score_prompt`'s, prompt tokens 2..

    def _attach_grammar(
        self, config: GenerateConfig, target: Engine, drafter: Drafter | None, n_prompt: int
    ) -> GrammarProcessor | None:
        """The grammar's processors: one for the target's rows (after `processor`: its
        -inf commutes with the bias and penalties), one of its own for the drafter's rows,
        each with its own matcher (synced to the history of each call) and one cache of
        masks between them (`MaskCache`: the two sides' row i follow the same output); a
        drafter used before keeps no earlier generation's grammar.

        Raises:
            GrammarError: the grammar does not compile.
        """
        attach_grammar(drafter, None)
        if config.grammar is None:
            return None
        # start-up time: llguidance loads only for a generation with a grammar
        from specgen.grammar import MaskCache, compile_grammar, tokenizer_for
        from specgen.grammarrows import GrammarProcessor

        g = compile_grammar(config.grammar, tokenizer_for(target))
        masks = MaskCache()
        attach_grammar(drafter, GrammarProcessor(g, n_prompt, masks))
        return GrammarProcessor(g, n_prompt, masks)

    def _attach_min_tokens(
        self, config: GenerateConfig, target: Engine, drafter: Drafter | None, n_prompt: int
    ) -> None:
        """``min_tokens``' processor (`MinTokens`, stateless: one serves both sides) in
        `processor` and on the drafter's rows; a drafter used before keeps no earlier
        generation's."""
        attach_min_tokens(drafter, None)
        if config.min_tokens <= 0:
            return
        ids = (*eog_ids(target), *config.stop_token_ids)
        held = MinTokens(ids, n_prompt, config.min_tokens)
        self.processor = held if self.processor is None else Chain([held, self.processor])
        attach_min_tokens(drafter, held)

    @property
    def _draft_engine(self) -> Engine | None:
        return self.drafter.engine if self.drafter is not None else None

    def _inside(self) -> float:
        d = self._draft_engine
        return self.target.decode_s + (d.decode_s if d is not None else 0.0)

    # -- before the first round ------------------------------------------------------

    def start(self, n_prefill: int, prefill_s: float) -> Prefilled:
        """Begin after the prompt was evaluated (by the batch engine, in a decode that may
        hold other sequences too): record the prefill, return the Prefilled event."""
        self.stats.n_prefill = n_prefill
        self._t_last = None  # the first round's time is no ordinary pass (`commit`)
        return self.prefilled(prefill_s)

    def prefilled(self, prefill_s: float) -> Prefilled:
        """The prompt's evaluation ended `prefill_s` after admission (for a first round
        riding on the prompt's last chunk: once that decode ended): that is the prefill,
        and decoding starts now. Returns the Prefilled event."""
        self.stats.prefill_s = prefill_s
        self._t_decode = self.clock()
        lps = tuple(self._prompt_lps) if self.config.wants_prompt_logprobs else None
        return Prefilled(len(self.committed), prefill_s, None, None, lps)

    def score_prompt(self, rows: Logits) -> None:
        """The prompt's log-probabilities from a chunk's rows
        (`GenerateConfig.prompt_logprobs`; nothing without it): chunks come in order from
        the prompt's first token, and row i of a chunk scores the prompt token after the
        chunk's i-th (`specgen.logprobs.token_logprobs`).

        Args:
            rows: (m, n_vocab) float32 raw target logits of the next m prompt positions.
        """
        n_top = self.config.prompt_logprobs
        if n_top is None:
            return
        done = len(self._prompt_lps)
        end = min(done + 1 + len(rows), self.stats.n_prompt)
        tokens = self.committed[done + 1 : end]
        self._prompt_lps += token_logprobs(rows, tokens, n_top, self.target.token_bytes)

    def skip(self, seconds: float) -> None:
        """`seconds` just spent outside the rounds (the single stream's timed start-up
        passes): no part of decoding, nor of the next round's time."""
        self._t_decode += seconds
        if self._t_last is not None:
            self._t_last += seconds

    # -- one round ---------------------------------------------------------------------

    def ended(self) -> bool:
        """Whether generation is over; closes it first when -n or the context is reached
        (said apart: the fix differs)."""
        e = self.emitter
        if e.finish is None and (e.remaining <= 0 or self._room() < 0):
            e.close("length" if e.remaining <= 0 else "context")
        return e.finish is not None

    def _room(self) -> int:
        # the largest K whose K + 1 tokens keep the prompt and the output within the
        # context, as llama-server and OpenAI count it (the cache would hold one more: the
        # output's last token is never evaluated; one rule for every door, as the server
        # refuses a max_tokens beyond it)
        return self.target.n_ctx - len(self.committed) - 1

    def k_room(self) -> int:
        """The largest K a round may have now: up to K + 1 tokens never run past -n or
        the context (may be below 0 near either end; 0 without a drafter)."""
        if self.drafter is None:
            return 0
        return min(self.emitter.remaining - 1, self._room())

    def draft_context(self, k: int) -> list[int]:
        """The context this round's block of up to k proposals is drafted after: the
        committed tokens, then the grammar's lead, the tokens it allows alone from there
        on (`GrammarProcessor.single`, on the target's matcher), chained whatever k is.

        Each lead token has a one-hot constrained p whatever the logits (see
        `Proposal.full_rows`), so with a one-hot q it is always accepted and needs no
        draft pass and no target row: the grammar drafts it for free (issue 36). Under a
        JSON Schema with fixed separators that is every key, quote, colon and brace the
        schema dictates. Only with a drafter (`--draft none` stays ordinary decoding, one
        token per pass, the baseline) and at most `LEAD_MAX` tokens, within -n and the
        context with room for k more. The lead is kept for the next `propose`, which
        puts it in front of the block."""
        lead: list[int] = []
        if self.grammar is not None and self.drafter is not None:
            cap = min(self.emitter.remaining - 1, self._room(), k + LEAD_MAX) - k
            while len(lead) < cap:
                t = self.grammar.single(self.committed, lead)
                if t is None:
                    break
                lead.append(t)
                if self.target.is_eog(t):
                    break
        self._lead = (len(self.committed), lead)
        return self.committed + lead if lead else self.committed

    def block_room(self) -> int:
        """The most tokens this round's block may hold after the grammar's lead that
        `draft_context` chained (`k_room` less the lead): the bound on the grammar's sole
        tokens, which do not count against K (`specgen.drafters.Drafting`)."""
        at, lead = self._lead
        return max(0, self.k_room() - (len(lead) if at == len(self.committed) else 0))

    def propose(
        self,
        k: int,
        block: Block | None = None,
        drafted_s: float = 0.0,
        lead: bool = True,
        drafted_inside_s: float | None = None,
    ) -> Proposal:
        """Stage 1: up to k proposals with their q rows after the grammar's lead
        (`draft_context`), or `block` when it was drafted elsewhere after
        `draft_context(k)` (the server drafts every slot's block in one decode per
        depth), which took `drafted_s` seconds, `drafted_inside_s` of them inside
        llama_decode (all of them when None) for this sequence's accounting of host time.
        `lead` False: no lead (a round that must be one ordinary pass, the first after
        the prompt)."""
        inside_s = drafted_s if drafted_inside_s is None else drafted_inside_s
        t_start, decode0 = self.clock() - drafted_s, self._inside() - inside_s
        catchup_s = 0.0
        if block is None:
            context = self.draft_context(k) if lead else self.committed
            block = draft_block(self.drafter, context, k, self.draft_rng, self.block_room())
            if k > 0 and self.drafter is not None:
                catchup_s = self.drafter.catchup_s
        at, head = self._lead
        head = head if lead and at == len(self.committed) else []
        self._lead = (-1, [])
        if head:
            block = with_lead(head, block, self.target.n_vocab)
        grammar = None if self.config.wants_logprobs else self.grammar  # every row then
        return Proposal(
            k, block, self.committed[-1], t_start, self.clock(), catchup_s,
            decode0, self._inside(), forced_rows(grammar, self.committed, block),
            len(head),
        )  # fmt: skip

    def commit(
        self,
        proposal: Proposal,
        logits: Logits,
        verify_s: float | None = None,
        k_reason: str | None = None,
    ) -> Step:
        """Stages 3-5 for this sequence, given its rows of the target decode.

        Args:
            proposal: what `propose` returned this round.
            logits: (len(proposal.to_score), n_vocab) float32: row i scores the token after
                to_score[i]; or only the `Proposal.rows` (the forced rows were not
                computed: `Proposal.full_rows` stands in for them). The target's `tokens`
                already include to_score.
            verify_s: seconds of the decode that produced the rows; None: the time since
                drafting ended.
            k_reason: why the controller chose this round's K (`Step.k_reason`).

        Returns:
            The round's Step (spans, counts, timings).
        """
        p, params = proposal, self.config.params
        n_rows = int(logits.shape[0])  # what the decode computed (forced rows skipped)
        logits = p.full_rows(logits)
        if self.config.trace:
            # the trace reads the rows after the rollback, which may re-evaluate evicted
            # window cells: a decode that overwrites the buffer a view of them points into
            logits = np.array(logits)
        t2 = self.clock()
        verify_s = t2 - p.t_drafted if verify_s is None else verify_s
        v = target_distributions(
            logits, params, self.processor, self.committed, p.block.tokens.tolist(),
            self.grammar, lazy=not self.config.trace,  # the trace shows the masked rows
        )  # fmt: skip
        verdict = verify_block(p.block, v, self.target_rng, self.config.verify_rule)
        n, x_next = verdict.n, verdict.x_next
        t3 = self.clock()
        new, spans, eos_lp = self._emit(p.block, n, x_next, logits)
        self.committed.extend(new)
        if (
            self.grammar is not None
            and self.emitter.finish is None
            and self.grammar.stopped(self.committed)
        ):
            # the grammar is complete and allows nothing more but an end-of-generation
            # token: end here, without a target pass for it
            self.emitter.close("stop")
        elif self.grammar is not None and self.emitter.finish == "eos":
            # an end-of-generation token the grammar forced (it allowed end tokens alone,
            # one or several: a grammar of the empty text, which llguidance does not report
            # stopped before its first token) ended the text, not the model
            at = self.grammar.n_prompt + len(self.emitter.tokens)
            if self.grammar.only_ends(self.committed[:at]):
                self.emitter.finish = "stop"
        rollback(self.target, self.drafter, self.committed)
        m = int(p.block.tokens.size)
        t_end = self.clock()
        if p.k == 0 and m == 0 and new and self._t_last is not None:
            # an ordinary pass as this run pays for it, since the previous round ended
            # (the consumer's time between rounds included, as in tokens/s): an all-ordinary
            # run then shows a speedup of 1. Not the first round: it may ride on the
            # prompt's last chunk, and its pass is the first after the prompt's batch
            self.baseline.add_round(t_end - self._t_last)
        self._t_last = t_end
        rejected = None
        if n < m and n < len(new):
            rejected = self.target.token_bytes(int(p.block.tokens[n])).decode("utf-8", "replace")
        trace = None
        if self.config.trace:
            trace = make_trace(
                self.target, self.drafter, self.committed, new, p.block, v.rows, v, verdict,
                self.config.verify_rule,
            )  # fmt: skip
        n_drafted, n_acc = min(m, len(new)), min(n, len(new))
        by_drafted: dict[str, int] = {}  # by proposer, counted as n_drafted and n_acc are
        by_accepted: dict[str, int] = {}
        for i in range(n_drafted):
            src = p.block.source(i)
            by_drafted[src] = by_drafted.get(src, 0) + 1
            if i < n_acc:
                by_accepted[src] = by_accepted.get(src, 0) + 1
        step = Step(
            k=p.k,
            n_proposed=m,
            # proposals count up to the last token that mattered: the rejected x_{n+1}
            # counts once its correction token was reached
            n_drafted=n_drafted,
            n_accepted=n_acc,
            spans=tuple(spans),
            rejected_text=rejected,
            draft_s=p.draft_s,
            verify_s=verify_s,
            sample_s=t3 - t2,
            round_s=t_end - p.t_start,
            trace=trace,
            host_s=(t_end - p.t_start) - (self._inside() - p.decode0),
            draft_host_s=p.draft_s - (p.decode1 - p.decode0),
            n_rows=n_rows,
            ordinary_token_s=self.baseline.token_s,
            n_drafted_by=by_drafted,
            n_accepted_by=by_accepted,
            k_reason=k_reason,
            eos_logprob=eos_lp,
        )
        self.stats.add(step, decode_s=t_end - self._t_decode)
        # an end-of-generation token's span (holding the text it flushed) is no token
        self.stats.n_generated = len(self.emitter.tokens)
        return step

    def _emit(
        self, block: Block, n: int, x_next: int, logits: Logits
    ) -> tuple[list[int], list[Span], TokenLogprob | None]:
        """Push the accepted prefix and the next token through the Emitter; nothing after
        EOS, a stop string or -n is kept. With `config.logprobs` set, each emitted token's
        span carries its log-probabilities from its own row: new[i] is scored by row i;
        so does an end-of-generation token that ended the round (`Step.eos_logprob`,
        returned third)."""
        new = [*block.tokens[:n].tolist(), x_next]
        if self.grammar is not None:
            # nothing after the grammar is complete (ordinary decoding ends there): a
            # block may run past it with end-of-generation tokens the grammar forced,
            # which --ignore-eos would otherwise emit as text (commit then says "stop")
            del new[self.grammar.complete_at(self.committed, new) :]
        spans: list[Span] = []
        n_top = self.config.logprobs

        def scored(i: int, tok: int) -> TokenLogprob | None:  # new[i] under its row i
            if n_top is None:
                return None
            return token_logprobs(logits[i : i + 1], [tok], n_top, self.target.token_bytes)[0]

        eos_lp = None
        for i, tok in enumerate(new):
            source = block.source(i) if i < n else "target"
            before = len(self.emitter.tokens)
            span = self.emitter.push(tok, from_draft=i < n, source=source)
            if span is not None:
                if len(self.emitter.tokens) > before:
                    span = dataclasses.replace(span, logprob=scored(i, tok))
                spans.append(span)
            if self.emitter.finish is not None:
                if self.emitter.finish == "eos":
                    eos_lp = scored(i, tok)
                del new[i + 1 :]
                break
        return new, spans, eos_lp

    # -- the end -----------------------------------------------------------------------

    def rollback(self) -> None:
        """Both caches back to the committed tokens except the last (any exit)."""
        rollback(self.target, self.drafter, self.committed)

    def finish(self, reason: FinishReason | None = None) -> Done:
        """The Done event; `reason` closes a generation still open (Ctrl-C, shutdown)."""
        if reason is not None:
            self.emitter.close(reason)
        self.stats.n_generated = len(self.emitter.tokens)
        self.stats.ordinary_token_s = self.baseline.token_s
        self.stats.baseline_note = self.baseline.disagreement_note()
        assert self.emitter.finish is not None
        e = self.emitter
        complete = None
        if self.grammar is not None:  # whether the output is one the grammar accepts
            m = self.grammar.matcher
            complete = m.sync(list(e.tokens)) and m.accepting
        return Done(e.finish, e.text, tuple(e.tokens), self.stats, complete)  # type: ignore[arg-type]
