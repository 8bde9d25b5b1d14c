"""Speculation that never loses, measured: ordinary decoding against `--draft-max auto` (and
a fixed K on the good pair) on three pairs made from the demo files, generations
interleaved in one process.

    python scripts/never_loses.py [--pairs weak,swapped,good] [--reps 3] [--temp 0]
        [--lock /tmp/specgen-cpu.lock]

Pairs (target / draft): `good` F32 / Q4_K_M (the demo pair), `swapped` Q4_K_M / F32 (a
draft slower than its target), `weak` F32 / Q4_K_M cut to its first 6 layers (acceptance
about 1%). Each block runs one prompt in every mode, in a rotating order; the figure per
mode is the median over blocks of its tokens/s divided by ordinary decoding's in the same
block (the range in brackets). To compare two commits, run each one's copy of this script
(PYTHONPATH=its worktree) in turn. `--lock` takes that file lock around each block, so
other jobs that use it can run between blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import statistics
from collections.abc import Iterator
from pathlib import Path

from specgen.drafters import ModelDrafter
from specgen.generate import AutoK, FixedK, GenerateConfig, KPolicy, generate
from specgen.llamacpp import EngineConfig, LlamaEngine
from specgen.models.demo import ensure_demo_pair, ensure_weak_draft
from specgen.sampling import SamplingParams

PROMPTS = [
    b"Once upon a time, in a small village by the sea, there lived an old fisherman who",
    b"The three most important ideas in computer science are",
    b"def quicksort(xs):\n    ",
]
N_TOKENS = {"weak": 128, "swapped": 96, "good": 96}


@contextlib.contextmanager
def locked(path: str | None) -> Iterator[None]:
    if path is None:
        yield
        return
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="weak,swapped,good")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--lock")
    a = ap.parse_args()
    f32, q4 = ensure_demo_pair()
    files = {"good": (f32, q4), "swapped": (q4, f32), "weak": (f32, ensure_weak_draft(6))}
    engines: dict[Path, LlamaEngine] = {}

    def engine(path: Path) -> LlamaEngine:
        if path not in engines:
            engines[path] = LlamaEngine(path, EngineConfig(n_ctx=1024))
        return engines[path]

    params = SamplingParams(temp=a.temp)
    pairs = a.pairs.split(",")
    modes = ["ordinary", "auto", "K8"]

    def policy(mode: str) -> KPolicy:
        return AutoK(16) if mode == "auto" else FixedK(8)

    # a fixed K only where it can win: on the good pair (elsewhere it is slow to measure)
    modes_of = {p: [m for m in modes if m != "K8" or p == "good"] for p in pairs}
    ratios = {p: {m: list[float]() for m in modes_of[p][1:]} for p in pairs}
    with locked(a.lock):  # a discarded warm-up: the first passes of a model are slow
        for pair in pairs:
            target, draft = (engine(p) for p in files[pair])
            ids = target.tokenize(PROMPTS[0])
            for d in (None, ModelDrafter(draft, params, target.n_vocab)):
                config = GenerateConfig(max_tokens=8, params=params, measure_ordinary=1)
                list(generate(target, d, ids, config, AutoK(16)))
    for rep in range(a.reps):
        for pair in pairs:
            target, draft = (engine(p) for p in files[pair])
            for i, text in enumerate(PROMPTS):
                ids = target.tokenize(text)
                ms = modes_of[pair]
                order = ms[rep % len(ms) :] + ms[: rep % len(ms)]
                tps: dict[str, float] = {}
                with locked(a.lock):
                    for mode in order:
                        ordinary = mode == "ordinary"
                        config = GenerateConfig(
                            max_tokens=N_TOKENS[pair], params=params, ignore_eos=True,
                            seed=1000 * rep + i, measure_ordinary=0 if ordinary else 3,
                        )  # fmt: skip
                        drafter = None if ordinary else ModelDrafter(draft, params, target.n_vocab)
                        pol = FixedK(0) if ordinary else policy(mode)
                        stats = list(generate(target, drafter, ids, config, pol))[-1].stats
                        tps[mode] = stats.n_generated / stats.decode_s
                for m in ms[1:]:
                    ratios[pair][m].append(tps[m] / tps["ordinary"])
                shown = ", ".join(f"{m} {v:.1f}" for m, v in tps.items())
                print(f"{pair} rep {rep} prompt {i}: tokens/s {shown}", flush=True)
    print(f"medians of the ratio to ordinary decoding, temp {a.temp:g}:")
    for pair in pairs:
        cells = []
        for m, r in ratios[pair].items():
            cells.append(f"{m} {statistics.median(r):.3f}x [{min(r):.2f}, {max(r):.2f}]")
        print(f"  {pair} ({len(r)} blocks): " + "; ".join(cells))
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()
