"""Prompt lookup (`specgen.ngram`): exact lookups, the drafter's one-hot blocks."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial

import numpy as np

from specgen import ngram
from specgen.ngram import NgramDrafter, NgramIndex, lookup


def test_longest_ngram_wins() -> None:
    # suffix [1, 2, 3]: the 3-gram occurs at 0 (followed by 9), the 1-gram [3] more
    # recently at 6 (followed by 7): the longer match wins
    ctx = [1, 2, 3, 9, 5, 5, 3, 7, 1, 2, 3]
    assert lookup(ctx, 2, n_max=3) == [9, 5]
    assert lookup(ctx, 2, n_max=1) == [7, 1]


def test_most_recent_occurrence_wins() -> None:
    ctx = [4, 5, 10, 4, 5, 20, 4, 5]
    assert lookup(ctx, 1, n_max=2) == [20]
    assert lookup(ctx, 3, n_max=2) == [20, 4, 5]


def test_no_match_is_empty() -> None:
    assert lookup([1, 2, 3, 4], 5) == []
    assert lookup([7], 3) == []
    assert lookup([], 3) == []
    # n_min above the only matching length: nothing
    assert lookup([1, 2, 9, 2], 3, n_max=4, n_min=2) == []
    assert lookup([1, 2, 9, 2], 3, n_max=4, n_min=1) == [9, 2, 9]


def test_k_caps_and_zero() -> None:
    ctx = [1, 2, 3, 4, 5, 6, 1, 2]
    assert lookup(ctx, 3) == [3, 4, 5]
    assert lookup(ctx, 0) == []


def test_continues_periodically_past_the_end() -> None:
    # period 2: the most recent [1, 2] is two tokens back; the copy runs into itself
    assert lookup([1, 2, 1, 2], 5, n_max=2) == [1, 2, 1, 2, 1]
    assert lookup([7, 7, 7], 4, n_max=2) == [7, 7, 7, 7]


def test_suffix_itself_is_not_a_match() -> None:
    # [3] occurs only as the last token: no earlier occurrence
    assert lookup([1, 2, 3], 2) == []


def test_index_agrees_with_lookup_on_random_growing_contexts() -> None:
    rng = np.random.default_rng(0)
    for trial in range(20):
        n_vocab = int(rng.integers(2, 12))
        idx = NgramIndex(n_max=int(rng.integers(1, 5)), n_min=1)
        ctx: list[int] = []
        for _ in range(60):
            ctx.extend(rng.integers(0, n_vocab, size=int(rng.integers(1, 4))).tolist())
            k = int(rng.integers(0, 6))
            assert idx.lookup(ctx, k) == lookup(ctx, k, idx.n_max, idx.n_min), (trial, ctx)
        # a context that is not an extension is re-indexed
        ctx = rng.integers(0, n_vocab, size=30).tolist()
        assert idx.lookup(ctx, 4) == lookup(ctx, 4, idx.n_max, idx.n_min)


def _match_after_by_scan(ctx, extra, k, n_max, n_min):
    """`NgramIndex.match_after` by its definition: the longest suffix n-gram of
    ctx + extra, its most recent occurrence ending before ctx's last token, the committed
    tokens after it."""
    text = ctx + extra
    if k <= 0 or len(ctx) < 2:
        return 0, []
    for n in range(min(n_max, len(text)), n_min - 1, -1):
        pattern = text[len(text) - n :]
        starts = [j for j in range(len(ctx) - n) if ctx[j : j + n] == pattern]
        if starts:
            j = starts[-1]
            return n, ctx[j + n : j + n + k]
    return 0, []


def test_match_after_agrees_with_its_definition_and_leaves_the_index_alone() -> None:
    rng = np.random.default_rng(1)
    for trial in range(300):
        n_vocab = int(rng.integers(2, 8))
        n_max = int(rng.integers(1, 5))
        n_min = int(rng.integers(1, n_max + 1))
        idx = NgramIndex(n_max=n_max, n_min=n_min)
        ctx = rng.integers(0, n_vocab, size=int(rng.integers(0, 40))).tolist()
        extra = rng.integers(0, n_vocab, size=int(rng.integers(0, 6))).tolist()
        k = int(rng.integers(0, 7))
        got = idx.match_after(ctx, extra, k)
        assert got == _match_after_by_scan(ctx, extra, k, n_max, n_min), (trial, ctx, extra)
        # the proposals were not indexed: the committed context is, and a lookup on it
        # is the plain one (no re-indexing from a rejected extension)
        assert idx._tokens == ctx
        assert idx.match(ctx, k) == NgramIndex(n_max, n_min).match(ctx, k)


def test_drafter_block_is_one_hot() -> None:
    d = NgramDrafter(n_vocab=50, n_max=3)
    ctx = [1, 2, 3, 4, 5, 1, 2]
    d.prefill(ctx)
    block = d.draft(ctx, 4, np.random.default_rng(0))
    assert block.tokens.dtype == np.int64
    assert block.tokens.tolist() == [3, 4, 5, 1]
    q = block.q.to_dense()
    assert q.shape == (4, 50) and q.dtype == np.float64
    np.testing.assert_array_equal(q.sum(axis=1), 1.0)
    np.testing.assert_array_equal(q[np.arange(4), block.tokens], 1.0)
    empty = d.draft([9, 8, 7], 4, np.random.default_rng(0))
    assert empty.tokens.shape == (0,) and empty.q.to_dense().shape == (0, 50)
    d.close()


def test_one_hot_q_keeps_the_rule_exact() -> None:
    """Accept x with prob p(x), else draw from norm(max(0, p - delta_x)): the emitted
    token is distributed as p (computed exactly, no sampling)."""
    from specgen.rejection import residual

    p = np.array([0.5, 0.3, 0.2, 0.0])
    for x in range(3):
        q = np.eye(4)[x]
        emitted = min(p[x], 1.0) * np.eye(4)[x] + (1 - p[x]) * residual(p, q)
        np.testing.assert_allclose(emitted, p, atol=1e-15)


def python_lines(call: Callable[[], object], filename: str = ngram.__file__) -> int:
    """Python lines `call()` executes in `filename` (specgen/ngram.py by default): its
    interpreted work, which a lookup must keep independent of the context's length.
    numpy's C loops and list compares are not counted: they run at memory speed."""
    count = 0

    def tracer(frame, event, _arg):
        nonlocal count
        if frame.f_code.co_filename != filename:
            return None  # other files' frames are not traced line by line
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def far_match_context(size: int) -> list[int]:
    """Random tokens (no repeated 3-gram at this vocabulary size, seed 1) ending with a copy
    of ctx[100:103]: a 3-gram match far back, none of length 4."""
    ctx = np.random.default_rng(1).integers(0, 30000, size=size).tolist()
    return ctx + ctx[100:103]


