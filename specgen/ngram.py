"""Model-free drafting by prompt lookup (`--draft ngram`).

Prompt-lookup decoding (Saxena 2023, "Prompt Lookup Decoding"; llama.cpp's
`llama-lookup`): find the most recent earlier occurrence of the longest n-gram that
ends the context and propose the tokens that followed it. Text that copies from its
context (extraction, summaries with quotes, code edits) is drafted for free.

Why the exact acceptance rule still applies: the proposal x is a deterministic function
of the context, so the draft "distribution" is q = delta_x (one-hot rows). Leviathan et
al. 2023, Algorithm 1 then accepts x with probability min(1, p(x) / q(x)) = p(x) and on
rejection draws from norm(max(0, p - delta_x)), which is p with x removed and
renormalized: P(emit y) = p(x) [y = x] + (1 - p(x)) p(y) [y != x] / (1 - p(x)) = p(y).
At temperature 0 this is the familiar "accept while x equals the target's argmax".
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from specgen.engine import Block
from specgen.events import Source
from specgen.sampling import Dists, SamplingParams


def _continue(context: Sequence[int], start: int, k: int) -> list[int]:
    """Up to k tokens from context[start:], reading past the end into the proposal
    itself, so a match close to the end still yields k tokens (a period-P repetition
    is continued periodically: the copy keeps following the same occurrence)."""
    out: list[int] = []
    n = len(context)
    for t in range(k):
        i = start + t
        out.append(int(context[i]) if i < n else out[i - n])
    return out


def lookup(context: Sequence[int], k: int, n_max: int = 4, n_min: int = 1) -> list[int]:
    """Prompt lookup: the tokens that followed the most recent earlier occurrence of the
    longest suffix n-gram of the context.

    For n from n_max down to n_min, the pattern is the last n tokens; an earlier
    occurrence starts at j with j + n <= len(context) - 1 (so it is not the suffix
    itself and at least one token follows it). The largest such j wins, and the proposal
    is context[j + n :], continued into itself when it reaches the end, cut at k tokens.

    Args:
        context: token ids, the committed text (prompt + output so far).
        k: most tokens to propose (>= 0).
        n_max, n_min: longest and shortest n-gram to try (1 <= n_min <= n_max).

    Returns:
        k proposed token ids when some n-gram matches, else [] (k = 0 gives []).
    """
    size = len(context)
    if k <= 0 or size < 2:
        return []
    arr = np.asarray(context, dtype=np.int64)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        # windows over context[:-1]: start j covers j..j+n-1 <= size-2
        windows = sliding_window_view(arr[:-1], n)
        # filter on the last token first (cheap, selective), then compare whole windows
        cand = np.flatnonzero(windows[:, -1] == arr[-1])
        if cand.size == 0:
            continue
        full = cand[(windows[cand] == arr[size - n :]).all(axis=1)]
        if full.size:
            return _continue(context, int(full[-1]) + n, k)
    return []


class NgramIndex:
    """Incremental form of `lookup` for a context that grows by appending.

    Keeps, for each n in [n_min, n_max], a dict from n-gram to the start of its most
    recent occurrence that ends before the last token, so one lookup costs O(n_max)
    dict probes plus O(new tokens) updates instead of a scan of the whole context. A
    context that is not an extension of the indexed one (a new prompt) is re-indexed.

    A predicted output (`predict`: OpenAI's Predicted Outputs, the text a request expects
    its output to contain) is matched too, and preferred where its match is at least as
    long as the context's: the proposal is then the prediction's tokens after the match.
    Still a deterministic function of the committed context (and of the earlier lookups,
    through where in the prediction the last match was), so q stays one-hot on it and the
    module docstring's argument holds unchanged.
    """

    def __init__(self, n_max: int = 4, n_min: int = 1) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_max = n_max
        self.n_min = n_min
        self.reset()
        self.predict(())

    def predict(self, tokens: Sequence[int]) -> None:
        """Match against `tokens` (token ids: a predicted output) as well, from now on;
        () for none. `reset` keeps it (a new context of the same generation): a drafter
        sets it at each generation's start (`specgen.sched.slot.Slots.start`).

        Each n-gram of the prediction with a token after it is indexed by all its starts
        (O(len(tokens) * n_max) once: about 2 us a token, 8 ms for 4,096 tokens on a
        2-vCPU AMD EPYC, in the worker at the request's start); where one occurs several
        times, the first at or after the last match's start is taken (a copy reads the
        prediction forward), else the last before it."""
        self._pred = [int(t) for t in tokens]
        self._pred_starts: dict[tuple[int, ...], list[int]] = {}
        for n in range(self.n_min, self.n_max + 1):
            for j in range(len(self._pred) - n):
                self._pred_starts.setdefault(tuple(self._pred[j : j + n]), []).append(j)
        self._pred_at = self._pred_n = 0  # the last match used: where, how long
        self.source: Source = "lookup"  # where the last proposal came from

    @property
    def predicting(self) -> bool:
        """Whether a prediction is set (`predict`)."""
        return bool(self._pred)

    def _predicted(self, tail: list[int], n_top: int, n_context: int, k: int) -> list[int]:
        """Up to k of the prediction's tokens after the longest suffix n-gram of `tail`
        (n <= n_top) found in it, where that match is at least `n_context` tokens long
        (the context's own match); [] otherwise. The match used is where the next one is
        looked for from."""
        if not self._pred_starts:
            return []
        for n in range(min(self.n_max, n_top, len(tail)), max(self.n_min, n_context) - 1, -1):
            starts = self._pred_starts.get(tuple(tail[len(tail) - n :]))
            if starts:
                i = bisect.bisect_left(starts, self._pred_at)
                self._pred_at = j = starts[i] if i < len(starts) else starts[-1]
                self._pred_n, self.source = n, "prediction"
                return self._pred[j + n : j + n + k]
        return []

    def reset(self) -> None:
        self._tokens: list[int] = []
        self._last: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(self.n_min, self.n_max + 1)
        }

    def _sync(self, context: Sequence[int]) -> None:
        old = len(self._tokens)
        # list compare runs in C: ~10 us for a few thousand tokens
        if len(context) < old or list(context[:old]) != self._tokens:
            self.reset()
            old = 0
        new = [int(t) for t in context[old:]]
        if not new:
            return
        toks = self._tokens
        toks.extend(new)
        # n-grams ending at e (inclusive), for e <= len - 2, not indexed yet; in increasing
        # e order so the dict keeps the most recent start
        first_e = max(old - 1, 0)
        for e in range(first_e, len(toks) - 1):
            for n, table in self._last.items():
                j = e - n + 1
                if j >= 0:
                    table[tuple(toks[j : e + 1])] = j

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        """Same result as `lookup(context, k, n_max, n_min)` where no prediction is set."""
        return self.match(context, k)[1]

    def match(self, context: Sequence[int], k: int, wrap: bool = True) -> tuple[int, list[int]]:
        """(n, proposal): the matched n-gram's length (0 when none matched) and the
        tokens `lookup` proposes (the prediction's, where its match is as long: never
        wrapped; `source` then says "prediction", else "lookup"). With wrap=False the
        proposal stops where the context does (fewer than k tokens when the match is
        close to the end) instead of continuing into itself."""
        self._sync(context)
        toks = self._tokens
        size = len(toks)
        if k <= 0 or size < 2:
            return 0, []
        tail = toks[max(0, size - self.n_max) :]
        n, j = self._longest(tail, size - 1)
        found = self._predicted(tail, size, n, k)
        if found:
            return self._pred_n, found
        self.source = "lookup"
        if j is None:
            return 0, []
        return n, _continue(toks, j + n, k if wrap else min(k, size - j - n))

    def _longest(self, tail: list[int], n_top: int) -> tuple[int, int | None]:
        """(n, j): the longest suffix n-gram of `tail` (n <= n_top) with an indexed
        occurrence, and where that occurrence starts; (0, None) when none has one."""
        for n in range(min(self.n_max, n_top), self.n_min - 1, -1):
            j = self._last[n].get(tuple(tail[len(tail) - n :]))
            if j is not None:
                return n, j
        return 0, None

    def match_after(
        self, context: Sequence[int], extra: Sequence[int], k: int
    ) -> tuple[int, list[int]]:
        """`match` for `context + extra` where `extra` (a block's proposals so far) is not
        committed: the index is synced with `context` only, so a proposal rejected later
        never enters it (re-indexing after a rollback costs O(context)).

        The pattern is the longest suffix n-gram of `context + extra` (it may span the
        join); only occurrences in the indexed `context` count (ending before its last
        token, as in `match`), and the proposal is the committed tokens after the most
        recent one, stopping where `context` does (no wrap), cut at k; or, where the
        prediction's match is as long, the prediction's tokens after it (as in `match`).

        Returns:
            (n, proposal): the matched length (0 when none) and up to k token ids.
        """
        self._sync(context)
        toks = self._tokens
        size = len(toks)
        if k <= 0 or size < 2:
            return 0, []
        tail = toks[max(0, size - self.n_max) :] + [int(t) for t in extra]
        n, j = self._longest(tail, len(tail))
        found = self._predicted(tail, len(tail), n, k)
        if found:
            return self._pred_n, found
        self.source = "lookup"
        if j is None:
            return 0, []
        return n, toks[j + n : j + n + min(k, size - j - n)]


class NgramDrafter:
    """A `Drafter` (see `specgen.engine`) that proposes by prompt lookup, with one-hot q.

    Args:
        n_vocab: vocabulary size of the target (width of the q rows).
        n_max, n_min: longest and shortest n-gram matched (`--ngram-max`, `--ngram-min`).
    """

    name = "ngram"
    cached_tokens = -1
    """No KV cache (see `specgen.engine.Drafter`)."""

    engine = None  # model-free: nothing to time
    catchup_s = 0.0  # and never behind

    def __init__(self, n_vocab: int, n_max: int = 4, n_min: int = 1) -> None:
        self.n_vocab = n_vocab
        self.index = NgramIndex(n_max, n_min)

    def prefill(self, context: list[int]) -> None:
        """Index the prompt (nothing to evaluate: there is no model)."""
        self.index.reset()
        self.index.lookup(context, 0)

    def draft(
        self, context: list[int], k: int, rng: np.random.Generator, room: int | None = None
    ) -> Block:
        """Up to k tokens (0 when no n-gram matches); ``rng`` and ``room`` are unused
        (deterministic; prompt lookup keeps no grammar, so no token is free of k).

        Returns:
            Block with tokens (m,) int64 and one-hot q rows (sparse, one id each), m in
            {0, k}.
        """
        tokens = np.array(self.index.lookup(context, k), dtype=np.int64)
        sources: tuple[Source, ...] = (self.index.source,) * tokens.size
        return Block(tokens=tokens, q=Dists.one_hot(tokens, self.n_vocab), sources=sources)

    def rollback(self, context: list[int]) -> None:
        """Nothing to roll back: the index re-syncs with the context at the next lookup."""

    def with_params(self, params: SamplingParams) -> NgramDrafter:
        """Itself: one-hot q rows do not depend on the sampling settings."""
        return self

    def close(self) -> None:
        self.index.reset()
