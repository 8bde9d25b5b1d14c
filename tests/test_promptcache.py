"""The server's prompt cache (`specgen.sched.promptcache`), with fake sequences: which
entries it keeps and drops, and which it gives back. The scheduler's use of it is in
test_scheduler.py; a real cache's bit-exact restore in test_sequences.py."""

from __future__ import annotations

from fakes import FakeBatchEngine

from specgen.sched.promptcache import PromptCache


def view(tokens: list[int]) -> object:
    seq = FakeBatchEngine(n_seq=1).sequence(0)
    seq.tokens = list(tokens)
    return seq


A = list(range(1, 41))  # 40 tokens: over min_tokens
B = [7] * 30


def test_save_keeps_one_entry_per_prefix_chain_and_best_finds_the_longest_prefix() -> None:
    cache = PromptCache(None)
    assert cache.save(view(A[:20]), None)
    assert cache.save(view(A), None)  # A[:20] is a prefix of A: replaced
    assert len(cache) == 1 and cache.nbytes == 8 * 40
    assert not cache.save(view(A[:30]), None)  # already held by A's entry
    assert not cache.save(view(A[:10]), None)  # too short (min_tokens 16)
    assert cache.save(view(B), view(B[:5]))
    assert len(cache) == 2 and cache.nbytes == 8 * (40 + 30 + 5)
    entry, n = cache.best([*A[:25], 99, 98])
    assert entry is not None and entry.target.tokens == tuple(A) and n == 25
    entry, n = cache.best([7, 7, 7, 1])
    assert entry is not None and entry.target.tokens == tuple(B) and n == 3
    assert cache.best([99]) == (None, 0)


def test_the_least_recently_used_entries_go_first_past_the_limit() -> None:
    cache = PromptCache(limit_bytes=8 * 70)
    cache.save(view(A), None)
    cache.save(view(B), None)
    assert len(cache) == 2
    entry, _ = cache.best(A)
    target = view([])
    cache.restore(entry, target, None)  # A is now the most recent
    assert target.tokens == A and cache.hits == 1
    cache.save(view([3] * 20), None)  # 8 * 90 bytes: B (least recent) goes
    assert cache.best(B) == (None, 0) and cache.best(A)[1] == 40
    assert not PromptCache(limit_bytes=8 * 10).save(view(A), None)  # larger than the limit


def test_a_restore_with_no_room_leaves_the_sequence_empty_and_raises() -> None:
    from specgen.errors import EngineError

    cache = PromptCache(None)
    cache.save(view(A), None)
    engine = FakeBatchEngine(n_seq=1)
    engine.no_room = True
    target = engine.sequence(0)
    target.tokens = [1, 2]
    entry, _ = cache.best(A)
    try:
        cache.restore(entry, target, None)
    except EngineError:
        pass
    else:
        raise AssertionError("no EngineError")
    assert target.tokens == [] and cache.hits == 0
