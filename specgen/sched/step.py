"""One step of the scheduler (`Stepper.run`), over every slot at once:
  1. cancelled jobs leave their slot; queued jobs take free slots (the slot whose cache
     shares the longest prefix with the prompt, which then evaluates only the rest);
  2. stage 1 for every slot that is generating: K per slot (fixed, or the batch
     controller's goodput choice; 0 in a request's first round, so that its first token
     comes at ordinary decoding's latency), then the blocks (`specgen.sched.drafting`);
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
    short after the depth under way (`Drafting._draft_depths`): the request waits one draft
    depth, not all of them. Exact: a round's law does not depend on its K (Leviathan et
    al. 2023, Theorem 3.5), and the cut depends on the clock, never on the tokens drawn.
  - The prompt's last chunk carries the request's first round (`Stepper._first_rounds`:
    `[..., last]` with one logits row, K = 0), so its first token comes from the decode
    that ends its prefill, as llama-server's does, instead of a decode later.
  - While requests wait for their first token the batch controller counts the seconds
    speculation adds once more per waiting request and makes no probe; with
    --slo-ttft/--slo-tpot it also keeps the step within those targets
    (`specgen.control.batch.BatchController`, the goodput of SmartSpec, Liu et al. 2024,
    priced for latency). Each slot's K carries its reason (`BatchReport.reasons`,
    `Step.k_reason`).
  So a short prompt arriving mid-step gets its first token at the end of that step's
  decode; before, it waited for the rest of the step and two whole steps more.

Faults: a llama.cpp failure in the batched decode ends the jobs in that decode with
`Failed(kind="engine")`; a failure while one slot drafts or commits ends that job only.
The others carry on at the next step.
"""

from __future__ import annotations

from collections.abc import Callable

from specgen.control.batch import BatchController, SlotState
from specgen.engine import BatchEngine, Logits, SeqDecode
from specgen.errors import EngineError
from specgen.events import LOOKUPS
from specgen.genconfig import prompt_rows_chunk
from specgen.hybrid import HybridDrafter
from specgen.ngram import NgramDrafter
from specgen.proposal import Proposal
from specgen.sched.drafting import Drafting
from specgen.sched.jobs import BatchReport
from specgen.sched.slot import Slot, Slots, batched
from specgen.stages import score_blocks

LOOKUP_FIRST = 3
"""Steps whose lookup gained nothing (no offer, or none of it accepted) after which a hybrid
slot's draft model may evaluate its prompt; also the ordinary passes its prompt's catch-up
must cost at least for the rule to hold (`_lookup_first`)."""


def _lookup_first(slot: Slot, cap: int, controller: BatchController) -> bool:
    """Whether this step holds a hybrid slot's K to its prompt-lookup tokens: its draft
    model lacks so much of the context (its prompt, never drafted for) that catching up
    costs at least `LOOKUP_FIRST` ordinary passes by the controller's cost lines, and its
    lookup has gained nothing (offered nothing, or none of its tokens accepted) in fewer
    than `LOOKUP_FIRST` steps so far. While held, the hybrid proposes as prompt lookup
    alone does, after any match (`HybridDrafter.model_held`).

    Why: the model's first block costs that catch-up (on the demo pair, 150-250 ms for a
    111-token prompt: three to five ordinary passes), where a lookup block costs no draft
    pass. On text that copies its prompt the lookup soon covers most positions and the
    catch-up never pays back (`--lookup on` ran at 0.77x prompt lookup alone on a summary
    with quotes, 64 tokens, all of the gap that catch-up); where the lookup gains
    nothing for `LOOKUP_FIRST` steps the model is let in, having cost those steps their
    speculation, which is why a short prompt (a catch-up cheaper than the steps held)
    lets the model in at once. Exact: K is chosen from the committed context, the
    record and the clock, never from this round's draws (Leviathan et al. 2023,
    Theorem 3.5: a round's law does not depend on its K).

    Once held, a slot stays held until its misses end the hold (`Slot.lookup_held`): the
    cost lines move with every decode, and a catch-up near the threshold flipped the rule
    after one step (a prompt of about 100 tokens: the model let in by the next step's
    warm-up in 6 of 12 runs of a summary with quotes, each 10-25% slower than held)."""
    if not (
        cap > 0
        and isinstance(slot.drafter, HybridDrafter)
        and slot.lookup_misses < LOOKUP_FIRST
        and slot.catch_up > cap
    ):
        return False
    if not slot.lookup_held:
        cost = slot.catch_up * controller.draft.token_s
        slot.lookup_held = cost >= LOOKUP_FIRST * controller.target.line()(1)
    return slot.lookup_held


