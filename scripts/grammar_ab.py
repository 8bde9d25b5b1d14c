#!/usr/bin/env python3
"""Constrained generation under two builds of specgen, side by side: interleaved runs of
`specgen run --json`, medians.

Cases on the demo pair (Gemma 3 270M: F32 target, Q4_K_M draft; 262,144-token vocabulary),
-n 128: free text under a grammar at its top level (``root ::= [^\\n]*``, where one mask
costs 4-8 ms on this vocabulary) and a JSON Schema (a person record, masks of 0.01-0.1 ms),
each at temperature 0 and 0.8 (seed 1), with the draft under ``--draft-max auto`` and with
``--draft none`` (ordinary decoding under the same grammar). Per repetition every case runs
under A then B, or B then A on odd repetitions, so drift of a shared machine hits both
alike. Reported per case: median tokens/s of each build, the median of the per-repetition
ratios B/A, tokens per target pass, and whether the texts are the same where both builds
being exact makes them so: greedy, and seeded with ``--draft none`` (one law, one random
stream).

Usage (hold the model lock: two llama.cpp processes slow each other down):

    git worktree add /tmp/old OLD_COMMIT
    flock /tmp/specgen-model.lock .venv/bin/python scripts/grammar_ab.py \\
        --a "env PYTHONPATH=/tmp/old .venv/bin/python -m specgen" \\
        --b ".venv/bin/python -m specgen" [--reps 3] [--only "free text"] [--json out.json]

Each command runs with PYTHONSAFEPATH=1 (`bench_common.AB_ENV`): run from the repository,
``python -m`` would otherwise put it before PYTHONPATH and both sides would run its code.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from bench_common import AB_ENV, ab_parser, check_builds, emit, provenance

STORY = "Once upon a time, in a small village by the sea, there lived"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
GRAMMARS = {
    "free text": ["--grammar", "root ::= [^\\n]*", STORY],
    "json schema": ["-j", json.dumps(PERSON), "A person record as JSON:\n"],
}


def cases() -> list[tuple[str, list[str]]]:
    out = []
    for name, args in GRAMMARS.items():
        for temp in ("0", "0.8"):
            for draft in ("auto", "none"):
                flags = ["--draft-max", "auto"] if draft == "auto" else ["--draft", "none"]
                label = f"{name}, temp {temp}, {'--draft none' if draft == 'none' else 'auto'}"
                out.append((label, ["--temp", temp, "--seed", "1", *flags, *args]))
    return out


def run(cmd: str, args: list[str], n: int) -> dict:
    argv = [*shlex.split(cmd), "run", "-n", str(n), "--json", "--no-live", *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=AB_ENV)
    if done.returncode != 0:
        sys.exit(f"grammar_ab: {' '.join(argv[:4])}... exited {done.returncode}: {done.stderr}")
    out = json.loads(done.stdout)
    s = out["stats"]
    return {
        "tokens_per_s": s["tokens_per_s"],
        "tokens_per_pass": s["tokens_per_pass"],
        "host_s": s["host_s"],
        "text": out["text"],
    }


def main() -> int:
    ap = ab_parser(__doc__, reps=3, n=128)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only", default="", help="the cases whose label holds this text")
    opts = ap.parse_args()
    check_builds(opts.a, opts.b)
    chosen = [(label, args) for label, args in cases() if opts.only in label]
    runs: dict[str, dict[str, list[dict]]] = {label: {"a": [], "b": []} for label, _ in chosen}
    for rep in range(opts.reps):
        for label, args in chosen:
            for side in ("a", "b") if rep % 2 == 0 else ("b", "a"):
                r = run(getattr(opts, side), args, opts.n)
                runs[label][side].append(r)
                print(f"rep {rep} {side} {label}: {r['tokens_per_s']:.1f} tok/s", flush=True)
    rows = []
    print("\n| case | A tokens/s | B tokens/s | B/A | tokens per pass A / B | greedy texts |")
    print("|---|---|---|---|---|---|")
    for label, sides in runs.items():
        a, b = sides["a"], sides["b"]
        pairs = list(zip(a, b, strict=True))
        ratio = statistics.median(y["tokens_per_s"] / x["tokens_per_s"] for x, y in pairs)
        same = "same" if all(x["text"] == y["text"] for x, y in pairs) else "differ"
        row = {
            "case": label,
            "a_tokens_per_s": statistics.median(x["tokens_per_s"] for x in a),
            "b_tokens_per_s": statistics.median(y["tokens_per_s"] for y in b),
            "ratio": ratio,
            "a_tokens_per_pass": statistics.median(x["tokens_per_pass"] for x in a),
            "b_tokens_per_pass": statistics.median(y["tokens_per_pass"] for y in b),
            # greedy, or seeded with the target alone: the same p must give the same text
            "texts": same if "temp 0," in label or "--draft none" in label else "-",
        }
        rows.append(row)
        print(
            f"| {label} | {row['a_tokens_per_s']:.1f} | {row['b_tokens_per_s']:.1f} |"
            f" {ratio:.2f}x | {row['a_tokens_per_pass']:.2f} / {row['b_tokens_per_pass']:.2f}"
            f" | {row['texts']} |"
        )
    emit({"provenance": provenance(), "rows": rows}, opts.json, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
