"""Hybrid drafting and block verification on the demo pair, interleaved, medians.

Part 1 (greedy, K fixed, or `-k auto`: the controller, as `specgen run` uses it): hybrid
(prompt lookup + the draft model) against the draft model alone and prompt lookup alone,
per prompt and by kind, on prompts that quote their input and on story
prompts. Part 2 (temperature 1, the run defaults for top-k/top-p/min-p, K 8): block
against token-wise verification with a moderate-acceptance draft, the demo draft cut
to its first 15 of 18 layers (built as the weak 6-layer draft is). Each configuration
runs once per (repetition, prompt), in rotating order so that drift of a shared machine
hits all alike; the figure is the median over those runs.

Usage (hold the model lock: two llama.cpp processes slow each other down):
    flock /tmp/specgen-model.lock .venv/bin/python scripts/hybrid_bench.py \
        [--reps 2] [-n 64] [-k 8|auto] [--part 1|2|both] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from specgen.bench.prompts import builtin_prompts
from specgen.drafters import ModelDrafter
from specgen.engine import Drafter
from specgen.events import Step
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.hybrid import HybridDrafter, LookupRecord
from specgen.models.demo import ensure_demo_pair, ensure_weak_draft
from specgen.ngram import NgramDrafter
from specgen.sampling import SamplingParams
from specgen.session import ModelSpec, load
from specgen.stages import AutoK

FUNCTION = """def merge_sorted(a, b):
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    out.extend(a[i:])
    out.extend(b[j:])
    return out
"""
QUOTING = {
    "rewrite-function": (
        f"Here is a function:\n\n```python\n{FUNCTION}```\n\nThe same function, with a"
        " docstring added and nothing else changed:\n\n```python\ndef merge_sorted(a, b):\n"
    ),
    "repeat-passage": None,  # the built-in extractive-quote prompt
    "summary-quotes": None,  # the built-in extractive-summary prompt
}
STORIES = {
    "story-fox": None,  # the built-in story prompt
    "story-lighthouse": "Write a short story about a lighthouse keeper who finds a message"
    " in a bottle.\n\nThe storm had passed by morning, and",
    "story-robot": "Write a short story about a small robot learning to paint.\n\nIn a"
    " quiet workshop at the edge of town,",
}


def prompts() -> tuple[dict[str, str], dict[str, str]]:
    built = {p.id: p.text for p in builtin_prompts()}
    quoting = dict(QUOTING)
    quoting["repeat-passage"] = built["extractive-quote"]
    quoting["summary-quotes"] = built["extractive-summary"]
    stories = dict(STORIES)
    stories["story-fox"] = built["story"]
    return quoting, stories  # type: ignore[return-value]


def paired(step) -> tuple[float, float] | None:
    """Expected accepted tokens of this round's drafted block under each rule, exactly
    given the block: token-wise sum_i prod_{j<=i} min(1, p_j/q_j), block verification
    sum_i P(tau >= i | x) = sum_i (1 - prod_{j>=i} (1 - h_j)). None without h (greedy,
    K < 2, or a token-wise round)."""
    tr = step.trace
    if tr is None or len(tr.h) < 2:
        return None
    ratios = [min(1.0, p / q) for p, q in zip(tr.p_x, tr.q_x, strict=True)]
    token = block = 0.0
    run = 1.0
    for i, r in enumerate(ratios):
        run *= r
        token += run
        miss = 1.0
        for h in tr.h[i:]:
            miss *= 1.0 - h
        block += 1.0 - miss
    return token, block


def one(target, drafter: Drafter, text: str, params, k: int | None, n: int, seed: int, rule: str):
    """One generation at K = `k`, or under the controller (`--draft-max auto`) when None,
    with the start-up's timed passes that `specgen run` makes for it, from empty caches
    as a `specgen run` process starts: the configurations share the engines, and a draft
    cache left holding this prompt by the run before would shorten the draft's catch-up,
    which the controller and the hybrid's lookup-first rule weigh."""
    target.truncate(0)
    draft_engine = getattr(drafter, "engine", None)
    if draft_engine is not None:
        draft_engine.truncate(0)
    prompt = target.tokenize(text.encode("utf-8"))
    cfg = GenerateConfig(
        max_tokens=n,
        params=params,
        ignore_eos=True,
        seed=seed,
        verify_rule=rule,
        trace=True,
        measure_ordinary=3 if k is None else 0,
    )
    policy = AutoK() if k is None else FixedK(k)
    events = list(generate(target, drafter, prompt, cfg, policy))
    pairs = [x for x in (paired(e) for e in events if isinstance(e, Step)) if x is not None]
    s = events[-1].stats
    return {
        "paired_rounds": len(pairs),
        "expected_accepted_token": sum(t for t, _ in pairs),
        "expected_accepted_block": sum(b for _, b in pairs),
        "tokens_per_s": s.tokens_per_s,
        "tokens_per_pass": s.tokens_per_pass,
        "acceptance_rate": s.acceptance_rate,
        "n_accepted_by": dict(s.n_accepted_by),
        "n_drafted_by": dict(s.n_drafted_by),
    }


def interleaved(
    modes: dict[str, Callable[[str, int], dict]], texts: dict[str, str], reps: int
) -> dict[str, dict[str, list[dict]]]:
    """runs[mode][prompt] = one result per repetition, modes rotated every run."""
    runs: dict[str, dict[str, list[dict]]] = {m: {p: [] for p in texts} for m in modes}
    names = list(modes)
    turn = 0
    for rep in range(reps):
        for pid, text in texts.items():
            order = names[turn % len(names) :] + names[: turn % len(names)]
            turn += 1
            for m in order:
                runs[m][pid].append(modes[m](text, 1000 * rep + 7))
                r = runs[m][pid][-1]
                print(
                    f"  rep {rep} {pid:18s} {m:8s} {r['tokens_per_s']:6.1f} tok/s"
                    f" {r['tokens_per_pass']:5.2f} tok/pass {r['n_accepted_by']}",
                    file=sys.stderr,
                    flush=True,
                )
    return runs


