"""STAND-IN for `specgen.round` (notes: ROUND_API.md) until the round unit lands on main:
the subset of `Sequence` and `Proposal` the scheduler uses, built from generate.py's stage
functions in the order `generate()` calls them. Delete this file when round.py is merged
(the scheduler imports `specgen.round` first)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specgen.emit import Emitter
from specgen.engine import Block, Drafter, Engine, Logits
from specgen.events import Done, FinishReason, Prefilled, Span, Stats, Step
from specgen.generate import (
    FixedK,
    GenerateConfig,
    KPolicy,
    accept_prefix,
    check_prompt,
    draft_block,
    next_token,
    rollback,
    target_distributions,
)

Clock = Callable[[], float]


@dataclass
class Proposal:
    k: int
    block: Block
    bonus: bool
    draft_s: float
    last: int = 0

    @property
    def to_score(self) -> list[int]:
        x = self.block.tokens.tolist()
        return [self.last, *(x if self.bonus or not x else x[:-1])]


class Sequence:
    def __init__(
        self,
        target: Engine,
        drafter: Drafter | None,
        prompt: list[int],
        config: GenerateConfig,
        policy: KPolicy | None = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        check_prompt(prompt, target.n_ctx)
        self.target, self.drafter, self.config = target, drafter, config
        self.policy = policy or FixedK(0)
        self.clock = clock
        self.draft_rng, self.target_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(config.seed).spawn(2)
        )
        self.emitter = Emitter(
            target.token_bytes, target.is_eog, config.stop, config.ignore_eos, config.max_tokens
        )
        self.stats = Stats(n_prompt=len(prompt))
        self.committed = list(prompt)
        self._t_decode = clock()

    def start(self, n_prefill: int, prefill_s: float) -> Prefilled:
        self.stats.n_prefill = n_prefill
        self.stats.prefill_s = prefill_s
        self._t_decode = self.clock()
        return Prefilled(len(self.committed), prefill_s)

    @property
    def finished(self) -> bool:
        e = self.emitter
        if e.finish is None:
            room = self.target.n_ctx - len(self.committed)
            if room < 0 or e.remaining <= 0:
                e.close("length" if e.remaining <= 0 else "context")
        return e.finish is not None

    def choose_k(self) -> int:
        if self.drafter is None:
            return 0
        room = self.target.n_ctx - len(self.committed)
        return self.policy.choose_k(min(self.emitter.remaining - 1, room))

    def propose(self, k: int, block: Block | None = None) -> Proposal:
        t0 = self.clock()
        if block is None:
            block = draft_block(self.drafter, self.committed, k, self.draft_rng)
        bonus = k == 0 or self.policy.bonus()
        return Proposal(k, block, bonus, self.clock() - t0, self.committed[-1])

    def commit(self, proposal: Proposal, logits: Logits, verify_s: float) -> Step:
        t2 = self.clock()
        block, k = proposal.block, proposal.k
        v = target_distributions(logits, self.config.params)
        u = self.target_rng.random(block.tokens.size)
        n = accept_prefix(block, v, u)
        x_next = next_token(n, block, v, self.target_rng)
        t3 = self.clock()
        new = block.tokens[:n].tolist() + ([] if x_next is None else [x_next])
        spans: list[Span] = []
        for i, tok in enumerate(new):
            span = self.emitter.push(tok, from_draft=i < n)
            if span is not None:
                spans.append(span)
            if self.emitter.finish is not None:
                del new[i + 1 :]
                break
        self.committed.extend(new)
        rollback(self.target, self.drafter, self.committed)
        self.policy.observe(k, n, proposal.draft_s, verify_s, int(block.tokens.size))
        t_end = self.clock()
        rejected = None
        if n < block.tokens.size and n < len(new):
            rejected = self.target.token_bytes(int(block.tokens[n])).decode("utf-8", "replace")
        step = Step(
            k=k,
            n_proposed=int(block.tokens.size),
            n_drafted=min(int(block.tokens.size), len(new)),
            n_accepted=min(n, len(new)),
            spans=tuple(spans),
            rejected_text=rejected,
            draft_s=proposal.draft_s,
            verify_s=verify_s,
            sample_s=t3 - t2,
            round_s=proposal.draft_s + verify_s + (t_end - t2),
            n_rows=int(logits.shape[0]),
        )
        self.stats.add(step, decode_s=t_end - self._t_decode)
        self.stats.n_generated = len(self.emitter.tokens)
        return step

    def finish(self, reason: FinishReason | None = None) -> Done:
        if self.emitter.finish is None:
            self.emitter.close(reason or "interrupted")
        rollback(self.target, self.drafter, self.committed)
        self.stats.n_generated = len(self.emitter.tokens)
        e = self.emitter
        assert e.finish is not None
        return Done(e.finish, e.text, tuple(e.tokens), self.stats)
