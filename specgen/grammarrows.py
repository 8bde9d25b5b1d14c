"""A grammar as a per-sequence logits processor (specgen.constraints' `Processor`): the
target's rows and the draft's masked under the output each follows, greedy's argmax with no
mask where a row's own argmax is allowed, forced and sole tokens, and where a round's new
tokens complete the grammar. The matcher and its masks are `specgen.grammar`'s."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

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
