"""Hybrid drafting (`--lookup on|auto` with a draft model): prompt lookup where the text
copies its context, the draft model elsewhere, in one block.

Each round, before drafting, the drafter looks up the longest suffix n-gram of the
committed context (`specgen.ngram.NgramIndex`). When the match is at least `min_match`
tokens long and lookups of that length have a good record, the tokens that followed the
match are proposed first, with one-hot q rows (a deterministic proposal), up to K or to
the end of the context (a copy "runs out" where its source does); the draft model then
continues the block from there, each token with its warped q row. Otherwise the model
drafts. After each model token the lookup is tried again on the text with the block so
far: where the model's tokens start a copy (a quote begins in mid-block), a trusted match
fills the rest of the block with lookup tokens and the model stops drafting.

Why the output is still the target's: a block's q rows only need to be the exact law
each x_i was drawn from given everything before the verification. A lookup token is a
function of the committed context and of the statistics of earlier rounds (never of
this round's target output), so its law is one-hot on it; a model token after it is a
draw from the model's warped row after the context and the earlier proposals. Either
acceptance rule (`specgen.rejection`) then applies to the mixed block unchanged. The same
holds for lookup tokens after model tokens: whether and what the lookup proposes there is
a function of the context, of x_1..x_{i-1} and of earlier rounds' record, so q_i is
one-hot on the proposal given everything before it.

The record. After each round (`rollback`, with the committed context) the lookup that
was, or would have been, proposed is scored against the tokens the round committed.
Those tokens follow the target's law whatever proposed them, so a lookup token x that
meets a committed prefix is matched with probability p(x), exactly its acceptance
probability with a one-hot q: the match rate is an unbiased estimate of the lookup's
acceptance rate, measured also in rounds where the model drafted. The model's own
acceptance is estimated from the rounds where it drafted. Lookup is trusted for a match
length when its rate is at least the model's less a margin (`MARGIN`), or when no lookup
of that length was scored yet: a lookup token costs no draft pass, so where both are
nearly always right (a model copying a passage it can see) the free one wins. A lookup
made after model tokens is scored only where the round reached it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specgen.drafters import Drafting, ModelDrafter, common_prefix
from specgen.engine import Block, Logits
from specgen.events import Source
from specgen.ngram import NgramIndex
from specgen.sampling import Dists, SamplingParams

LOOKUP: Source = "lookup"
DRAFT: Source = "draft"
MARGIN = 0.15
"""How much lower than the model's a lookup's acceptance rate may be and still be used:
a model token costs a draft pass (a third to a half of a target pass on CPU), a lookup
token nothing, so a slightly lower rate still pays."""
_DECAY = 0.9
"""Weight of the past in the rate estimates per update: about the last ten rounds."""
_PRIOR_RATE = 0.6
_GREEDY_PRIOR_RATE = 0.79
_PRIOR_WEIGHT = 2.0
"""Prior acceptance (pseudo-counts) of both sources before any round: equal, so the
first match is tried, and either record soon outweighs it. Under greedy decoding the
controller's prior with no evidence (`BatchController.new_acceptance`: the mean of Beta(1,
1) plus one standard deviation), so that a copy's first blocks are valued as a lookup-only
slot's are (at 0.6 a copy's K grew 3, 6, 15 where prompt lookup alone's grew 5, 16: 0.83x
and 0.89x prompt lookup alone on a function to rewrite and a passage to repeat, 64 greedy
tokens); sampled, 0.6: a one-hot proposal is accepted with probability p(x) < 1 even where
the text copies, and at 0.79 lookup tokens were trusted and valued where they were wrong,
the model's block after them lost with them (`specgen run` at temperature 0.8: 26.1
against 29.6 tokens/s, 7 alternations)."""


@dataclass
class Rate:
    """A discounted acceptance rate: accepted / tested over recent updates, shrunk
    towards `prior`."""

    accepted: float = 0.0
    tested: float = 0.0
    prior: float = _PRIOR_RATE

    def add(self, accepted: int, tested: int) -> None:
        if tested <= 0:
            return
        self.accepted = _DECAY * self.accepted + accepted
        self.tested = _DECAY * self.tested + tested

    @property
    def value(self) -> float:
        return (self.accepted + self.prior * _PRIOR_WEIGHT) / (self.tested + _PRIOR_WEIGHT)


@dataclass
class LookupRecord:
    """Acceptance estimates: prompt lookup per matched n-gram length, and the draft model,
    each from `prior` (`for_params` picks it)."""

    lookup: dict[int, Rate] = field(default_factory=dict)
    model: Rate = field(default_factory=Rate)
    prior: float = _PRIOR_RATE

    def __post_init__(self) -> None:
        self.model.prior = self.prior

    @classmethod
    def for_params(cls, params: SamplingParams) -> LookupRecord:
        """An empty record with the prior for these settings (`_GREEDY_PRIOR_RATE` when
        greedy, else `_PRIOR_RATE`)."""
        return cls(prior=_GREEDY_PRIOR_RATE if params.greedy else _PRIOR_RATE)

    def rate_of(self, n: int) -> Rate:
        """The rate of n-token matches, made (at the prior) when absent."""
        return self.lookup.setdefault(n, Rate(prior=self.prior))

    def trusts(self, n: int) -> bool:
        """Propose lookup tokens after an n-token match: its rate is at least the model's
        less `MARGIN`, or no n-token lookup was scored yet. Untried lengths are tried: the
        prior alone would fall below a model that has been right for a few rounds (text
        that starts copying itself after a fully accepted block was drafted by the model
        for a whole block before its lookup had a record), and one try costs little (its
        tokens cost no draft pass) and gives the record its first score."""
        rate = self.lookup.get(n)
        return rate is None or rate.tested == 0 or rate.value >= self.model.value - MARGIN

    def rate(self, n: int) -> float:
        """The estimated acceptance rate of a lookup token after an n-token match (the
        prior where none was scored yet)."""
        rate = self.lookup.get(n)
        return (rate or Rate(prior=self.prior)).value


@dataclass
class _Pending:
    start: int  # committed tokens when the block was drafted
    n_match: int  # matched n-gram length (0: no match)
    lookup: list[int]  # the lookup's proposal, used or not
    tokens: list[int]  # the block proposed
    n_head: int  # lookup tokens before the model's
    tail_at: int  # where the lookup took over after the model's tokens (len(tokens): never)
    n_tail_match: int  # the matched length there


def _matched(proposal: list[int], new: list[int]) -> tuple[int, int]:
    """(accepted, tested) of a proposal against the committed tokens: tokens up to and
    including the first mismatch are tested, and only those the round reached."""
    if not proposal or not new:
        return 0, 0
    c = common_prefix(proposal, new)
    return c, min(c + 1, len(proposal), len(new))


class HybridDrafter:
    """A `Drafter` (`specgen.engine`) mixing prompt lookup and a draft model (see above).

    Args:
        model: the draft model's drafter (its engine is this drafter's `engine`, so the
            loop times its passes).
        n_max, n_min: longest and shortest n-gram matched (`--ngram-max`).
        min_match: shortest match that may propose lookup tokens (a 1-token match is
            right too seldom to be worth a round).
        pool: a record that this drafter's scorings are also added to (not while it
            has a prediction, `NgramIndex.predict`: matches in a client's own text say
            nothing of other requests' prompt lookup), and that
            `lookup_offer` reads for a match length its own record has not scored yet (a
            server keeps one per sampling setting for all its requests). Only the offer's
            rate reads it, never what is proposed: a request's proposals, and so its
            seeded output at a fixed K, do not depend on other requests.
    """

    def __init__(
        self,
        model: ModelDrafter,
        n_max: int = 4,
        n_min: int = 1,
        min_match: int = 2,
        pool: LookupRecord | None = None,
    ) -> None:
        self.model = model
        self.engine = model.engine
        self.catchup_s = 0.0  # the model's, from the last draft (see `specgen.engine.Drafter`)
        self.name = f"{model.name}+lookup"
        self.n_vocab = model.n_vocab
        self.index = NgramIndex(n_max, n_min)
        self.min_match = min_match
        self.record = LookupRecord.for_params(model.params)
        self.pool = pool
        self._pending: _Pending | None = None
        # the caller holds the model out this step (`specgen.sched.step._lookup_first`)
        self.model_held = False

    def with_params(self, params: SamplingParams) -> HybridDrafter:
        """The same engines under other sampling settings (see `ModelDrafter.with_params`);
        the record starts afresh, as acceptance depends on the settings."""
        return HybridDrafter(
            self.model.with_params(params), self.index.n_max, self.index.n_min, self.min_match
        )

    @property
    def params(self) -> SamplingParams:
        """The model's sampling settings (its q rows')."""
        return self.model.params

    @property
    def cached_tokens(self) -> int:
        return self.model.cached_tokens

    def behind(self, context: list[int]) -> int:
        """`ModelDrafter.behind` of the model's cache."""
        return self.model.behind(context)

    def prefill(self, context: list[int], evaluate: bool = True) -> None:
        """A generation starts: index its prompt, start the record afresh, and
        `ModelDrafter.prefill` the model's cache. The record is the generation's own (the
        pool, if any, keeps what requests share): its scores decide which tokens are
        proposed, so a record kept from an earlier call on the same drafter made a seeded
        call's text depend on the calls before it (`specgen.Pair`'s first call after
        `load` differed from the same call made again)."""
        self.index.reset()
        self.index.lookup(context, 0)
        self.record = LookupRecord.for_params(self.model.params)
        self._pending = None
        self.model.prefill(context, evaluate)

    def _lookup(self, context: list[int], k: int) -> tuple[int, list[int], list[int]]:
        """(n_match, found, use): the suffix match, the tokens it proposes, and those to
        propose (all of them when the match is long enough and trusted, else none). While
        `model_held` the drafter is prompt lookup alone and proposes as `NgramDrafter`
        does, after any match (1-token ones too): the alternative is then an ordinary
        round, not the model's block, so there is nothing to trust it against, and the
        controller values the tokens at the record's rate for that length. (Holding 1-token
        matches back cost a text that quotes its prompt its first lookup blocks: 0.91x
        prompt lookup alone on a summary with quotes, 64 greedy tokens.)"""
        n_match, found = self.index.match(context, k, wrap=False)
        if self.model_held:
            return n_match, found, found
        use = found if n_match >= self.min_match and self.record.trusts(n_match) else []
        return n_match, found, use

    def lookup_offer(self, context: list[int], k: int) -> tuple[int, float]:
        """(positions, rate): how many of a k-token block's positions `begin` would fill by
        prompt lookup now (0 when no trusted match: the positions that cost no draft
        decode), and the estimated acceptance rate of each of those lookup tokens
        (`LookupRecord.rate` of the match's length; the pool's where this drafter has not
        scored that length yet), what a controller values them at. Not the model's rate:
        the two differ most at a high temperature, and lookup tokens valued at the model's
        rate were proposed where their own rate did not pay for the target rows they
        cost."""
        n_match, _, use = self._lookup(context, k)
        own = self.record.lookup.get(n_match)
        if (own is None or own.tested == 0) and self.pool is not None:
            return len(use), self.pool.rate(n_match)
        return len(use), self.record.rate(n_match)

    def begin(
        self, context: list[int], k: int, rng: np.random.Generator, room: int | None = None
    ) -> HybridDrafting:
        """Start a block (see `ModelDrafter.begin`): the lookup tokens are chosen here,
        the model's continuation is left to the caller's decodes (`pending`/`feed`)."""
        room = k if room is None else max(k, room)
        n_match, found, use = self._lookup(context, k)
        source = self.index.source  # the context's or the prediction's
        inner = (
            self.model.begin(context + use, k - len(use), rng, room - len(use))
            if len(use) < k
            else None
        )
        return HybridDrafting(self, context, k, n_match, found, use, inner, room, source)

    def draft(
        self, context: list[int], k: int, rng: np.random.Generator, room: int | None = None
    ) -> Block:
        """Up to k proposals: lookup tokens first (when trusted), then the model's, then
        lookup tokens again where the model's start a trusted copy.

        Returns:
            Block with tokens (m,) int64, q (m rows: one-hot for lookup tokens, the
            model's warped rows for its own; dense when the model's rows are) and
            `sources` ("lookup", "prediction" or "draft" per token), m <= k.
        """
        block = self.model.run(self.begin(context, k, rng, room))
        self.catchup_s = self.model.catchup_s
        return block

    def rollback(self, context: list[int]) -> None:
        """Score the last block against what the round committed (see the record above),
        then roll the draft model's cache back."""
        pending, self._pending = self._pending, None
        if pending is not None and len(context) > pending.start:
            new = context[pending.start :]
            # a prediction's matches say nothing of other requests' prompt lookup
            records = [self.record]
            if self.pool is not None and not self.index.predicting:
                records.append(self.pool)
            p, head, tail = pending, pending.n_head, pending.tail_at
            reached = common_prefix(p.tokens, new)
            for record in records:
                if pending.n_match:
                    rate = record.rate_of(pending.n_match)
                    rate.add(*_matched(pending.lookup, new))
                if tail > head and reached >= head:
                    record.model.add(*_matched(p.tokens[head:tail], new[head:]))
                if tail < len(p.tokens) and reached >= tail:
                    # a used lookup, tested only where the round reached it: still unbiased
                    rate = record.rate_of(p.n_tail_match)
                    rate.add(*_matched(p.tokens[tail:], new[tail:]))
        self.model.rollback(context)

    def close(self) -> None:
        self.index.reset()
        self.model.close()


