"""Rollback with llama.cpp's window-sized sliding-window cache (the default, swa_full off).

Gemma 3 attends over the last n_swa = 512 positions in most layers; llama.cpp then keeps
n_swa + n_batch = 1024 cells for those layers and reuses the cells of positions that have
left the window. These tests run the demo target past that ring's wrap (about 1000 prompt
positions, n_ctx 2048 so the cache really is window-sized) and check that the loop's
rollbacks keep every cell the next position attends to, that a rollback reaching evicted
cells re-evaluates the context, and that without that re-evaluation the logits would be wrong.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from specgen.drafters import ModelDrafter
from specgen.engine import SeqDecode
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.llamacpp import EngineConfig, LlamaEngine
from specgen.sampling import SamplingParams

# past the window (512) and near the 1024-cell ring, which the rounds below then cross
N_PROMPT = 1000
CTX = EngineConfig(n_ctx=2048)
# Batched and single-token passes (and different cell orders) differ by 0.03-0.06 logits on
# the F32 target; missing window cells move them by 0.4 (a few far ones) to 9 (position 0).
TOL = 0.15
NEAR_TIE_LOGITS = 1e-2
COUNTING = ", ".join(str(i) for i in range(1, 500)).encode()


@pytest.fixture(scope="module")
def target(demo_pair):
    with LlamaEngine(demo_pair[0], CTX) as engine:
        assert engine.n_swa > 0  # the demo target has sliding-window layers
        yield engine


def next_row(engine: LlamaEngine, token: int) -> np.ndarray:
    """Logits after appending `token`, then rolled back."""
    n = len(engine.tokens)
    row = np.array(engine.decode([token])[-1], dtype=np.float64)
    engine.truncate(n)
    return row


def fresh_row(engine: LlamaEngine, context: list[int], token: int) -> np.ndarray:
    """`next_row` after evaluating `context` from an empty cache."""
    engine.truncate(0)
    engine.decode(context)
    return next_row(engine, token)


def test_the_loops_rollbacks_past_the_window_keep_it(target):
    # 1016 positions: from the first round on, each round's block reaches past the ring's
    # 1024 cells, so 12 rounds cross its wrap (from 1000 positions, 30 rounds did: 16 of
    # them before the wrap, at 8 single-token passes of the F32 target each)
    ids = target.tokenize(COUNTING)[:1016]
    target.truncate(0)
    target.decode(ids)
    before = target.n_reprocessed
    rng = np.random.default_rng(0)
    k = 8
    # The passes ask for no logits rows (as tests/test_sequences.py's ring test): rows never
    # touch the cache, and the demo target's 262,144-wide output layer was most of this
    # loop's time (9 rows for the block, one per draft pass).
    for _ in range(12):  # crosses the 1024-cell ring's wrap with rejections every round
        x = rng.integers(1000, 20000, size=k + 1).tolist()
        p = len(target.tokens)
        target.decode_batch([SeqDecode(0, x, 0)])  # the target scores [last, x_1..x_K]
        target.truncate(p + 1)  # x_1 rejected: keep `last`
        for t in x[1:k]:  # the draft's K-1 single-token passes, all rejected
            target.decode_batch([SeqDecode(0, [t], 0)])
        target.truncate(p + 1)
    assert target.n_reprocessed == before, "a rollback of the loop lost window cells"
    context = list(target.tokens)
    assert len(context) > 1024
    cached = next_row(target, 5)
    assert np.abs(cached - fresh_row(target, context, 5)).max() < TOL


def test_a_rollback_into_evicted_cells_reevaluates(target, monkeypatch):
    ids = target.tokenize(COUNTING)[: N_PROMPT + 100]
    keep = 300  # the ring holds about the last 1000 positions: position 0 is gone
    target.truncate(0)
    target.decode(ids)
    before = target.n_reprocessed
    target.truncate(keep)
    assert target.n_reprocessed == before + 1
    assert target.tokens == ids[:keep]
    reevaluated = next_row(target, 5)
    reference = fresh_row(target, ids[:keep], 5)
    assert np.abs(reevaluated - reference).max() < TOL
    # power of the check: the same rollback without re-evaluation gives other logits
    target.decode(ids[keep:])
    monkeypatch.setattr(target, "_window_intact", lambda seq=0: True)
    target.truncate(keep)
    assert np.abs(next_row(target, 5) - reference).max() > 3 * TOL
    monkeypatch.undo()
    target.truncate(0)


def test_greedy_speculation_past_the_window_is_the_targets_argmax(target, demo_pair):
    """Each token of a greedy speculative run that crosses the ring's wrap is the target's
    argmax after the tokens before it (teacher-forced, one batched pass), or a near-tie."""
    greedy = SamplingParams(temp=0.0)
    prompt = target.tokenize(COUNTING)[:N_PROMPT]
    with LlamaEngine(demo_pair[1], CTX) as draft:
        drafter = ModelDrafter(draft, greedy, target.n_vocab)
        before = (target.n_reprocessed, draft.n_reprocessed)
        # 40 tokens: from 1000 prompt positions to 1040, 16 past the ring's 1024 cells
        # (was 64)
        config = GenerateConfig(max_tokens=40, params=greedy, ignore_eos=True)
        done = list(generate(target, drafter, prompt, config, FixedK(8)))[-1]
        assert (target.n_reprocessed, draft.n_reprocessed) == before
    out = list(done.tokens)
    assert len(prompt) + len(out) > 1024 and done.stats.n_drafted > 0
    target.truncate(0)
    target.decode(prompt[:-1])
    rows = np.array(target.decode([prompt[-1], *out[:-1]], all_logits=True), dtype=np.float64)
    target.truncate(0)
    for i, (row, tok) in enumerate(zip(rows, out, strict=True)):
        if int(np.argmax(row)) != tok:
            top2 = np.sort(row)[-2:]
            assert top2[1] - top2[0] < NEAR_TIE_LOGITS, f"token {i} is not the argmax"


@pytest.mark.parametrize(("flags", "cells"), [((), 1024), (("--swa-full",), 2048)])
def test_run_sizes_the_sliding_window_cache_as_asked(demo_pair, flags, cells):
    """`specgen run` passes --swa-full to llama.cpp, whose log gives the cache's size."""
    args = ["run", "-m", str(demo_pair[0]), "--draft", "none", "-c", "2048", "-n", "2"]
    r = subprocess.run(
        [sys.executable, "-m", "specgen", *args, "--verbose", *flags, "Hello"],
        capture_output=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr.decode()
    assert f"SWA KV cache, size = {cells} cells" in r.stderr.decode()


def test_chat_passes_swa_full_to_llama_cpp_too(demo_pair):
    """`specgen chat --swa-full`: the cache is sized before the base model is refused."""
    args = ["chat", "-m", str(demo_pair[0]), "--draft", "none", "-c", "2048", "--verbose"]
    r = subprocess.run(
        [sys.executable, "-m", "specgen", *args, "--swa-full"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    err = r.stderr.decode()
    assert r.returncode != 0 and "no chat template" in err
    assert "SWA KV cache, size = 2048 cells" in err
