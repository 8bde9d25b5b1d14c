"""Drafting across slots: the blocks of every slot chosen to speculate, with ONE draft
decode per depth holding every slot still drafting (llama-server keeps one draft context
for all slots too), each slot sampling its own row with its own settings and random
stream (`ModelDrafter.begin`); a model-free drafter drafts per slot.

A slot's draft is prefilled only once it is chosen to speculate (under load it may never
be): its prompt is then a catch-up, made before the block's first depth or in it, and by
`prefill_chunk` chunks at K = 0 while longer (`Drafting.catch_up`). While no slot drafts,
the draft's cost is re-timed now and then (`Drafting.retime_draft`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from specgen.control.batch import BatchController
from specgen.drafters import Stepwise
from specgen.engine import BatchEngine, Logits, SeqDecode
from specgen.errors import EngineError
from specgen.proposal import Proposal
from specgen.round import Clock
from specgen.sched.slot import Slot, batched

LATENCY_CHUNK = 64
"""Draft tokens of a catch-up one decode evaluates while a slot is free for a new request
(`Drafting.catch_up`), whose admission waits for the decode under way: 64 tokens, about
110 ms on the 2-vCPU AMD EPYC of issue 37 (1.7 ms a token without a row). A catch-up made
whole in a block's first depth (up to `prefill_chunk`, 256 tokens, about 435 ms there) was
most of the slowest first tokens at two sampled streams: a request arriving as the other
slot's first block began waited for its whole catch-up, then its own prefill (600 ms
against a 150 ms median)."""


@dataclass(eq=False)
class Drafting:
    """Stage 1 across the slots, for one draft engine with a sequence per slot.

    Args:
        draft: the draft engine (None: a model-free drafter or none).
        controller: the batch controller, told the draft's measured costs (None: fixed K).
        clock: seconds.
        prefill_chunk: most draft tokens one slot catches up on in a step.
        fail: ends a slot's job with `Failed` (`Slots.fail`).
        arrival_waits: whether a queued request could take a free slot now
            (`Scheduler._arrival_waits`): the blocks are then cut short.
        slot_free: whether a slot is free (a request arriving now would be admitted
            after the decode under way): catch-ups then go by `LATENCY_CHUNK` pieces.
    """

    draft: BatchEngine | None
    controller: BatchController | None
    _: KW_ONLY
    clock: Clock
    prefill_chunk: int
    fail: Callable[[Slot, Exception | str, str], None]
    arrival_waits: Callable[[], bool]
    slot_free: Callable[[], bool] = lambda: False
    cut: bool = field(default=False, init=False)
    """This step's blocks were cut short by an arrival (`_draft_depths`)."""
    undrafted_s: float = field(default=0.0, init=False)
    """Seconds of steps since the draft's cost was last measured."""
    failed: dict[int, Exception] = field(default_factory=dict, init=False)
    """Slots (by index) whose own drafting failed in `_draft_depths` (their grammar): the
    others' blocks go on, and `propose` fails these alone."""

    def count_runs(self, active: list[Slot], chosen: list[int], ks: list[int]) -> None:
        """Count each model-drafting slot's consecutive speculative rounds and report a run
        when it ends at K = 0 (`BatchController.observe_run`); a step spent on a chunk of
        catch-up (chosen K >= 1, run at 0) starts a run rather than ending one."""
        ctl = self.controller
        if ctl is None:
            return
        for slot, k_chosen, k in zip(active, chosen, ks, strict=True):
            if batched(slot.drafter) is None:
                continue
            if k > 0:
                slot.run += 1
            elif k_chosen == 0 and slot.run:
                ctl.observe_run(slot.run)
                slot.run = 0

    def catch_up(self, active: list[Slot], ks: list[int]) -> list[int]:
        """Bring draft caches that are behind forward before the blocks are drafted, by
        decodes without logits rows holding every such slot's tokens:

        - a slot chosen to speculate whose draft lacks more than `prefill_chunk` committed
          tokens (its prompt, never drafted for, or a long stretch at K = 0) evaluates
          `prefill_chunk` of them and stays at K = 0 this step (at a fixed K it makes no
          round at all, `Stepper.run`), so a long prompt stalls the other slots by one
          chunk in the draft as in the target;
        - while a slot is free for a new request (`slot_free`), a catch-up longer than
          `LATENCY_CHUNK` is made here too where the model is to draft (K beyond the
          prompt-lookup tokens offered, `Slot.offer`), the slot keeping its K (its first
          depth then holds only the token its row comes from);
        - else a catch-up goes in the block's first depth (`_draft_depths`).

        While a slot is free the tokens go by pieces of `LATENCY_CHUNK`, and a request that
        arrives between two pieces ends the catch-up there (the blocks are then cut before
        their first depth): an arrival waits for one piece at most. With a request already
        waiting no catch-up is made and those slots stay at K = 0 ("waiting"). A hybrid
        slot held to prompt lookup (`lookup_first`) is left alone: it drafts no model
        block. Exact: what is caught up when depends on the clock and the queue only.

        Returns:
            ks with 0 for every slot held to a chunk or by a waiting request.

        Raises nothing: a failed draft decode fails those slots' jobs.
        """
        if self.draft is None:
            return ks
        out = list(ks)
        free, waiting = self.slot_free(), self.arrival_waits()
        todo: list[tuple[Slot, list[int]]] = []  # each slot's tokens to evaluate
        for i, (slot, k) in enumerate(zip(active, ks, strict=True)):
            d, seq, cache = batched(slot.drafter), slot.seq, slot.draft
            # a slot held to its lookup tokens drafts no model block this step, so its
            # catch-up waits too (`_lookup_first`)
            if k == 0 or d is None or cache is None or slot.reason == "lookup_first":
                continue
            long = slot.catch_up > self.prefill_chunk  # set by `Stepper._choose_ks`
            # a block prompt lookup fills (K within its offer) needs no draft decode:
            # no catch-up for it here, as none in a first depth
            ahead = free and slot.catch_up > LATENCY_CHUNK and k > slot.offer
            if not long and not ahead:
                continue
            if waiting:
                out[i], slot.reason = 0, "waiting"
                continue
            assert seq is not None
            context = seq.committed
            d.model.rollback(context)
            have = len(cache.tokens)
            n = self.prefill_chunk if long else slot.catch_up  # the last token left: its row
            todo.append((slot, context[have : have + n]))
            if long:
                out[i], slot.reason = 0, "catch_up"
        piece = LATENCY_CHUNK if free else max((len(t) for _, t in todo), default=0)
        at = 0
        while todo and not (at and self.arrival_waits()):
            todo = [(slot, toks) for slot, toks in todo if len(toks) > at]
            if not todo:
                break
            parts = [SeqDecode(slot.index, toks[at : at + piece], 0) for slot, toks in todo]
            t0 = self.clock()
            try:
                self.draft.decode_batch(parts)
            except EngineError as exc:
                for slot, _ in todo:
                    self.fail(slot, exc, "engine")
                return out
            if self.controller is not None:  # tokens without rows: the catch-up's cost
                n_tokens = sum(len(part.tokens) for part in parts)
                self.controller.observe_draft(n_tokens, self.clock() - t0, n_rows=0)
            at += piece
        return out

    def propose(self, active: list[Slot], ks: list[int]) -> list[tuple[Slot, Proposal]]:
        """Stage 1 for every generating slot: model blocks drafted together
        (`_draft_depths`), the others by their own drafter."""
        proposals: list[tuple[Slot, Proposal]] = []
        together: list[tuple[Slot, int, Stepwise]] = []
        for slot, k in zip(active, ks, strict=True):
            seq, d = slot.seq, batched(slot.drafter)
            if seq is None:  # failed earlier in this step
                continue
            try:
                if k > 0 and d is not None:
                    context = seq.draft_context(k)
                    w = d.begin(context, k, seq.draft_rng, seq.block_room())
                    together.append((slot, k, w))
                else:
                    proposals.append((slot, seq.propose(k)))
            except Exception as exc:  # noqa: BLE001 - this job fails (its grammar...), the others go on
                self.fail(slot, exc, "engine")
        if not together:
            return proposals
        t0, inside0 = self.clock(), self.draft.decode_s if self.draft is not None else 0.0
        self.failed.clear()
        try:
            self._draft_depths([(s.index, w) for s, _, w in together])
        except EngineError as exc:
            for slot, _, _ in together:
                self.fail(slot, exc, "engine")
            return proposals
        drafted_s = self.clock() - t0
        inside_s = (self.draft.decode_s if self.draft is not None else 0.0) - inside0
        for slot, k, w in together:
            assert slot.seq is not None
            if slot.index in self.failed:
                self.fail(slot, self.failed[slot.index], "engine")
                continue
            block = w.block()
            # a block cut short is a round at the K it reached (what its acceptance tests)
            k_run = min(k, len(block.tokens) - len(block.sole)) if self.cut else k
            if k_run < k:
                slot.reason = "cut"
            proposals.append(
                (slot, slot.seq.propose(k_run, block, drafted_s, drafted_inside_s=inside_s))
            )
        return proposals

    def retime_draft(self, active: list[Slot]) -> bool:
        """A step without drafting: now and then (`BatchController.retime_due`), time one
        draft decode of one token per model-drafting slot, appended where each slot's
        draft cache stands and removed again, so the draft's cost line follows the machine
        while no slot drafts (a line left high by one slow moment would hold K at 0 for
        good: no drafting, no measurement).

        Returns:
            whether a draft decode was made.
        """
        ctl, draft = self.controller, self.draft
        if ctl is None or draft is None:
            return False
        # (slot, its draft sequence, that sequence's length now, the token to append)
        held = [
            (s.index, s.draft, len(s.draft.tokens), s.seq.committed[-1]) for s in active
            if batched(s.drafter) is not None and s.draft is not None
            and s.seq is not None and len(s.draft.tokens) < s.draft.n_ctx
        ]  # fmt: skip
        if not held or not ctl.retime_due(len(held), self.undrafted_s):
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
        self.undrafted_s = 0.0
        return True

    def _draft_depths(self, work: list[tuple[int, Stepwise]]) -> None:
        """Drive every slot's block to its end with one draft decode per depth holding
        every slot still drafting (its sequence's pending tokens, one logits row each).
        The first decode also catches each draft sequence up on what its last round
        committed; a decode beyond n_batch tokens is split into several.

        A request that arrives while the blocks are drafted, with a slot free for it,
        cuts every block short after the depth under way, or before the first one
        (`Stepwise.stop`, setting `cut`): the step goes on to its target decode, which
        then holds the request's first prompt chunk (`Stepper.run` admits again before
        it), so a new request waits one draft depth instead of all of them (see
        `specgen.sched.step`: admission). Exact: where a block ends depends on the clock
        and the queue, never on the tokens drawn, and a round's law does not depend on its
        K (Leviathan et al. 2023, Theorem 3.5).

        Raises:
            EngineError: a draft decode failed (the caller fails every drafting slot).
        """
        assert self.draft is not None
        draft, n_batch = self.draft, self.draft.n_batch
        live = [(seq, d) for seq, d in work if d.pending]
        while live:
            if self.arrival_waits():  # before any depth too: it came as the step began
                for _, d in live:
                    d.stop()
                self.cut = True
                return
            for group in _groups(live, n_batch):
                t0 = self.clock()
                n_tokens = sum(len(d.pending) for _, d in group)
                n_rows = len(group)  # each slot's last pending token: its next q row
                if len(group) == 1 and len(group[0][1].pending) > n_batch:
                    seq, d = group[0]  # a long catch-up: the engine splits it itself
                    self._feed(seq, d, draft.sequence(seq).decode(d.pending)[-1])
                else:
                    parts = [SeqDecode(seq, d.pending, 1) for seq, d in group]
                    # views, not a copy of the rows: each feed warps and draws from its
                    # row at once and never decodes, so no row outlives the buffer
                    rows = draft.decode_batch(parts, copy=False)
                    for (seq, d), r in zip(group, rows, strict=True):
                        self._feed(seq, d, r[-1])
                # every decode's cost by its tokens, a first depth's catch-up included:
                # the controller charges a slot's catch-up by the same line
                if self.controller is not None:
                    self.controller.observe_draft(n_tokens, self.clock() - t0, n_rows)
                    self.undrafted_s = 0.0
            live = [(seq, d) for seq, d in live if d.pending]

    def _feed(self, seq: int, d: Stepwise, row: Logits) -> None:
        """`d.feed(row)`; a failure of the slot's own (its grammar's matcher) ends its block
        and is kept in `failed`, so that one request's grammar never fails the others in
        the batch (a regex whose lexer llguidance gave up on mid-generation did)."""
        try:
            d.feed(row)
        except EngineError:
            raise
        except Exception as exc:  # noqa: BLE001 - this job fails, the others go on
            self.failed[seq] = exc
            d.stop()


def _groups(live: list[tuple[int, Stepwise]], n_batch: int) -> list[list[tuple[int, Stepwise]]]:
    """Consecutive groups of at most n_batch pending tokens (a part longer than n_batch
    alone in its group)."""
    if len(live) == 1:  # the single stream's every depth
        return [live]
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