class HybridDrafting:
    """A hybrid block being drafted (`HybridDrafter.begin`): the lookup tokens, then the
    model's `Drafting` after them (None when the lookup filled the block), then lookup
    tokens again where the model's tokens start a copy (`feed`). `pending` and `behind`
    are the model's; `block` joins the parts and records the block for the next
    `rollback`'s scoring."""

    def __init__(
        self,
        hybrid: HybridDrafter,
        context: list[int],
        k: int,
        n_match: int,
        found: list[int],
        use: list[int],
        inner: Drafting | None,
        room: int | None = None,
        source: Source = LOOKUP,
    ) -> None:
        self.hybrid = hybrid
        self.context, self.k = context, k
        self.room = k if room is None else room
        self.n_match, self.found, self.use = n_match, found, use
        self.inner = inner
        self.tail: list[int] = []  # lookup tokens after the model's
        self.n_tail_match = 0
        # the lookup tokens' source before and after the model's ("lookup", "prediction")
        self.sources: tuple[Source, Source] = (source, LOOKUP)

    @property
    def pending(self) -> list[int]:
        return self.inner.pending if self.inner is not None else []

    @property
    def behind(self) -> int:
        return self.inner.behind if self.inner is not None else 0

    def feed(self, row: Logits) -> None:
        """The model's next row (`Drafting.feed`); then, if the model would go on, the
        lookup on the text so far: a trusted match of at least `min_match` tokens ends
        the model's part and proposes the copy for the rest of the block."""
        inner = self.inner
        assert inner is not None, "nothing pending"
        inner.feed(row)
        if not inner.pending:
            return
        h = self.hybrid
        # the grammar's sole tokens count against the room only (`Drafting`)
        left = min(
            self.k - len(self.use) - (len(inner.tokens) - len(inner.sole)),
            self.room - len(self.use) - len(inner.tokens),
        )
        n, found = h.index.match_after(self.context, self.use + inner.tokens, left)
        if found and n >= h.min_match and h.record.trusts(n):
            self.tail, self.n_tail_match = found, n
            self.sources = (self.sources[0], h.index.source)
            inner.stop()

    def stop(self) -> None:
        """End the block at the proposals so far (`Drafting.stop`): the server cuts every
        block short when a request arrives during drafting (`Drafting._draft_depths`)."""
        if self.inner is not None:
            self.inner.stop()

    def block(self) -> Block:
        h, use, tail = self.hybrid, self.use, self.tail
        model = self.inner.block() if self.inner is not None else None
        model_tokens = model.tokens.tolist() if model is not None else []
        dense = model is not None and bool(model_tokens) and model.q.dense

        def one_hot(tokens: list[int]) -> Dists:
            rows = Dists.one_hot(np.array(tokens, dtype=np.int64), h.n_vocab)
            return Dists(None, rows.to_dense(), h.n_vocab) if dense else rows

        rows = [one_hot(use)] if use else []
        if model is not None and model_tokens:
            rows.append(model.q)
        if tail:
            rows.append(one_hot(tail))
        # the model's part may hold tokens its grammar forced ("grammar")
        model_sources = (
            model.sources if model is not None and model.sources else (DRAFT,) * len(model_tokens)
        )
        head, after = self.sources
        sources = (head,) * len(use) + tuple(model_sources) + (after,) * len(tail)
        tokens = use + model_tokens + tail
        tail_at = len(use) + len(model_tokens) if tail else len(tokens)
        h._pending = _Pending(
            len(self.context),
            self.n_match,
            self.found,
            tokens,
            len(use),
            tail_at,
            self.n_tail_match,
        )
        # the model's tokens the grammar allowed alone, at their place in the whole block
        sole = tuple(len(use) + i for i in model.sole) if model is not None else ()
        return Block(np.array(tokens, dtype=np.int64), Dists.concat(rows, h.n_vocab), sources, sole)