def medians(runs, key: str, pids) -> dict[str, float]:
    return {m: statistics.median(r[key] for p in pids for r in by[p]) for m, by in runs.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-k", default="8", help="K for part 1, or auto (the controller)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--part", choices=("1", "2", "both"), default="both")
    a = ap.parse_args()
    k1 = None if a.k == "auto" else int(a.k)
    k2 = 8 if k1 is None else k1
    quoting, stories = prompts()
    target_path, draft_path = ensure_demo_pair()
    greedy = SamplingParams(temp=0.0)
    out: dict = {"machine": platform.processor() or platform.machine(), "n": a.n, "k": a.k}

    if a.part in ("1", "both"):
        loaded = load(ModelSpec.from_flags(target_path, draft_path, 2048, 0, 0, 0), greedy)
        try:
            target, model = loaded.target, loaded.drafter
            assert isinstance(model, ModelDrafter)
            hybrid = HybridDrafter(model)
            ngram = NgramDrafter(target.n_vocab)
            texts = {**quoting, **stories}

            def mode(d):
                def run(text, seed):
                    if isinstance(d, HybridDrafter):  # each `specgen run` starts a fresh record
                        d.record = LookupRecord.for_params(greedy)
                    return one(target, d, text, greedy, k1, a.n, seed, "token")

                return run

            print("part 1: greedy, K", a.k, file=sys.stderr)
            runs = interleaved(
                {"hybrid": mode(hybrid), "model": mode(model), "ngram": mode(ngram)}, texts, a.reps
            )
        finally:
            loaded.close()
        out["part1"] = {
            kind: {
                "tokens_per_s": medians(runs, "tokens_per_s", pids),
                "tokens_per_pass": medians(runs, "tokens_per_pass", pids),
            }
            for kind, pids in (("quoting", list(quoting)), ("stories", list(stories)))
        }
        out["part1_runs"] = runs

    if a.part in ("2", "both"):
        weak = ensure_weak_draft(15)
        sampled = SamplingParams(temp=1.0)
        loaded = load(ModelSpec.from_flags(target_path, weak, 2048, 0, 0, 0), sampled)
        try:
            target, model = loaded.target, loaded.drafter
            assert isinstance(model, ModelDrafter)

            def rule(r):
                return lambda text, seed: one(target, model, text, sampled, k2, a.n, seed, r)

            print("part 2: temperature 1, 15-layer draft, K", k2, file=sys.stderr)
            texts = dict(stories)
            runs2 = interleaved({"block": rule("block"), "token": rule("token")}, texts, a.reps)
        finally:
            loaded.close()
        pids = list(texts)
        rows = [r for by in runs2["block"].values() for r in by]
        n_rounds = sum(r["paired_rounds"] for r in rows)
        e_token = sum(r["expected_accepted_token"] for r in rows) / n_rounds
        e_block = sum(r["expected_accepted_block"] for r in rows) / n_rounds
        out["part2_paired"] = {
            "rounds": n_rounds,
            "tokens_per_pass_token": 1 + e_token,
            "tokens_per_pass_block": 1 + e_block,
            "ratio": (1 + e_block) / (1 + e_token),
        }
        out["part2"] = {
            "tokens_per_s": medians(runs2, "tokens_per_s", pids),
            "tokens_per_pass": medians(runs2, "tokens_per_pass", pids),
            "acceptance_rate": medians(runs2, "acceptance_rate", pids),
        }
        out["part2_runs"] = runs2

    if "part1" in out:
        for pid in runs["hybrid"]:
            med = {m: statistics.median(r["tokens_per_s"] for r in runs[m][pid]) for m in runs}
            best = max(med["model"], med["ngram"])
            print(
                f"{pid:18s} tok/s hybrid {med['hybrid']:.1f}  model {med['model']:.1f}  ngram"
                f" {med['ngram']:.1f}  hybrid/best {med['hybrid'] / best:.3f}"
            )
        for kind in ("quoting", "stories"):
            t = out["part1"][kind]["tokens_per_s"]
            best = max(t["model"], t["ngram"])
            print(
                f"{kind:8s} tok/s hybrid {t['hybrid']:.1f}  model {t['model']:.1f}  ngram"
                f" {t['ngram']:.1f}  hybrid/best {t['hybrid'] / best:.3f}  hybrid/model"
                f" {t['hybrid'] / t['model']:.3f}"
            )
    if "part2" in out:
        p2 = out["part2"]
        print(
            f"temp 1 K {k2}: tok/pass block {p2['tokens_per_pass']['block']:.3f} token"
            f" {p2['tokens_per_pass']['token']:.3f} ratio"
            f" {p2['tokens_per_pass']['block'] / p2['tokens_per_pass']['token']:.3f};"
            f" tok/s block {p2['tokens_per_s']['block']:.1f}"
            f" token {p2['tokens_per_s']['token']:.1f}"
            f" ratio {p2['tokens_per_s']['block'] / p2['tokens_per_s']['token']:.3f}"
        )
        pp = out["part2_paired"]
        print(
            f"paired, same {pp['rounds']} drafted blocks: expected tok/pass block"
            f" {pp['tokens_per_pass_block']:.3f} token {pp['tokens_per_pass_token']:.3f}"
            f" ratio {pp['ratio']:.3f}"
        )
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