def naive_lookup(context: list[int], k: int, n_max: int = 4) -> list[int]:
    """A planted slow `lookup`: the same answer by a Python scan of the whole context."""
    for n in range(n_max, 0, -1):
        for j in range(len(context) - 1 - n, -1, -1):
            if context[j : j + n] == context[-n:]:
                return [context[j + n + t] for t in range(k)]
    return []


def test_lookup_work_in_python_does_not_grow_with_the_context() -> None:
    """Machine-speed free: the count of interpreted lines, not a wall-clock bound. Both
    lookups answer a 4000-token context with as many Python lines as a 500-token one."""
    small, big = far_match_context(500), far_match_context(4000)
    assert lookup(big, 8) == big[103:111] and naive_lookup(big, 8) == big[103:111]
    assert python_lines(lambda: lookup(big, 8)) == python_lines(lambda: lookup(small, 8))
    # power: the same count sees a Python scan (the planted lookup) grow with the context
    here = naive_lookup.__code__.co_filename
    scan_small = python_lines(lambda: naive_lookup(small, 8), here)
    assert python_lines(lambda: naive_lookup(big, 8), here) > 7 * scan_small


def test_index_lookup_indexes_only_the_appended_token() -> None:
    """After the first lookup, each lookup on a context grown by one token costs the same
    interpreted work at 500 and at 4000 tokens: no re-index, no scan (counted, not timed)."""
    per_step = {}
    for size in (500, 4000):
        ctx = far_match_context(size)
        idx = NgramIndex()
        assert idx.lookup(ctx, 8) == ctx[103:111]
        lines = []
        for t in range(20):
            ctx.append(ctx[103 + t])  # the copy goes on: the same 4-gram match each time
            lines.append(python_lines(partial(idx.lookup, ctx, 8)))
            assert idx.lookup(ctx, 8) == lookup(ctx, 8)
        per_step[size] = lines
    assert per_step[4000] == per_step[500]
    # power: a lookup that re-indexes the whole context is seen as work that grows
    ctx = far_match_context(500)
    idx = NgramIndex()
    idx.lookup(ctx, 8)
    idx.reset()
    assert python_lines(lambda: idx.lookup(ctx, 8)) > 20 * max(per_step[500])


