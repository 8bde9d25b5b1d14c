"""Drafters: a second, smaller model (`ModelDrafter`); the model-free prompt-lookup
drafter lives in `specgen.ngram` (`NgramDrafter`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from specgen.constraints import Processor, processor_for
from specgen.cutoff import should_stop, top_probability
from specgen.engine import Block, Engine, Logits
from specgen.events import Source
from specgen.sampling import Dists, SamplingParams, draw, warp_rows


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (slice comparisons in a
    binary search: the server asks for every slot every step, at thousands of tokens)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ModelDrafter:
    """Drafts with a small model, sampling each token from q under the target's settings.

    Its cache mirrors the committed context except the last token; `draft` first
    brings the cache up to date (rolling back to the longest common prefix and
    evaluating what is missing), so it stays correct whatever the last round did.

    Args:
        engine: the draft model.
        params: the same sampling settings as the target's.
        n_vocab: the target's vocabulary size; q rows have this width. Draft logits past
            it are dropped and missing ids get -inf, *before* warping, so q is exactly the
            distribution that was sampled from.
        p_min: confidence cut-off (`--draft-p-min`, llama.cpp's `p_min`): stop the block
            when the draft's most likely token has probability below p_min. The decision
            depends only on the draft's own distribution, known before the target sees the
            block, so it changes how many tokens are proposed, never the accept/resample
            law at a proposed position: the output is still distributed as the target's.

    Attributes:
        processor: `params.constraints` for this drafter's rows (None when none are set),
            a `specgen.constraints.Processor` of its own: each row is processed with the
            history context + the proposals so far before it is warped into q, as the
            target's row at that position is.

    Raises:
        ConfigError: a biased token outside the target's vocabulary.
    """

    def __init__(
        self, engine: Engine, params: SamplingParams, n_vocab: int, p_min: float = 0.0
    ) -> None:
        self.engine: Engine = engine
        self.name = engine.name
        self.params = params
        self.n_vocab = n_vocab
        self.p_min = p_min
        # moving average of one single-token draft pass (seconds): what an up-to-date
        # drafter pays for x_1's row, so a catch-up is charged only for the rest
        self._decode_s: float | None = None
        self.catchup_s = 0.0  # see `specgen.engine.Drafter`
        self.processor = processor_for(params.constraints, n_vocab)
        # the request's grammar on this drafter's rows, set per generation by
        # `attach_grammar` (a matcher of its own, advanced over the block's proposals)
        self.grammar: GrammarRows | None = None
        # the request's min_tokens on this drafter's rows (`attach_min_tokens`)
        self.min_tokens: Processor | None = None

    def with_params(self, params: SamplingParams) -> ModelDrafter:
        """The same draft engine (and cache) under other sampling settings: q must come
        from the settings the target's p uses, so a new temperature needs a new drafter."""
        return ModelDrafter(self.engine, params, self.n_vocab, self.p_min)

    @property
    def model(self) -> ModelDrafter:
        """The drafter's draft-model part: itself (a `HybridDrafter`'s is its `model`)."""
        return self

    @property
    def cached_tokens(self) -> int:
        """Positions held in the draft model's KV cache."""
        return len(self.engine.tokens)

    def _align(self, row: Logits) -> Logits:
        v = self.n_vocab
        if row.shape[0] == v:
            return row
        if row.shape[0] > v:
            return row[:v]
        out = np.full(v, -np.inf, dtype=np.float32)
        out[: row.shape[0]] = row
        return out

    def behind(self, context: list[int]) -> int:
        """Tokens of `context` the draft cache lacks (at least its last one, whose row a
        block starts from): what the next block's first decode evaluates."""
        return len(context) - self._reusable(context)

    def _reusable(self, context: list[int]) -> int:
        """Cached positions that can stay: the common prefix with `context`, leaving at
        least its last token to evaluate (its logits are needed)."""
        return min(common_prefix(self.engine.tokens, context), len(context) - 1)

    def prefill(self, context: list[int], evaluate: bool = True) -> None:
        """Evaluate the prompt except its last token (done with the target's prefill),
        then one single-token pass that is rolled back: the first single-token decode
        after a long batch is slow (graph set-up) and would skew the first round's cost.

        With `evaluate` False, only drop the cached positions that are not a prefix of
        the prompt: the rest is left to the first block's decodes (a catch-up). The
        server prefills its drafts so, only once a slot is chosen to speculate: under
        load, where it is not, a draft prefill per request is pure loss."""
        if not evaluate:
            self.rollback(context)
            return
        if len(context) > 1:
            self.rollback(context)
            missing = context[len(self.engine.tokens) : -1]
            if missing:
                self.engine.decode(missing)
        base = len(self.engine.tokens)
        self.engine.decode(context[-1:])
        self.engine.truncate(base)

    def rollback(self, context: list[int]) -> None:
        """Drop cached positions that are not a prefix of the committed context
        (stage 5 for the draft's cache)."""
        self.engine.truncate(self._reusable(context))

    def _confident(self, row: Logits, probs: np.ndarray) -> bool:
        if self.p_min <= 0.0:
            return True
        # greedy q is one-hot and says nothing about confidence: use the raw softmax
        top = top_probability(row) if self.params.greedy else float(probs.max())
        return not should_stop(top, self.p_min)

    def _masked(self, row: Logits, context: Sequence[int], block: Sequence[int]) -> Logits:
        """`row` under the grammar. Greedy keeps it unmasked where that changes nothing:
        where the grammar allows its argmax (then the masked row's argmax too, so q is the
        same one-hot row) and the cut-off goes on without the mask (the top probability
        over the allowed tokens alone is no lower, so it goes on with the mask too).
        Sampled under top-k: the k allowed tokens top-k keeps (`top_k_rows`). A
        full-vocabulary mask can cost more than a draft pass (`specgen.grammar`)."""
        assert self.grammar is not None
        if self.params.greedy and self.grammar.allows(context, block, int(np.argmax(row))):
            if self.p_min <= 0.0 or not should_stop(top_probability(row), self.p_min):
                return row
        if not self.params.greedy and 0 < self.params.top_k < row.shape[0]:
            # the same q, the cut-off reading q alone (`_confident`)
            ahead = [*context, *block]  # the row follows them all: no block of its own
            return self.grammar.top_k_rows(row[None, :], ahead, (), self.params.top_k)[0]
        return self.grammar.row(row, context, block)

    def begin(
        self, context: list[int], k: int, rng: np.random.Generator, room: int | None = None
    ) -> Drafting:
        """Start drafting up to k tokens after `context` (the grammar's sole tokens apart,
        within `room` in all: see `Drafting`), leaving the decodes to the
        caller: `Drafting.pending` is what this drafter's engine must evaluate next (the
        server's scheduler evaluates every slot's pending tokens in one batched draft
        decode per depth; `draft` evaluates them one by one). The cache is rolled back to
        the reusable prefix here, so the pending tokens must be decoded next."""
        return Drafting(self, context, k, rng, room)

    def draft(
        self, context: list[int], k: int, rng: np.random.Generator, room: int | None = None
    ) -> Block:
        """Propose up to k tokens after `context` (see `specgen.engine.Drafter`).

        Returns a Block with tokens (m,) int64 and q, m rows warped by the target's own
        `warp_rows` (one call per row: each row exists only after the previous draw),
        m <= k (m < k only when the confidence cut-off stopped the block), not counting
        the tokens the grammar allows alone (`Block.sole`), m <= room in all.
        """
        return self.run(self.begin(context, k, rng, room))

    def run(self, d: Stepwise) -> Block:
        """Drive `d` to its end with this drafter's own engine, one decode at a time,
        timing the catch-up (`catchup_s`) and the single-token passes."""
        catchup_s = 0.0
        if d.pending:
            t0 = time.perf_counter()
            d.feed(self.engine.decode(d.pending)[-1])
            if d.behind > 2:  # more than `last` (and the previous block's x_K): catching up
                # the same batch also produced x_1's row: that part is ordinary drafting
                catchup_s = max(0.0, time.perf_counter() - t0 - (self._decode_s or 0.0))
        while d.pending:
            t1 = time.perf_counter()
            d.feed(self.engine.decode(d.pending)[-1])
            self._note_decode(time.perf_counter() - t1)
        self.catchup_s = catchup_s
        return d.block()

    def _note_decode(self, seconds: float) -> None:
        d = self._decode_s
        self._decode_s = seconds if d is None else d + 0.25 * (seconds - d)

    def close(self) -> None:
        self.engine.close()


class GrammarRows(Protocol):
    """A grammar as the drafter needs it (`specgen.grammarrows.GrammarProcessor`): its mask on
    a row (or the k allowed tokens top-k keeps), whether it allows a token, the token it
    alone allows, and the tokens it forces (a forced string, tokenized canonically), after
    the history context + block."""

    def row(self, logits: Logits, context: Sequence[int], block: Sequence[int]) -> Logits: ...

    def top_k_rows(
        self, logits: Logits, context: Sequence[int], block: Sequence[int], k: int
    ) -> Logits: ...

    def allows(self, context: Sequence[int], block: Sequence[int], token: int) -> bool: ...

    def single(self, context: Sequence[int], block: Sequence[int]) -> int | None: ...

    def forced(self, context: Sequence[int], block: Sequence[int]) -> list[int]: ...


def attach_grammar(drafter: object, grammar: GrammarRows | None) -> None:
    """Give a model drafter (alone or inside a hybrid one) the generation's grammar, or
    take the last one's away (None). Model-free drafters propose one-hot rows, exact under
    any mask (a forbidden token has p = 0 and is rejected), and keep none."""
    model = getattr(drafter, "model", drafter)
    if isinstance(model, ModelDrafter):
        model.grammar = grammar


def attach_min_tokens(drafter: object, held: Processor | None) -> None:
    """Give a model drafter (alone or inside a hybrid one) the generation's ``min_tokens``
    (`specgen.constraints.MinTokens`), or take the last one's away (None): q then never
    proposes an end the target's p holds back. Model-free drafters keep none (their
    one-hot proposals of a held token have p = 0 and are rejected)."""
    model = getattr(drafter, "model", drafter)
    if isinstance(model, ModelDrafter):
        model.min_tokens = held


class Stepwise(Protocol):
    """A block drafted one row at a time: `Drafting`, or `specgen.hybrid.HybridDrafting`
    (lookup tokens, then a `Drafting`)."""

    @property
    def pending(self) -> list[int]: ...

    @property
    def behind(self) -> int: ...

    def feed(self, row: Logits) -> None: ...

    def stop(self) -> None: ...

    def block(self) -> Block: ...


class Drafting:
    """One block being drafted by a `ModelDrafter`, one row at a time (`ModelDrafter.begin`).

    Attributes:
        pending: token ids the drafter's engine must evaluate next; `feed` takes the
            logits row after the last of them. Empty when the block is complete.
        behind: committed tokens the draft cache lacked at the start (1 or 2 when it was
            up to date: `last`, and x_K after a fully accepted block).

    K counts the proposals that are drawn or may be rejected; a token the grammar allows
    alone (`Block.sole`) is free (no draft pass, no target row, always accepted: the
    target's constrained p there is one-hot too) and does not count against it, only
    against `room`, the most tokens the block may hold (the target's room: -n and the
    context, past the grammar's lead). So a block under a schema is K model tokens plus
    every key, quote and brace between them, and the controller's K prices only what
    costs (issue 36: "the controller prices forced tokens as free").

    The law is `ModelDrafter.draft`'s whoever makes the decodes: x_i is drawn from q_i, the
    warped row after the context and x_1..x_{i-1}, with the drafter's `rng`, and q_i is
    kept as the block's row i; only the order of draws within this block uses the stream,
    so drafting several blocks in one batch draws each from its own generator.
    """

    def __init__(
        self,
        drafter: ModelDrafter,
        context: list[int],
        k: int,
        rng: np.random.Generator,
        room: int | None = None,
    ) -> None:
        self.drafter = drafter
        self.context = context
        self.rng = rng
        # the draft evaluates the context then the proposals but the last: keep that
        # inside its own context, which may be smaller than the target's
        fits = drafter.engine.n_ctx - len(context) + 1
        self.k = max(0, min(k, fits))
        self.room = max(self.k, min(k if room is None else room, fits))
        self.tokens: list[int] = []
        self.rows: list[Dists] = []
        self.sources: list[Source] = []
        self.sole: list[int] = []  # see `Block.sole`
        self.pending: list[int] = []
        self.behind = 0
        self._fed = 0  # proposals the draft engine has been given (in `pending` or before)
        if self.k > 0:
            keep = drafter._reusable(context)
            drafter.engine.truncate(keep)
            self.behind = len(context) - keep
            self._force()
            # nothing left to draw when forced tokens filled the block: no decode at all
            self.pending = context[keep:] + self._unfed() if self._open() else []

    def _open(self) -> bool:
        """Whether the block takes another drawn proposal: fewer than k of them (the
        grammar's sole tokens apart) and room for one more token."""
        return len(self.tokens) - len(self.sole) < self.k and len(self.tokens) < self.room

    def _force(self) -> None:
        """Append the tokens the grammar forces, while the block has room, each with a
        one-hot q (the law it was proposed by: exact under the rejection rule, as any q
        is) and no draft row: the draft model evaluates them with its next decode, whose
        row is the one after the last of them.

        Two kinds. A token the grammar allows alone (`GrammarRows.single`): the target's
        constrained p there is one-hot on it too, so it is always accepted and its
        position needs no target row (its index goes to `Block.sole`). Else the first
        token of a forced string (`GrammarRows.forced`, llguidance's `compute_ff_tokens`:
        the forced bytes tokenized canonically) where the mask allows other tokens too
        (another tokenization of the same bytes): p there is the target's, so it keeps
        its row and may be rejected, so it counts against k. Sole tokens are chained after
        the k-th proposal too, while there is room: they cost nothing."""
        g = self.drafter.grammar
        if g is None:
            return
        while len(self.tokens) < self.room:
            t = g.single(self.context, self.tokens)
            if t is not None:
                self.sole.append(len(self.tokens))
            elif not self._open():
                return
            else:
                forced = g.forced(self.context, self.tokens)
                if not forced:
                    return
                t = forced[0]
            self.tokens.append(t)
            self.rows.append(Dists.one_hot(np.array([t], dtype=np.int64), self.drafter.n_vocab))
            self.sources.append("grammar")

    def _unfed(self) -> list[int]:
        """The proposals the draft engine has not been given yet (and now is)."""
        out = self.tokens[self._fed :]
        self._fed = len(self.tokens)
        return out

    def feed(self, row: Logits) -> None:
        """The (n_vocab,) logits row after `pending`: draw the next proposal from it, or
        stop (k reached, or the confidence cut-off). With constraints, the row is processed
        first (history: the context and the proposals so far), so q_i is exactly the law
        x_i is drawn from and the law the target's row i is held to."""
        d = self.drafter
        row = d._align(row)
        if d.min_tokens is not None:
            row = d.min_tokens.row(row, self.context, self.tokens)
        if d.processor is not None:
            row = d.processor.row(row, self.context, self.tokens)
        if d.grammar is not None:  # the mask last: its -inf commutes with bias and penalties
            row = d._masked(row, self.context, self.tokens)
        q_i = warp_rows(row[None, :], d.params)
        ids, probs = q_i.row(0)
        self.pending = []
        if not d._confident(row, probs):
            return
        self.tokens.append(draw(ids, probs, self.rng))
        self.rows.append(q_i)
        self.sources.append("draft")
        self._force()
        if self._open():
            self.pending = self._unfed()

    def stop(self) -> None:
        """End the block at the proposals so far (`specgen.hybrid` continues it by lookup):
        nothing more is pending, and the cache holds the context and x_1..x_{m-1}."""
        self.pending = []

    def block(self) -> Block:
        """The proposals so far: tokens (m,) int64, their q rows, their sources ("draft",
        or "grammar" for the tokens the grammar forced) and which of those the grammar
        allowed alone (`Block.sole`)."""
        d = self.drafter
        rows = self.rows
        if "grammar" in self.sources and any(r.dense for r in rows):
            # the model's rows are dense (no truncation): the one-hot rows must be too
            rows = [Dists(None, r.to_dense(), d.n_vocab) if not r.dense else r for r in rows]
        sources = tuple(self.sources) if "grammar" in self.sources else ()
        return Block(
            np.array(self.tokens, dtype=np.int64),
            Dists.concat(rows, d.n_vocab),
            sources,
            tuple(self.sole),
        )
