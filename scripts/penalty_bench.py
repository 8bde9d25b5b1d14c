"""The cost of a repeat penalty under speculation, on the demo pair, interleaved, medians.

Four modes per (repetition, prompt), in rotating order so that drift of a shared machine
hits all alike: speculative (the draft model, K fixed) and ordinary decoding, each with
and without `--repeat-penalty 1.1` (Ollama's default; `--repeat-last-n 64`), at
temperature 0.8 with the run defaults for top-k/top-p/min-p. Reported: the median
tokens/s of each mode, the two ratios issue 35 sets goals for (speculative with / without
the penalty, >= 0.95; speedup over ordinary with / without it, >= 0.9), the acceptance
rates, and the host cost of processing rows (`BiasPenalties.rows` on K + 1 target rows,
`.row` on one draft row, 262,144 wide) timed apart.

Usage (hold the model lock: two llama.cpp processes slow each other down):
    flock /tmp/specgen-model.lock .venv/bin/python scripts/penalty_bench.py \
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
from specgen.constraints import Constraints, processor_for
from specgen.drafters import ModelDrafter
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.models.demo import ensure_demo_pair
from specgen.sampling import SamplingParams
from specgen.session import ModelSpec, load

PENALTY = Constraints(repeat_penalty=1.1, repeat_last_n=64)
PROMPT_IDS = ("story", "extractive-quote", "code-python")


def one(target, drafter, text: str, params: SamplingParams, k: int, n: int, seed: int) -> dict:
    prompt = target.tokenize(text.encode("utf-8"))
    cfg = GenerateConfig(max_tokens=n, params=params, ignore_eos=True, seed=seed)
    done = list(generate(target, drafter, prompt, cfg, FixedK(k)))[-1]
    s = done.stats
    return {"tokens_per_s": s.tokens_per_s, "acceptance_rate": s.acceptance_rate}


def host_cost(n_vocab: int, k: int, repeats: int = 50) -> dict[str, float]:
    """Median ms of processing K + 1 target rows and one draft row under PENALTY."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((k + 1, n_vocab)).astype(np.float32)
    context = rng.integers(0, n_vocab, size=300).tolist()
    block = context[-k:]
    proc = processor_for(PENALTY, n_vocab)
    assert proc is not None
    t_rows, t_row = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc.rows(rows, context, block)
        t1 = time.perf_counter()
        proc.row(rows[0], context, block[:3])
        t_row.append(time.perf_counter() - t1)
        t_rows.append(t1 - t0)
    return {
        "target_rows_ms": 1e3 * statistics.median(t_rows),
        "draft_row_ms": 1e3 * statistics.median(t_row),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    plain = SamplingParams(temp=0.8)  # run's defaults: top-k 40, top-p 0.95, min-p 0.05
    penalised = replace(plain, constraints=PENALTY)
    texts = {p.id: p.text for p in builtin_prompts() if p.id in PROMPT_IDS}
    target_path, draft_path = ensure_demo_pair()
    loaded = load(ModelSpec.from_flags(target_path, draft_path, 2048, 0, 0, 0), plain)
    try:
        target, model = loaded.target, loaded.drafter
        assert isinstance(model, ModelDrafter)
        with_penalty = model.with_params(penalised)
        modes = {
            "spec": lambda t, s: one(target, model, t, plain, a.k, a.n, s),
            "spec+pen": lambda t, s: one(target, with_penalty, t, penalised, a.k, a.n, s),
            "ord": lambda t, s: one(target, None, t, plain, 0, a.n, s),
            "ord+pen": lambda t, s: one(target, None, t, penalised, 0, a.n, s),
        }
        one(target, model, texts["story"], plain, a.k, 16, 0)  # warm-up, discarded
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        names, turn = list(modes), 0
        for rep in range(a.reps):
            for pid, text in texts.items():
                order = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                for m in order:
                    r = modes[m](text, 1000 * rep + 7)
                    runs[m].append(r)
                    progress(rep, pid, m, r)
        n_vocab = target.n_vocab
    finally:
        loaded.close()
    med = medians(runs, "tokens_per_s")
    acc = medians(runs, "acceptance_rate")
    speedup = med["spec"] / med["ord"]
    speedup_pen = med["spec+pen"] / med["ord+pen"]
    out = {
        **provenance(),
        "n": a.n,
        "k": a.k,
        "reps": a.reps,
        "prompts": list(texts),
        "tokens_per_s_median": med,
        "acceptance_median": {m: acc[m] for m in ("spec", "spec+pen")},
        "spec_penalty_over_spec": med["spec+pen"] / med["spec"],
        "speedup": speedup,
        "speedup_with_penalty": speedup_pen,
        "speedup_ratio": speedup_pen / speedup,
        "host_cost": host_cost(n_vocab, a.k),
    }
    emit(out, a.json, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
