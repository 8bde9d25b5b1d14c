"""Planted bugs used by more than one test file: each statistical test that uses one shows
it can fail."""

from __future__ import annotations

import numpy as np

from specgen.constraints import BiasPenalties
from specgen.sampling import draw, warp_rows


class CommittedOnly(BiasPenalties):
    """Planted bug: penalties counted over the committed tokens only."""

    def rows(self, logits, context, block):
        return np.stack([super(CommittedOnly, self).row(z, context, ()) for z in logits])

    def row(self, logits, context, block):
        return super().row(logits, context, ())


def q_unmasked(self, row):
    """Planted bug: the draft draws from its masked row but records the raw row's q."""
    d = self.drafter
    raw = d._align(row)
    masked = d.grammar.row(raw, self.context, self.tokens)
    ids, p = warp_rows(masked[None, :], d.params).row(0)
    self.pending = []
    self.tokens.append(draw(ids, p, self.rng))
    self.rows.append(warp_rows(raw[None, :], d.params))
    self.sources.append("draft")
    if len(self.tokens) < self.k:
        self.pending = self._unfed()


def on_block(w, change):
    """`w` (a drafter's `Stepwise`, from its `begin`) whose `block()` returns
    `change(block)`: a planted bug in the block the batch engine takes from a drafter
    (it drafts through `begin`, not `draft`), or a count of what it proposed."""
    block_of = w.block
    w.block = lambda: change(block_of())
    return w
