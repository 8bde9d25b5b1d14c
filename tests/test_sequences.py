"""Several sequences in one llama.cpp context (the server's slots), on real models.

The tiny models check the batched decode row by row against single-sequence decoding,
and that one sequence's rollback leaves the others' cells alone; the SmolLM2 pair checks
the scheduler end to end: four greedy requests served together each equal the same
request served alone by `generate` (or diverge only at a near-tie, as in
test_run_models).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from support.greedy import GREEDY, assert_same_or_near_tie

from specgen.drafters import ModelDrafter
from specgen.engine import SeqDecode
from specgen.errors import EngineError
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.llamacpp import EngineConfig, LlamaEngine
from specgen.sched.jobs import Job
from specgen.sched.scheduler import Scheduler

# the tiny model in F32: batched and single passes agree to float rounding
TOL = 1e-3


def rows_alone(engine: LlamaEngine, context: list[int], tokens: list[int]) -> np.ndarray:
    engine.truncate(0)
    if context:
        engine.decode(context)
    out = np.array(engine.decode(tokens, all_logits=True))
    engine.truncate(0)
    return out


@pytest.fixture(scope="module")
def tiny_engines(tiny_target):
    with (
        LlamaEngine(tiny_target, EngineConfig(n_ctx=1024, n_threads=1, n_seq_max=4)) as multi,
        LlamaEngine(tiny_target, EngineConfig(n_ctx=256, n_threads=1)) as single,
    ):
        yield multi, single


def test_batched_decode_equals_each_sequence_alone_and_rollback_is_per_sequence(tiny_engines):
    multi, single = tiny_engines
    assert multi.n_seq == 4 and multi.n_ctx == 256 and multi.sequence(2).n_ctx == 256
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 270, size=n).tolist() for n in (5, 17, 9, 30)]
    for s in range(4):
        multi.sequence(s).truncate(0)
    out = multi.decode_batch([SeqDecode(i, p, len(p)) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        assert multi.sequence(i).tokens == p
        assert np.abs(out[i] - rows_alone(single, [], p)).max() < TOL
    # sequence 1 decodes 6 tokens and drops 5 of them; the others are untouched
    extra = rng.integers(3, 270, size=6).tolist()
    multi.sequence(1).decode(extra, all_logits=True)
    multi.sequence(1).truncate(len(prompts[1]) + 1)
    assert [len(multi.sequence(i).tokens) for i in range(4)] == [5, 18, 9, 30]
    # next: rows only where asked (2 for sequence 1, none for 3, the last for 0)
    nxt = multi.decode_batch(
        [SeqDecode(1, [7, 8, 9], 2), SeqDecode(3, [10], 0), SeqDecode(0, [11, 12], 1)]
    )
    assert [r.shape[0] for r in nxt] == [2, 0, 1]
    ref1 = rows_alone(single, prompts[1] + extra[:1], [7, 8, 9])[-2:]
    ref0 = rows_alone(single, prompts[0], [11, 12])[-1:]
    assert np.abs(nxt[0] - ref1).max() < TOL and np.abs(nxt[2] - ref0).max() < TOL
    # the rows are copies: a later decode does not change them
    kept = nxt[0].copy()
    multi.sequence(2).decode([13])
    np.testing.assert_array_equal(nxt[0], kept)
    ref3 = rows_alone(single, prompts[3] + [10], [14])
    assert np.abs(np.array(multi.sequence(3).decode([14])) - ref3).max() < TOL
    # copy=False: the same rows, as views of the buffer that the next decode overwrites
    multi.sequence(0).truncate(5)
    view = multi.decode_batch([SeqDecode(0, [11, 12], 1)], copy=False)[0]
    assert np.abs(view - ref0).max() < TOL and not view.flags.owndata
    before = view.copy()
    multi.sequence(2).decode([15])
    assert not np.array_equal(view, before)


def test_rows_are_computed_only_for_the_tokens_asked(tiny_engines):
    # a block whose grammar-forced positions need no row: rows 0 and 2 of 4 (of one
    # sequence, and of one sequence among others in a batch), then none at all
    multi, single = tiny_engines
    ref = rows_alone(single, [5, 6, 7], [8, 9, 10, 11])
    single.decode([5, 6, 7])
    got = single.decode([8, 9, 10, 11], rows=[0, 2])
    assert got.shape[0] == 2 and np.abs(got - ref[[0, 2]]).max() < TOL
    assert single.decode([12], rows=[]).shape == (0, single.n_vocab)
    assert single.tokens == [5, 6, 7, 8, 9, 10, 11, 12]
    for s in range(4):
        multi.sequence(s).truncate(0)
    multi.decode_batch([SeqDecode(0, [5, 6, 7], 0), SeqDecode(1, [3], 0)])
    out = multi.decode_batch([SeqDecode(0, [8, 9, 10, 11], 2, (0, 2)), SeqDecode(1, [4, 4], 2)])
    assert np.abs(out[0] - ref[[0, 2]]).max() < TOL
    assert np.abs(out[1] - rows_alone(single, [3], [4, 4])).max() < TOL
    with pytest.raises(EngineError, match="bad batch part"):
        multi.decode_batch([SeqDecode(2, [1, 2], 2, (1, 0))])
    single.truncate(0)


def test_a_bad_batch_is_refused_and_keeps_every_sequence(tiny_engines):
    multi, _ = tiny_engines
    for s in range(4):
        multi.sequence(s).truncate(0)
    multi.decode_batch([SeqDecode(0, [5, 6], 0)])
    with pytest.raises(EngineError, match="distinct"):
        multi.decode_batch([SeqDecode(0, [1], 1), SeqDecode(0, [2], 1)])
    with pytest.raises(EngineError, match="one batch"):
        multi.decode_batch([SeqDecode(i, [1] * 200, 0) for i in (1, 2, 3)])
    with pytest.raises(EngineError, match="context"):
        multi.decode_batch([SeqDecode(3, [1] * 257, 0)])
    assert multi.sequence(0).tokens == [5, 6] and not multi.sequence(1).tokens


def test_a_saved_sequence_is_restored_bit_for_bit_into_another(tiny_engines):
    # the server's prompt cache: cells copied out of sequence 1, the cache used by other
    # sequences meanwhile, then written into sequence 3: its next row is the row the
    # original cells gave, to the bit; rolled back to a prefix it goes on as a fresh one
    multi, single = tiny_engines
    for s in range(4):
        multi.sequence(s).truncate(0)
    rng = np.random.default_rng(1)
    context = rng.integers(3, 270, size=40).tolist()
    one, three = multi.sequence(1), multi.sequence(3)
    one.decode(context)
    state = one.save_state()
    assert state.tokens == tuple(context) and state.nbytes > 0
    ref = np.array(one.decode([9])).copy()
    one.truncate(0)
    multi.decode_batch([SeqDecode(0, [5] * 30, 0), SeqDecode(2, [6] * 50, 0)])
    three.restore_state(state)
    assert three.tokens == context
    np.testing.assert_array_equal(np.array(three.decode([9])), ref)
    three.truncate(25)
    got = np.array(three.decode(context[25:] + [9]))
    assert np.abs(got - rows_alone(single, context, [9])).max() < TOL
    assert multi.sequence(2).tokens == [6] * 50  # the others' cells are untouched


PROMPTS = [
    b"The three most important ideas in computer science are",
    b"def fibonacci(n):\n    ",
    b"Once upon a time, in a small village by the sea,",
    b"List of prime numbers: 2, 3, 5, 7,",
]


def test_four_greedy_requests_together_each_equal_the_request_alone(smol_pair):
    target_path, draft_path = smol_pair
    n = 24
    config = GenerateConfig(max_tokens=n, params=GREEDY, ignore_eos=True)
    cfg1 = EngineConfig(n_ctx=256)
    with LlamaEngine(target_path, cfg1) as target, LlamaEngine(draft_path, cfg1) as draft:
        prompts = [target.tokenize(p) for p in PROMPTS]
        drafter = ModelDrafter(draft, GREEDY, target.n_vocab)
        alone = [list(generate(target, drafter, p, config, FixedK(4)))[-1] for p in prompts]
    cfg4 = EngineConfig(n_ctx=4 * 256, n_seq_max=4)
    with LlamaEngine(target_path, cfg4) as target, LlamaEngine(draft_path, cfg4) as draft:
        sched = Scheduler(
            target,
            ModelDrafter(draft, GREEDY, target.n_vocab),
            n_parallel=4,
            queue_max=8,
            draft_max=4,
        )
        sinks: list[list] = [[] for _ in prompts]
        for i, p in enumerate(prompts):
            sched.submit(Job(f"r{i}", p, config), sinks[i].append)
        reports = [sched.step() for _ in range(3)]
        sched.run_until_idle()
        assert max(r.n_slots for r in reports) == 4  # all four shared the target decodes
        together = [s[-1] for s in sinks]
        rejected = sum(e.n_drafted - e.n_accepted for s in sinks for e in s[:-1])
        assert rejected > 0  # some sequence rolled back while the others went on
    with LlamaEngine(target_path, cfg1) as single:
        for p, a, b in zip(prompts, alone, together, strict=True):
            assert b.finish_reason == "length"
            assert_same_or_near_tie(single, p, a.tokens, b.tokens)


def test_a_request_whose_prompt_left_its_slot_is_restored_and_unchanged(smol_pair):
    # one slot, prompts A, B, A again: A's cells (target and draft) are saved when B takes
    # the slot and restored for the second A, which evaluates nothing of its prompt and
    # gives the first A's greedy output
    from specgen.sched.promptcache import PromptCache

    target_path, draft_path = smol_pair
    config = GenerateConfig(max_tokens=16, params=GREEDY, ignore_eos=True)
    cfg = EngineConfig(n_ctx=512, n_seq_max=1)
    with LlamaEngine(target_path, cfg) as target, LlamaEngine(draft_path, cfg) as draft:
        sched = Scheduler(
            target,
            ModelDrafter(draft, GREEDY, target.n_vocab),
            n_parallel=1,
            queue_max=4,
            draft_max=4,
            prompt_cache=PromptCache(None),
        )
        a, b = (target.tokenize(p) for p in PROMPTS[:2])
        outs = []
        for p in (a, b, a):
            sink: list = []
            sched.submit(Job("r", p, config), sink.append)
            sched.run_until_idle()
            outs.append(sink[-1])
        assert sched.prompt_cache is not None and sched.prompt_cache.hits == 1
        assert outs[0].stats.n_prefill == len(a) - 1 and outs[2].stats.n_prefill == 0
    with LlamaEngine(target_path, EngineConfig(n_ctx=256)) as single:
        assert_same_or_near_tie(single, a, outs[0].tokens, outs[2].tokens)


@pytest.mark.parametrize(
    "swa_full",
    [
        True,
        # A measurement, not a check: a non-strict xfail passes whichever way it goes, so
        # it runs only when asked (SPECGEN_MEASURE_RING=1), saving make test 35 s.
        pytest.param(
            False,
            marks=[
                pytest.mark.skipif(
                    not os.environ.get("SPECGEN_MEASURE_RING"),
                    reason="a measurement (set SPECGEN_MEASURE_RING=1 to run it)",
                ),
                pytest.mark.xfail(
                    reason="measured 2026-12-01: the window-sized unified ring left sequence"
                    " 1's next logits 0.20 from a fresh evaluation (sequence 0: 0.08), above the"
                    " 0.15 that separates numerics from lost cells: serve uses --swa-full with"
                    " N > 1",
                    strict=False,
                ),
            ],
        ),
    ],
)
def test_per_sequence_rollback_past_the_unified_window_ring_stays_exact(demo_pair, swa_full):
    """Gemma 3's window-sized sliding-window cache shared by two sequences: a ring of
    n_swa x 2 + n_batch = 1536 cells. Both sequences grow past 1000 positions (2000 in
    all, so the ring wraps and cells of both are reused) while each does the loop's
    rollbacks in batched decodes; then each one's next logits equal a fresh
    single-sequence evaluation (TOL as tests/test_swa.py), and no rollback needed the
    re-evaluation fallback. With --swa-full (every position kept) the same must hold; no
    ring to wrap there, so on sequences of 700 and 600 positions (past the 512-position
    window) and 6 rounds: 26 s -> 16 s on one core (2026-12-03)."""
    import llama_cpp

    swa_tol = 0.15  # batched vs single on the F32 target: 0.03-0.06; a lost cell: 0.4+
    counting = ", ".join(str(i) for i in range(1, 500)).encode()
    cfg = EngineConfig(n_ctx=2 * 2048, n_seq_max=2, swa_full=swa_full)
    with LlamaEngine(demo_pair[0], cfg) as multi:
        assert multi.n_swa > 0
        ids = multi.tokenize(counting)
        end = 700 if swa_full else 1000
        starts = [ids[:end], ids[100:end]]
        for s, p in enumerate(starts):
            multi.sequence(s).decode(p)
        rng = np.random.default_rng(0)
        k = 8
        # The passes ask for no logits rows: rows never touch the cache, and the demo
        # target's 262,144-wide output layer was 60% of this loop's time.
        # the prompts (1900 positions) already wrap the 1536-cell ring
        for _ in range(6 if swa_full else 15):
            parts = []
            base = [len(multi.sequence(s).tokens) for s in range(2)]
            for s in range(2):
                parts.append(SeqDecode(s, rng.integers(1000, 20000, size=k + 1).tolist(), 0))
            multi.decode_batch(parts)
            for s in range(2):  # x_1 rejected: keep `last`
                multi.sequence(s).truncate(base[s] + 1)
            for s in range(2):  # the draft's K-1 single passes, then dropped
                for t in parts[s].tokens[1:k]:
                    multi.decode_batch([SeqDecode(s, [t], 0)])
                multi.sequence(s).truncate(base[s] + 1)
        assert multi.n_reprocessed == 0
        mem = llama_cpp.llama_get_memory(multi._ctx)
        pos_min = [llama_cpp.llama_memory_seq_pos_min(mem, s) for s in range(2)]
        # window-sized: the ring wrapped (cells were reused); full: nothing was evicted
        assert (max(pos_min) > 0) != swa_full, pos_min
        contexts = [list(multi.sequence(s).tokens) for s in range(2)]
        cached = [np.array(multi.sequence(s).decode([5])[-1]) for s in range(2)]
    with LlamaEngine(demo_pair[0], EngineConfig(n_ctx=2048)) as single:
        gaps = []
        for s in range(2):
            fresh = rows_alone(single, contexts[s], [5])[-1]
            # softmax ignores a shift shared by every logit (batched passes show ~0.09)
            d = (cached[s] - cached[s].mean()) - (fresh - fresh.mean())
            gaps.append(float(np.abs(d).max()))
        assert max(gaps) < swa_tol, gaps


@pytest.mark.parametrize("flash_attn", ["off", "on"])
def test_flash_attention_reaches_llama_cpp(smol_pair, flash_attn: str) -> None:
    """-fa off: a context's logits do not depend on how it is split into decodes (what
    a scored prompt needs); on (llama.cpp's auto on this CPU), small decodes compute in
    lower precision and they do (docs/measurements/2026-12-06-lm-eval.md)."""
    with LlamaEngine(smol_pair[0], EngineConfig(n_ctx=1024, flash_attn=flash_attn)) as e:
        ids = e.tokenize(("the quick brown fox jumps over the lazy dog " * 40).encode())[:300]
        whole = np.array(e.decode(ids, all_logits=True))
        e.truncate(0)
        parts = [np.array(e.decode(ids[i : i + 32], all_logits=True)) for i in range(0, 300, 32)]
    apart = float(np.abs(whole - np.concatenate(parts)).max())
    assert apart == 0.0 if flash_attn == "off" else apart > 1e-4, apart
