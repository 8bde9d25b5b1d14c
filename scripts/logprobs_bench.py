"""The cost of log-probabilities (top_logprobs 5) under speculation, on the demo pair,
interleaved, medians.

Two modes per (repetition, prompt), in alternating order so that drift of a shared
machine hits both alike: speculative decoding (the draft model, K fixed) without and with
``logprobs=5`` (each emitted token's value and its 5 most likely alternatives, from the
target rows the round already decoded), at temperature 0.8 with the run defaults for
top-k/top-p/min-p. Reported: the median tokens/s of each mode and their ratio (issue 35's
goal: with / without >= 0.95), and the host cost per emitted token (`token_logprobs` on
one 262,144-wide row) timed apart.

Usage (hold the model lock: two llama.cpp processes slow each other down):
    flock /tmp/specgen-model.lock .venv/bin/python scripts/logprobs_bench.py \
        [--reps 3] [-n 128] [-k 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from bench_common import emit, medians, progress, provenance

from specgen.bench.prompts import builtin_prompts
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.logprobs import token_logprobs
from specgen.models.demo import ensure_demo_pair
from specgen.sampling import SamplingParams
from specgen.session import ModelSpec, load

PROMPT_IDS = ("story", "extractive-quote", "code-python")
TOP = 5


def one(target, drafter, text: str, cfg: GenerateConfig, k: int) -> dict:
    prompt = target.tokenize(text.encode("utf-8"))
    done = list(generate(target, drafter, prompt, cfg, FixedK(k)))[-1]
    s = done.stats
    return {"tokens_per_s": s.tokens_per_s, "acceptance_rate": s.acceptance_rate}


def host_cost(n_vocab: int, repeats: int = 200) -> float:
    """Median ms of one emitted token's log-probability with TOP alternatives."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((1, n_vocab)).astype(np.float32) * 3
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        token_logprobs(rows, [i], TOP, lambda t: b"x")
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    params = SamplingParams(temp=0.8)  # run's defaults: top-k 40, top-p 0.95, min-p 0.05
    texts = {p.id: p.text for p in builtin_prompts() if p.id in PROMPT_IDS}
    target_path, draft_path = ensure_demo_pair()
    loaded = load(ModelSpec.from_flags(target_path, draft_path, 2048, 0, 0, 0), params)
    try:
        target, drafter = loaded.target, loaded.drafter
        base = GenerateConfig(max_tokens=a.n, params=params, ignore_eos=True)
        modes = {"plain": None, "logprobs5": TOP}
        one(target, drafter, texts["story"], replace(base, max_tokens=16, seed=0), a.k)
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        names, turn = list(modes), 0
        for rep in range(a.reps):
            for pid, text in texts.items():
                order = names if turn % 2 == 0 else names[::-1]
                turn += 1
                for m in order:
                    cfg = replace(base, seed=1000 * rep + 7, logprobs=modes[m])
                    r = one(target, drafter, text, cfg, a.k)
                    runs[m].append(r)
                    progress(rep, pid, m, r)
        n_vocab = target.n_vocab
    finally:
        loaded.close()
    med = medians(runs, "tokens_per_s")
    acc = medians(runs, "acceptance_rate")
    out = {
        **provenance(),
        "n": a.n,
        "k": a.k,
        "reps": a.reps,
        "median_tokens_per_s": med,
        "median_acceptance": acc,
        "ratio_with_over_without": med["logprobs5"] / med["plain"],
        "host_ms_per_token": host_cost(n_vocab),
    }
    emit(out, a.json, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
