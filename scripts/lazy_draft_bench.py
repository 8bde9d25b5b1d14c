"""The single stream's draft prefill, before and after it became lazy (issues 33 and 37):
hybrid drafting (`--lookup on`) against the draft model alone, prompt lookup alone
(`--draft ngram`) and ordinary decoding, under `--draft-max auto`, greedy, on the demo
pair; two checkouts alternated, medians.

Prompts: pure copies (repeat a passage, a summary that quotes, a function rewritten with
a docstring: hybrid_bench's quoting set), code (bench's code prompt) and prose (two story
prompts). Each child process loads the pair once and runs every (prompt, mode) once, the
modes in rotating order; the parent alternates the checkouts (old, new, new, old, ...),
each child under the model lock, taken per child (so no hold lasts more than about a
minute and a half). Per run: tokens/s as `specgen bench` and `--json` report it
(generated tokens over decode_s: prefill and the timed start-up passes left out), the
TTFT (stats.ttft_s, as bench reports it), prefill_s and the end-to-end rate (generated
tokens over the wall time from the call to the Done, prefill included).

Usage:
    git worktree add /tmp/old OLD_COMMIT
    .venv/bin/python scripts/lazy_draft_bench.py \\
        --old /tmp/old [--reps 5] [-n 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("hybrid", "model", "ngram", "none")
KINDS = {
    "repeat-passage": "copy",
    "summary-quotes": "copy",
    "rewrite-function": "copy",
    "code-python": "code",
    "story-fox": "prose",
    "story-lighthouse": "prose",
}


def child(n: int, rep: int) -> list[dict]:
    """Every (prompt, mode) once in this process, on the checkout on PYTHONPATH."""
    sys.path.insert(0, str(HERE))
    from hybrid_bench import prompts

    from specgen.bench.prompts import builtin_prompts
    from specgen.drafters import ModelDrafter
    from specgen.generate import GenerateConfig, generate
    from specgen.hybrid import HybridDrafter
    from specgen.models.demo import ensure_demo_pair
    from specgen.ngram import NgramDrafter
    from specgen.sampling import SamplingParams
    from specgen.session import ModelSpec, load, make_policy

    quoting, stories = prompts()
    texts = {**quoting, **stories}
    texts["code-python"] = {p.id: p.text for p in builtin_prompts()}["code-python"]
    greedy = SamplingParams(temp=0.0)
    tp, dp = ensure_demo_pair()
    loaded = load(ModelSpec.from_flags(tp, dp, 2048, 0, 0, 0), greedy)
    target, model = loaded.target, loaded.drafter
    assert isinstance(model, ModelDrafter)
    out = []
    try:
        for i, pid in enumerate(KINDS):
            ids = target.tokenize(texts[pid].encode("utf-8"))
            turn = (rep + i) % len(MODES)
            for mode in MODES[turn:] + MODES[:turn]:
                drafter = {
                    "hybrid": HybridDrafter(model),  # a fresh record, as each `specgen run`
                    "model": model,
                    "ngram": NgramDrafter(target.n_vocab),
                    "none": None,
                }[mode]
                config = GenerateConfig(
                    max_tokens=n, params=greedy, ignore_eos=True, seed=1234,
                    measure_ordinary=0 if drafter is None else 3,
                )  # fmt: skip
                policy = make_policy(None) if drafter is not None else make_policy(0)
                t0 = time.perf_counter()
                done = list(generate(target, drafter, ids, config, policy))[-1]
                wall = time.perf_counter() - t0
                s = done.stats
                out.append({
                    "prompt": pid, "kind": KINDS[pid], "mode": mode,
                    "tokens_per_s": s.tokens_per_s, "ttft_s": s.ttft_s,
                    "prefill_s": s.prefill_s, "decode_s": s.decode_s,
                    "e2e_tokens_per_s": s.n_generated / wall, "n_generated": s.n_generated,
                    "k_history": s.k_history, "n_drafted_by": dict(s.n_drafted_by),
                    "tokens": list(done.tokens),
                })  # fmt: skip
    finally:
        loaded.close()
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per side: medians by (kind, mode) of tokens/s, e2e tokens/s, TTFT, prefill; the
    hybrid's ratio to the better of model and ngram per kind (medians over prompts and
    repetitions of each run's own ratio, paired within one child process)."""
    out: dict = {}
    for side, rs in runs.items():
        by: dict = {}
        for kind in ("copy", "code", "prose"):
            row: dict = {}
            for mode in MODES:
                sel = [r for r in rs if r["kind"] == kind and r["mode"] == mode]
                row[mode] = {
                    key: round(med([r[key] for r in sel]), 4)
                    for key in ("tokens_per_s", "e2e_tokens_per_s", "ttft_s", "prefill_s")
                }
            for key in ("tokens_per_s", "e2e_tokens_per_s"):
                ratios = []
                for r in rs:
                    if r["kind"] != kind or r["mode"] != "hybrid":
                        continue
                    same = [
                        x for x in rs
                        if x["prompt"] == r["prompt"] and x["child"] == r["child"]
                        and x["mode"] in ("model", "ngram")
                    ]  # fmt: skip
                    ratios.append(r[key] / max(x[key] for x in same))
                row[f"hybrid_over_best_{key}"] = round(med(ratios), 4)
            ttft = [
                r["ttft_s"] / x["ttft_s"]
                for r in rs
                if r["kind"] == kind and r["mode"] == "hybrid"
                for x in rs
                if x["prompt"] == r["prompt"] and x["child"] == r["child"] and x["mode"] == "none"
            ]
            row["hybrid_ttft_over_ordinary"] = round(med(ttft), 4)
            by[kind] = row
        out[side] = by
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, help="checkout of the code before the change")
    ap.add_argument("--new", type=Path, help="checkout of the code after it (default: this one)")
    ap.add_argument("--first-rep", type=int, default=0, help="number of the first repetition")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.n, a.child)))
        return 0
    assert a.old is not None, "--old CHECKOUT is needed"
    sides = {"old": a.old.resolve(), "new": (a.new or HERE.parent).resolve()}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for rep in range(a.first_rep, a.first_rep + a.reps):
        for side in ("old", "new") if rep % 2 == 0 else ("new", "old"):
            env = {**os.environ, "PYTHONPATH": str(sides[side])}
            script = str(HERE / Path(__file__).name)
            cmd = ["flock", "/tmp/specgen-model.lock", sys.executable, script,
                   "-n", str(a.n), "--child", str(rep)]  # fmt: skip
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            got = json.loads(res.stdout.strip().splitlines()[-1])
            for r in got:
                r["child"] = f"{side}-{rep}"
                print(
                    f"rep {rep} {side} {r['prompt']:17s} {r['mode']:6s}"
                    f" {r['tokens_per_s']:6.1f} tok/s e2e {r['e2e_tokens_per_s']:5.1f}"
                    f" ttft {r['ttft_s'] * 1e3:5.0f} ms prefill {r['prefill_s'] * 1e3:5.0f} ms"
                    f" {r['n_drafted_by']}",
                    file=sys.stderr,
                    flush=True,
                )
            runs[side] += got
    # greedy output is the same on both sides (near-ties of batched arithmetic aside)
    same = sum(
        o["tokens"] == n["tokens"]
        for o in runs["old"]
        for n in runs["new"]
        if (o["prompt"], o["mode"], o["child"][4:]) == (n["prompt"], n["mode"], n["child"][4:])
    )

    def commit_of(path: Path) -> str:
        cmd = ["git", "-C", str(path), "rev-parse", "--short", "HEAD"]
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()

    commit, old_commit = commit_of(sides["new"]), commit_of(a.old)
    out = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "old": old_commit,
        "new": commit,
        "n": a.n,
        "reps": a.reps,
        "same_output_pairs": f"{same}/{len(runs['new'])}",
        "summary": summarize(runs),
    }
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps({**out, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