def test_the_ngram_drafter_is_the_same_under_any_sampling_settings() -> None:
    from specgen.sampling import SamplingParams

    d = NgramDrafter(n_vocab=50, n_max=3)
    # one-hot q rows do not depend on the warpers: bench and verify reuse the drafter
    assert d.with_params(SamplingParams(temp=0.3, top_k=5)) is d


def _predicted_by_scan(
    context: list[int], extra: list[int], pred: list[int], k: int, at: int, n_max: int, n_min: int
) -> tuple[int, int | None]:
    """(n, start): the prediction's longest match of the suffix of context + extra, read
    forward from `at` (the first start >= at, else the last before it), by a plain scan."""
    tail = (context + extra)[-n_max:] if n_max else []
    for n in range(min(n_max, len(tail)), n_min - 1, -1):
        starts = [j for j in range(len(pred) - n) if pred[j : j + n] == tail[len(tail) - n :]]
        if starts:
            after = [j for j in starts if j >= at]
            return n, after[0] if after else starts[-1]
    return 0, None


def test_a_prediction_is_matched_as_its_definition_says() -> None:
    """Random contexts, extensions and predictions: the index proposes the prediction's
    tokens after its longest match wherever that match is at least as long as the
    context's own (else the context's proposal, unchanged), reading it forward from the
    last match's start; a prediction set to () is gone."""
    rng = np.random.default_rng(7)
    for trial in range(400):
        n_vocab = int(rng.integers(2, 6))
        n_max = int(rng.integers(1, 5))
        n_min = int(rng.integers(1, n_max + 1))
        idx, plain = NgramIndex(n_max, n_min), NgramIndex(n_max, n_min)
        pred = rng.integers(0, n_vocab, size=int(rng.integers(0, 30))).tolist()
        idx.predict(pred)
        ctx = rng.integers(0, n_vocab, size=int(rng.integers(2, 30))).tolist()
        at = 0
        for _ in range(3):  # the start read forward carries over between lookups
            extra = rng.integers(0, n_vocab, size=int(rng.integers(0, 4))).tolist()
            k = int(rng.integers(1, 7))
            want_plain = plain.match_after(ctx, extra, k) if extra else plain.match(ctx, k, False)
            n, j = _predicted_by_scan(ctx, extra, pred, k, at, n_max, n_min)
            got = idx.match_after(ctx, extra, k) if extra else idx.match(ctx, k, wrap=False)
            if j is not None and n >= want_plain[0]:
                assert got == (n, pred[j + n : j + n + k]), (trial, ctx, extra, pred)
                at = j
            else:
                assert got == want_plain, (trial, ctx, extra, pred)
            ctx = ctx + rng.integers(0, n_vocab, size=int(rng.integers(1, 4))).tolist()
        idx.predict(())
        assert idx.match(ctx, 3) == plain.match(ctx, 3)


def test_a_prediction_is_read_forward_and_kept_across_a_reset() -> None:
    idx = NgramIndex(n_max=2)
    # "1 2" occurs twice in the prediction: the copy reads it from where it is
    idx.predict([1, 2, 3, 4, 1, 2, 5, 6])
    assert idx.match([9, 1, 2], 3) == (2, [3, 4, 1])
    assert idx.match([9, 1, 2, 3, 4], 3) == (2, [1, 2, 5])  # "3 4" at 2
    assert idx.match([9, 1, 2, 3, 4, 1, 2], 3) == (2, [5, 6])  # the second "1 2", at 4
    # a longer match in the context itself wins over the prediction's; as long, it loses
    idx = NgramIndex(n_max=3)
    idx.predict([7, 8, 1])
    assert idx.match([5, 7, 8, 0, 5, 7, 8], 2) == (3, [0, 5])
    assert idx.match([4, 7, 8, 0, 5, 7, 8], 2) == (2, [1])
    assert idx.match([6, 7, 8], 2) == (2, [1])  # the prediction's end: what is left of it
    idx.reset()  # a new context of the same generation: the prediction stays
    assert idx.match([3, 7, 8], 2) == (2, [1])


def test_the_ngram_drafter_proposes_a_prediction_with_one_hot_rows() -> None:
    d = NgramDrafter(n_vocab=20)
    d.prefill([1, 2])
    d.index.predict([2, 7, 8, 9])
    block = d.draft([1, 2], 3, np.random.default_rng(0))
    assert block.tokens.tolist() == [7, 8, 9] and block.sources == ("prediction",) * 3
    plain = d.draft([1, 2, 1], 2, np.random.default_rng(0))  # "1" earlier in the context
    assert plain.tokens.tolist() == [2, 1] and plain.sources == ("lookup",) * 2
    np.testing.assert_array_equal(block.q.to_dense()[np.arange(3), block.tokens], 1.0)
