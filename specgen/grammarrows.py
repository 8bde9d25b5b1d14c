"""A grammar as a per-sequence logits processor (specgen.constraints' `Processor`): the
target's rows and the draft's masked under the output each follows, greedy's argmax with no
mask where a row's own argmax is allowed, sampled rows under top-k with no mask where the
top-k allowed tokens are found by asking token by token, forced and sole tokens, and where
a round's new tokens complete the grammar. The matcher and its masks are
`specgen.grammar`'s."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from specgen.grammar import (
    Grammar,
    MaskCache,
    Matcher,
    Vocabulary,
    compile_grammar,
    tokenizer_for,
)
from specgen.grammarspec import GrammarSpec
from specgen.sampling import top_k_one

_WALK_EXTRA = 16
"""Candidates a top-k walk reads past 2k before it gives up for the mask."""


def first_allowed(
    ids: npt.NDArray[np.int64],
    zs: npt.NDArray[np.float64],
    k: int,
    allows: Callable[[int], bool | None],
) -> list[int] | None:
    """The first `k` of the candidates `ids` (a row's first tokens in the order logit
    descending, then id: `specgen.sampling.top_k_one`; `zs` their logits) that `allows`
    allows, in that order; None where that is not decided among them: `allows` answers
    None (only a mask can say), a candidate at -inf comes first (the masked row has fewer
    than k finite logits), or fewer than k of the candidates are allowed."""
    out: list[int] = []
    for t, z in zip(ids.tolist(), zs.tolist(), strict=True):
        if z == -np.inf:
            return None
        ok = allows(t)
        if ok is None:
            return None
        if ok:
            out.append(t)
            if len(out) == k:
                return out
    return None


@dataclass
class RowCosts:
    """What a sampled row under top-k has cost with one grammar, to choose between a mask
    and a walk (`GrammarProcessor._walks`; timing only: both give the same row).

    Attributes:
        mask_s: seconds, running mean (weight 1/8) of a full-vocabulary mask at a new state.
        walk_s: seconds, the same of a walk (`first_allowed`), its fallback mask included.
        masks: masks since the last walk: one in `RETRY` re-times the walk, whose cost
            may have changed with the state (free text, then JSON).
    """

    mask_s: float | None = None
    walk_s: float | None = None
    masks: int = 0

    RETRY: ClassVar[int] = 32

    def add(self, walk: bool, seconds: float) -> None:
        old = self.walk_s if walk else self.mask_s
        new = seconds if old is None else old + (seconds - old) / 8
        if walk:
            self.walk_s, self.masks = new, 0
        else:
            self.mask_s, self.masks = new, self.masks + 1


_COSTS: weakref.WeakKeyDictionary[Grammar, RowCosts] = weakref.WeakKeyDictionary()
_COSTS_LOCK = threading.Lock()


def costs_of(grammar: Grammar) -> RowCosts:
    """The `RowCosts` of `grammar`, shared by every sequence it constrains."""
    with _COSTS_LOCK:
        c = _COSTS.get(grammar)
        if c is None:
            c = _COSTS[grammar] = RowCosts()
        return c


class GrammarProcessor:
    """A grammar as a per-sequence logits processor: row i of a target decode is masked
    with the matcher state after the output so far and the block's x_1..x_{i-1}; a draft's
    row with the state after its proposals so far. The matcher is moved by `Matcher.sync`
    on each call, so it rolls back with the caches whatever the round accepted.

    Args:
        grammar: the compiled grammar.
        n_prompt: tokens of the prompt; the grammar applies to what follows them.
        cache: masks shared with the sequence's other side (`MaskCache`), or None.
    """

    def __init__(self, grammar: Grammar, n_prompt: int, cache: MaskCache | None = None) -> None:
        self.matcher = Matcher(grammar, cache)
        self.n_prompt = n_prompt
        self.costs = costs_of(grammar)

    def _generated(self, context: Sequence[int], block: Sequence[int]) -> list[int]:
        return [*context[self.n_prompt :], *block]

    def row(
        self, logits: npt.NDArray[np.float32], context: Sequence[int], block: Sequence[int]
    ) -> npt.NDArray[np.float32]:
        """(n_vocab,) float32: `logits` masked after context + block."""
        self.matcher.sync(self._generated(context, block))
        return self.matcher.mask(logits)

    def rows(
        self, logits: npt.NDArray[np.float32], context: Sequence[int], block: Sequence[int]
    ) -> npt.NDArray[np.float32]:
        """(n, n_vocab) float32: row i masked after context + block[:i]. Rows after a block
        token the grammar forbids are masked in the state before it: that token has p = 0,
        so it is rejected and no later row is read."""
        out = np.empty(logits.shape, dtype=np.float32)
        for i in self._row_states(logits.shape[0], context, block):
            out[i] = self.matcher.mask(logits[i])
        return out

    def top_k_rows(
        self,
        logits: npt.NDArray[np.float32],
        context: Sequence[int],
        block: Sequence[int],
        k: int,
    ) -> npt.NDArray[np.float32]:
        """(n, n_vocab) float32 rows that warp as `rows`' rows do under top-k = `k` > 0:
        row i holds, of the tokens allowed after context + block[:i], the first k in the
        order logit descending then id (the k that top-k keeps of the masked row: its
        `specgen.sampling.top_k_one` order) at their logits, every other token at -inf.
        Top-p, min-p and the temperature then see the same k values, so p is the same to
        the bit. Where a full-vocabulary mask costs more than asking llguidance candidate
        by candidate (free text on Gemma 3's vocabulary: 7 ms a mask, 1 ms a walk), the
        k are found that way (`first_allowed`); else, or where that is not decided, the
        row is masked (`rows`). Which way is timing only (`RowCosts`)."""
        out = np.empty(logits.shape, dtype=np.float32)
        for i in self._row_states(logits.shape[0], context, block):
            out[i] = self._top_k(logits[i], k)
        return out

    def _walks(self) -> bool:
        """Whether a row with no mask at hand looks for its top-k allowed tokens by asking
        (`_top_k`): once a mask has been timed, where walks have cost less than masks so
        far, the first walk and one in `RowCosts.RETRY` masks included (to time it)."""
        c = self.costs
        if c.mask_s is None:
            return False
        return c.walk_s is None or c.walk_s < c.mask_s or c.masks >= c.RETRY

    def _top_k(self, z: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.float32]:
        m = self.matcher
        if m._at_hand():  # computed or cached: it costs nothing
            return m.mask(z)
        walk = self._walks()
        t0 = time.perf_counter()
        kept = None
        if walk:
            # float32 as the masked row is warped: values equal there must tie here too
            z = np.asarray(z, dtype=np.float32)
            ids, zs = top_k_one(z, min(2 * k + _WALK_EXTRA, z.shape[0]))
            kept = first_allowed(ids, zs, k, m.ask)
        if kept is None:
            out = m.mask(z)
        else:
            out = np.full(z.shape, -np.inf, dtype=np.float32)
            out[kept] = z[kept]
        # a walk's time includes its fallback mask: what choosing to walk costs
        self.costs.add(walk, time.perf_counter() - t0)
        return out

    def argmax_rows(
        self, logits: npt.NDArray[np.float32], context: Sequence[int], block: Sequence[int]
    ) -> npt.NDArray[np.int64]:
        """(n,) int64: greedy's token for each row of `rows` (the argmax of row i masked
        after context + block[:i]), masking only the rows whose own argmax the grammar
        does not allow. Where it does, it is the masked row's argmax too, ties included:
        np.argmax takes the first of equal maxima, and no allowed token before it can
        equal it. The same tokens as ``np.argmax(self.rows(...), axis=1)``."""
        out = np.argmax(logits, axis=1)
        for i in self._row_states(logits.shape[0], context, block):
            if not self.matcher.allows(int(out[i])):
                out[i] = int(np.argmax(self.matcher.mask(logits[i])))
        return out

    def _row_states(self, n: int, context: Sequence[int], block: Sequence[int]) -> Iterator[int]:
        """0..n-1, the matcher standing at each where row i is masked: after context +
        block[:i], or, past a block token the grammar forbids, before that token (it has
        p = 0, so it is rejected and no later row is read)."""
        ok = self.matcher.sync(self._generated(context, ()))
        for i in range(n):
            yield i
            if ok and i < len(block) and i + 1 < n:
                ok = self.matcher._consume(int(block[i]))

    def allows(self, context: Sequence[int], block: Sequence[int], token: int) -> bool:
        """Whether `token` may follow context + block (`Matcher.allows`); False when the
        block leaves the grammar."""
        return self.matcher.sync(self._generated(context, block)) and self.matcher.allows(token)

    def forced(self, context: Sequence[int], block: Sequence[int]) -> list[int]:
        """The forced tokens after context + block (see `Matcher.forced`); [] when the
        block leaves the grammar."""
        if not self.matcher.sync(self._generated(context, block)):
            return []
        return self.matcher.forced()

    def single(self, context: Sequence[int], block: Sequence[int]) -> int | None:
        """The one token allowed after context + block, or None (see `Matcher.single`)."""
        if not self.matcher.sync(self._generated(context, block)):
            return None
        return self.matcher.single()

    def complete_at(self, context: Sequence[int], new: Sequence[int]) -> int:
        """How many of `new` (tokens a round commits after `context`) to keep: up to the
        point where the grammar is complete and allows nothing more (`Matcher.stopped`),
        where ordinary constrained decoding ends; len(new) when it is not reached (or a
        token is not allowed: the caller's own checks say so)."""
        m = self.matcher
        if not m.sync(self._generated(context, ())):
            return len(new)
        for j, t in enumerate(new):
            if m.stopped:
                return j
            if not m._consume(int(t)):
                return len(new)
        return len(new)

    def stopped(self, context: Sequence[int]) -> bool:
        """Whether the grammar is complete after `context` and allows nothing more."""
        return self.matcher.sync(self._generated(context, ())) and self.matcher.stopped

    def only_ends(self, context: Sequence[int]) -> bool:
        """Whether after `context` the grammar allows end-of-generation tokens alone."""
        if not self.matcher.sync(self._generated(context, ())):
            return False
        allowed, eog = self.matcher.allowed(), self.matcher.grammar.tokenizer.eog
        return bool(allowed.any()) and not np.delete(allowed, eog).any()


def grammar_factory(
    spec: GrammarSpec,
) -> Callable[[Vocabulary, int], GrammarProcessor]:
    """``(vocabulary, n_prompt) -> GrammarProcessor`` for `spec`: compiled once per model's
    tokenizer (on first use, then cached)."""

    def make(vocab: Vocabulary, n_prompt: int) -> GrammarProcessor:
        return GrammarProcessor(compile_grammar(spec, tokenizer_for(vocab)), n_prompt)

    return make
