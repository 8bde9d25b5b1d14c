"""Stage 1's result as a value: the block one sequence proposes, what the target decode must
score for it (`Proposal.to_score`, `Proposal.rows`) and the stand-in rows for the positions
the grammar forces (`Proposal.full_rows`). Made by `specgen.round.Sequence.propose`, read
by whoever holds the batch (a single stream's `step`, the server's step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specgen.engine import Block, Logits
from specgen.stages import tokens_to_score

if TYPE_CHECKING:
    from specgen.grammarrows import GrammarProcessor

__all__ = ["Proposal", "forced_rows"]


@dataclass(frozen=True)
class Proposal:
    """Stage 1's result: what stage 2 must score for this sequence.

    Attributes:
        k: the block size asked for (0 = an ordinary pass).
        block: the proposals x_1..x_m and their q rows: at most k of them are not
            tokens the grammar allows alone (`Block.sole`: the lead and those within the
            block, free of K).
        last: the committed token the target has not evaluated yet.
        t_start: clock at the start of the round, seconds.
        t_drafted: clock when drafting ended, seconds.
        catchup_s: seconds the drafter spent catching up on committed tokens it had not
            seen (after ordinary rounds): a cost of the round after a fallback, not of each
            proposal.
        decode0, decode1: seconds inside llama_decode so far (target + draft) at t_start
            and at t_drafted, to tell the loop's host time apart.
        forced: (row, token) pairs, rows ascending: positions of `to_score` whose row
            the decode need not compute, because the grammar allows that token alone
            there (the block's `Block.sole` and the bonus position): the constrained p
            is one-hot on it whatever the logits. Empty when the request asks for
            log-probabilities (every emitted token needs its row).
        lead: how many of the block's first tokens are the grammar's lead
            (`Sequence.draft_context`): tokens it allows alone after the committed ones,
            chained before drafting whatever K is, at no draft pass and no row. They are
            always accepted and are not what K was chosen for, so the policy does not
            learn from them.
    """

    k: int
    block: Block
    last: int
    t_start: float
    t_drafted: float
    catchup_s: float = 0.0
    decode0: float = 0.0
    decode1: float = 0.0
    forced: tuple[tuple[int, int], ...] = ()
    lead: int = 0

    @property
    def to_score(self) -> list[int]:
        """[last, x_1..x_m]: row i scores the token after to_score[i] (row m the bonus
        position)."""
        return tokens_to_score(self.last, self.block)

    @property
    def rows(self) -> tuple[int, ...]:
        """The indices of `to_score` whose logits row the decode must compute (all but the
        `forced` ones)."""
        skip = {i for i, _ in self.forced}
        return tuple(i for i in range(len(self.to_score)) if i not in skip)

    def full_rows(self, logits: Logits) -> Logits:
        """(len(to_score), n_vocab) float32: the decode's `rows` in place, and at each
        `forced` row a stand-in, 0 at the forced token and -inf elsewhere. The stand-in
        gives the same constrained p as the target's row would: the grammar's mask leaves
        that one token finite either way, bias and penalties keep it finite (and -inf
        elsewhere), and every warper maps a single finite logit to probability 1.

        Args:
            logits: (len(rows), n_vocab) float32, or already (len(to_score), n_vocab)
                (returned as it is).
        """
        n = len(self.to_score)
        if not self.forced or logits.shape[0] == n:
            return logits
        out = np.full((n, logits.shape[1]), -np.inf, dtype=np.float32)
        out[list(self.rows)] = logits
        for i, token in self.forced:
            out[i, token] = 0.0
        return out

    @property
    def draft_s(self) -> float:
        return self.t_drafted - self.t_start

    def counted(self, n_accepted: int) -> tuple[int, int]:
        """(proposals, accepted) of the positions K was chosen for: the block's tokens but
        those the grammar allows alone (`Block.sole`, the lead among them), which are
        always accepted and cost no draft pass and no row, so the policy neither pays for
        them nor learns acceptance from them; accepted counts those positions among the
        first `n_accepted` (0..m)."""
        sole = set(self.block.sole)
        m = int(self.block.tokens.size)
        hits = sum(1 for i in range(min(n_accepted, m)) if i not in sole)
        return m - len(sole & set(range(m))), hits


def forced_rows(
    grammar: GrammarProcessor | None, committed: list[int], block: Block
) -> tuple[tuple[int, int], ...]:
    """`Proposal.forced`: the block's tokens the grammar allowed alone (`Block.sole`,
    found by the drafter's matcher on the same history), and the bonus position when
    the grammar allows one token alone after the whole block (asked of the target's
    own matcher). None without a grammar (the caller passes none when log-probabilities
    are asked for)."""
    if grammar is None:
        return ()
    x = block.tokens.tolist()
    forced = [(i, x[i]) for i in block.sole]  # row i scores x_{i+1}
    t = grammar.single(committed, x)
    if t is not None:
        forced.append((len(x), t))
    return tuple(forced)