def model_part(prop: Proposal, n_accepted: int, lookup_alone: bool = False) -> tuple[int, int]:
    """(k, accepted) of the draft model's part of a round, what the controller's
    acceptance estimate learns from: prompt-lookup tokens (hybrid blocks) have their own
    record (`specgen.hybrid.LookupRecord`), and a failed lookup would otherwise mark the
    model down too, so that a slot whose draft lacks its prompt never drafted with it
    again (the catch-up's cost outweighs a low estimate). (0, 0) where the model's part
    was not reached or there is none; a block without lookup tokens counts as before,
    at the K asked for. The tokens the grammar allows alone (`Block.sole`: its lead and
    those within the block, always accepted, free of K) are not part of it.

    `lookup_alone`: the slot drafts by prompt lookup with no model (`NgramDrafter`), whose
    tokens are then what the estimate is of: (proposed, accepted) of the block as
    proposed, and (0, 0) for a round whose lookup found nothing (its one row is an
    ordinary pass, no evidence about acceptance). Learning from none of its tokens held
    `-md ngram --draft-max auto` at K = 1-2 on prompts it copies exactly (every block
    accepted, the estimate stuck where the first rounds' empty blocks had put it)."""
    if lookup_alone:
        m, hits = prop.counted(n_accepted)
        return (m, hits) if m else (0, 0)
    sole = set(prop.block.sole)
    sources = [s for i, s in enumerate(prop.block.sources) if i not in sole]
    n_accepted = prop.counted(n_accepted)[1]
    if not any(s in LOOKUPS for s in sources):
        return prop.k, min(prop.k, n_accepted)
    head = 0
    while head < len(sources) and sources[head] in LOOKUPS:
        head += 1
    m = sources.count("draft")
    if m == 0 or n_accepted < head:
        return 0, 0
    return m, min(m, n_accepted - head)


def _decode_s(engine: BatchEngine | None) -> float:
    return engine.decode_s if engine is not None else 0.0


class Stepper:
    """Runs the steps over `slots`, one target decode each (see the module docstring).

    Args:
        target: the target engine with a sequence per slot.
        slots: the slots and their life.
        drafting: stage 1 across the slots; its draft engine, controller, clock and
            `prefill_chunk` (here: most prompt tokens one slot adds to a step) are the
            step's too.
        reap_cancelled: ends cancelled jobs (`Scheduler._reap_cancelled`).
        admit: queued jobs take free slots (`Scheduler._admit`).
        queue_depth: jobs waiting for a slot (`Scheduler.queue_depth`).
    """

    def __init__(
        self,
        target: BatchEngine,
        slots: Slots,
        drafting: Drafting,
        *,
        reap_cancelled: Callable[[], None],
        admit: Callable[[], None],
        queue_depth: Callable[[], int],
    ) -> None:
        self.target = target
        self.slots = slots
        self.drafting = drafting
        # one of each for the whole step, set where drafting was built
        self._draft, self.controller = drafting.draft, drafting.controller
        self.clock, self.prefill_chunk = drafting.clock, drafting.prefill_chunk
        self._reap_cancelled = reap_cancelled
        self._admit = admit
        self._queue_depth = queue_depth
        self._itl: list[tuple[int, float, int]] = []  # this step's `BatchReport.itl`
        self._n_firsts = 0  # first rounds that rode on their prefill's last chunk this step

    def run(self) -> BatchReport:
        t_step = self.clock()
        self._itl = []  # filled by `_commit`
        self.drafting.cut = False  # set by `Drafting._draft_depths` on an arrival
        inside0 = _decode_s(self.target) + _decode_s(self._draft)
        self._reap_cancelled()
        self._admit()
        for slot in self.slots.all:
            if slot.seq is not None and not slot.started and not slot.todo:
                self.slots.start(slot)
        active = [s for s in self.slots.all if s.seq is not None and s.started]
        t_choose = self.clock()
        chosen = self._choose_ks(active)

        t1 = self.clock()
        ks = self.drafting.catch_up(active, chosen)
        self.drafting.count_runs(active, chosen, ks)
        # at a fixed K a slot spending this step on a chunk of its draft's catch-up makes
        # no round rather than an ordinary one: its rounds, and so a seeded request's text,
        # are then the same whether its prompt's draft cells were cached or not (under
        # the controller the ordinary round is a choice like any other: the clock's)
        rounds = [
            (s, k) for s, k in zip(active, ks, strict=True)
            if self.controller is not None or s.reason != "catch_up"
        ]  # fmt: skip
        proposals = self.drafting.propose([s for s, _ in rounds], [k for _, k in rounds])
        retimed = not any(ks) and self.drafting.retime_draft(active)
        # a step the controller's residual may learn from: nothing in it but the rounds
        plain = ks == chosen and not retimed and not self.drafting.cut
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
        sizes = {slot.index: len(part.tokens) for slot, part in chunked}  # prompt tokens
        firsts, chunked = self._first_rounds(chunked, budget)
        self._n_firsts = len(firsts)
        parts += [part for _, part in chunked]
        chunks = [(slot, sizes[slot.index]) for slot, _ in chunked]
        decode0 = _decode_s(self.target)
        rows: list[Logits] | None = None
        verify_s = 0.0
        t2 = self.clock()
        if parts:
            try:
                # one part (a single stream's round): views, no copy of its rows (K + 1
                # rows of 262,144 floats each on Gemma: ~1 MB a row), since its commit reads
                # them before anything decodes again (`Sequence.commit` copies them for a
                # trace); several: copies, as one slot's rollback may re-evaluate evicted
                # window cells into the buffer the others' rows point into
                rows = score_blocks(self.target, parts, copy=len(parts) > 1)
            except EngineError as exc:
                for slot in [s for s, _ in proposals] + [s for s, _ in chunks]:
                    self.slots.fail(slot, exc, "engine")
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
                # (those scored for their log-probabilities are rows themselves)
                n_chunk = sum(len(part.tokens) - part.n_rows for _, part in chunked)
                beyond = self.clock() - t2 - self.controller.target.line()(n_rows)
                self.controller.observe_chunk(n_chunk, beyond)
            chunk_rows = dict(
                zip([s.index for s, _ in chunked], rows[len(proposals) :], strict=True)
            )
            for slot, n in chunks:
                del slot.todo[:n]
                if slot.seq is not None and slot.seq.config.wants_prompt_logprobs:
                    slot.seq.score_prompt(chunk_rows[slot.index][:n])
            for slot, prop in firsts:
                assert slot.seq is not None and slot.ticket is not None
                prefilled = slot.seq.prefilled(self.clock() - slot.t_admit)
                if self.slots.announces(slot):  # its prompt is evaluated only now
                    self.slots.send(slot.ticket, prefilled)
                # its decode was the prompt's: prefill, not this round's verification
                self._commit(slot, prop, chunk_rows[slot.index][-len(prop.to_score) :], 0.0)
        if self.controller is not None and plain and not chunks and rows is not None:
            # the positions lookup really filled: also those after model tokens, which
            # the choice could not foresee (`HybridDrafting.feed`); a catch-up is
            # evaluated where the model drafts, beyond them
            # and those the grammar forced (no draft pass either)
            filled = {
                slot.index: sum(s in LOOKUPS for s in p.block.sources)
                + p.block.sources.count("grammar")
                - len(p.block.sole)
                for slot, p in proposals
            }
            free = [min(k, filled.get(s.index, 0)) for s, k in zip(active, ks, strict=True)]
            catch_up = sum(s.catch_up for s, k, f in zip(active, ks, free, strict=True) if k > f)
            self.controller.observe_step(ks, catch_up, self.clock() - t_choose, free)
        for slot in self.slots.all:
            if slot.seq is not None and not slot.started and not slot.todo:
                self.slots.start(slot)

        step_s = self.clock() - t_step
        inside = _decode_s(self.target) + _decode_s(self._draft) - inside0
        ctl = self.controller
        if ctl is not None and not any(ks):
            self.drafting.undrafted_s += step_s
        report = BatchReport(
            n_rows=n_rows,
            n_slots=len(active),
            k=tuple(ks),
            decode_s=decode_s,
            draft_s=draft_s,
            step_s=step_s,
            host_s=max(0.0, step_s - inside),
            queue_depth=self._queue_depth(),
            slots_busy=self.slots.busy,
            target_line=ctl.target.line() if ctl is not None else None,
            draft_line=ctl.draft_line() if ctl is not None else None,
            spec_overhead_s=ctl.spec_overhead_s if ctl is not None else None,
            speed_changes=ctl.speed_changes if ctl is not None else 0,
            draft_token_s=ctl.draft.token_s if ctl is not None else None,
            itl=tuple(self._itl),
            reasons=tuple(s.reason for s in active) + ("first",) * self._n_firsts,
        )
        return report

    def _first_rounds(
        self, chunked: list[tuple[Slot, SeqDecode]], budget: int
    ) -> tuple[list[tuple[Slot, Proposal]], list[tuple[Slot, SeqDecode]]]:
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
        firsts: list[tuple[Slot, Proposal]] = []
        out: list[tuple[Slot, SeqDecode]] = []
        for slot, part in chunked:
            assert slot.seq is not None
            if (
                len(part.tokens) < len(slot.todo)
                or budget < 1
                or not slot.first
                or slot.seq.config.max_tokens <= 0  # nothing to generate: no round
            ):
                out.append((slot, part))
                continue
            self.slots.start(slot, announce=False)
            if slot.seq is None or not slot.started:  # failed: its job has ended
                continue
            slot.first = False  # this round is its ordinary first
            slot.reason = "first"
            prop = slot.seq.propose(0, lead=False)
            n_rows = part.n_rows + len(prop.to_score)  # rows of a scored chunk, then its own
            out.append((slot, SeqDecode(slot.index, part.tokens + prop.to_score, n_rows)))
            firsts.append((slot, prop))
            budget -= len(prop.to_score)
        return firsts, out

    def _prompt_chunks(
        self, todo_of: Callable[[Slot], list[int]], budget: int
    ) -> list[tuple[Slot, SeqDecode]]:
        """A chunk (at most `prefill_chunk` tokens, no logits rows) of each prefilling
        slot's prompt tokens still to evaluate (`todo_of(slot)`: the target's or the
        draft's), `budget` tokens in all. A generation that asks for the prompt's
        log-probabilities gets a row per token, in chunks of at most `prompt_rows_chunk`."""
        out: list[tuple[Slot, SeqDecode]] = []
        for slot in self.slots.all:
            todo = todo_of(slot)
            if slot.seq is None or slot.started or not todo or budget <= 0:
                continue
            n = min(len(todo), budget, self.prefill_chunk)
            scored = slot.seq.config.wants_prompt_logprobs
            if scored:
                n = min(n, prompt_rows_chunk(self.target.n_vocab))
            out.append((slot, SeqDecode(slot.index, todo[:n], n if scored else 0)))
            budget -= n
        return out

    def _choose_ks(self, active: list[Slot]) -> list[int]:
        """K per slot; also each slot's `catch_up` this step (what `Drafting.catch_up`, the
        controller and its residual read)."""
        caps = []
        # the requests whose first token waits for this step: prompts being prefilled, and
        # slots making their first round now (a prompt the cache held but its last token)
        now = self.clock()
        waiting_s = [
            now - s.ticket.t_submit
            for s in self.slots.all
            if s.ticket is not None and s.seq is not None and (not s.started or s.first)
        ]
        k_cap = self.slots.k_cap()
        for slot in active:
            seq, d = slot.seq, slot.drafter
            assert seq is not None
            # a request's first step is ordinary decoding: its first token comes at
            # ordinary decoding's latency (the prefill and one target row), where a first
            # block would hold it back by the draft's catch-up on the prompt and K draft
            # decodes (2-4x the TTFT of --draft none on the demo pair); its draft catches
            # up in its next step
            caps.append(0 if slot.first else max(0, min(k_cap, seq.k_room())))
            slot.reason = "first" if slot.first else "fixed"
            slot.first = False
            b = batched(d)
            behind = b.behind(seq.committed) if b is not None else 1
            slot.catch_up = max(0, behind - 1)
        if self.controller is None or not active:
            return caps
        states = []
        for i, (slot, cap) in enumerate(zip(active, caps, strict=True)):
            seq, d = slot.seq, slot.drafter
            assert seq is not None and slot.acceptance is not None
            left = seq.emitter.remaining
            held = _lookup_first(slot, cap, self.controller)
            free, free_alpha = 0, None
            if isinstance(d, HybridDrafter):
                d.model_held = held  # before the offer: the hold changes what it proposes
                free, free_alpha = d.lookup_offer(seq.committed, cap)
            slot.offer = free
            if held:
                # K within the lookup's tokens: no draft pass, so no catch-up yet
                caps[i] = cap = free
                slot.reason = "lookup_first"
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
                    0.0 if slot.t_first is None else now - slot.t_first,
                    slot.streamed,
                )
            )
        chunk_tokens = sum(
            min(len(s.todo), self.prefill_chunk)
            for s in self.slots.all
            if s.seq is not None and not s.started
        )
        choice = self.controller.choose(states, waiting_s=waiting_s, chunk_tokens=chunk_tokens)
        reasons = choice.reasons or ("goodput",) * len(active)
        for slot, k, cap, why in zip(active, choice.k, caps, reasons, strict=True):
            slot.idle = 0 if k > 0 else slot.idle + 1
            slot.fresh = slot.fresh and cap == 0
            kept = slot.reason == "first" and cap == 0 or slot.reason == "lookup_first"
            slot.reason = slot.reason if kept else why
        return list(choice.k)

    def _commit(self, slot: Slot, prop: Proposal, rows: Logits, verify_s: float) -> None:
        seq = slot.seq
        if seq is None:  # failed earlier in this step
            return
        try:
            step = seq.commit(prop, rows, verify_s, slot.reason)
        except Exception as exc:  # noqa: BLE001 - this job fails, the others go on
            self.slots.fail(slot, exc, "engine")
            return
        if slot.reason == "lookup_first" and step.n_accepted == 0:
            slot.lookup_misses += 1  # nothing offered, or nothing of it accepted
        if self.controller is not None and slot.acceptance is not None:
            k, n = model_part(prop, step.n_accepted, isinstance(slot.drafter, NgramDrafter))
            self.controller.observe_round(slot.acceptance, k, n)
        assert slot.ticket is not None
        self.slots.send(slot.ticket, step)
        if step.spans:  # per-slot ITL for /metrics: fairness between slots
            now = self.clock()
            if slot.t_sent is not None:
                self._itl.append((slot.index, now - slot.t_sent, len(step.spans)))
            slot.t_sent = now
            # TPOT counts the tokens after the first, from the first's arrival
            slot.streamed += len(step.spans) - (slot.t_first is None)
            slot.t_first = now if slot.t_first is None else slot.t_first
        if seq.ended():
            self.slots.end(slot, None)
