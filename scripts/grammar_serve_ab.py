#!/usr/bin/env python3
"""Free text under a grammar through `specgen serve`, two builds side by side: throughput
of concurrent requests, interleaved, medians.

Each repetition starts a server of build A, then of build B (B then A on odd repetitions),
on the demo pair (Gemma 3 270M: F32 target, Q4_K_M draft) with `-np 4`, and sends 8
`/v1/completions` requests, 4 at a time, under llama-server's ``grammar`` field
``root ::= [^\\n]*`` (free text at the grammar's top level, where a mask costs 4-8 ms on
this vocabulary), at temperature 0, then 0.8 (seed i for request i). Reported per
temperature: completion tokens over wall time of each build, the median of the
per-repetition ratios B/A, and whether the greedy texts of A and B are the same.

Usage (hold the model lock for the whole run: two llama.cpp processes slow each other):

    git worktree add /tmp/old OLD_COMMIT
    flock /tmp/specgen-model.lock .venv/bin/python scripts/grammar_serve_ab.py \\
        --a "env PYTHONPATH=/tmp/old .venv/bin/python -m specgen" \\
        --b ".venv/bin/python -m specgen" [--reps 2]

Each server runs with PYTHONSAFEPATH=1 (`bench_common.AB_ENV`), so that PYTHONPATH, not
the working directory, says which specgen it runs; `bench_common.check_builds` refuses
two commands that run the same one.
"""

from __future__ import annotations

import shlex
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from bench_common import AB_ENV, ab_parser, check_builds
from serve_footprint import free_port, wait_ready

from specgen.models.demo import ensure_demo_pair

GRAMMAR = "root ::= [^\\n]*"
PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived",
    "The old lighthouse keeper climbed the stairs every evening and",
    "In the heart of the forest, a small fox found",
    "The train left the station at dawn, carrying",
]


def load(url: str, temp: float, n: int) -> tuple[float, int, list[str]]:
    """8 requests, 4 at a time: (wall seconds, completion tokens, texts in order)."""

    def one(i: int) -> dict:
        body = {
            "prompt": PROMPTS[i % len(PROMPTS)],
            "max_tokens": n,
            "temperature": temp,
            "seed": i,
            "grammar": GRAMMAR,
        }
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        return r.json()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        out = list(pool.map(one, range(8)))
    wall = time.perf_counter() - t0
    return (
        wall,
        sum(o["usage"]["completion_tokens"] for o in out),
        [o["choices"][0]["text"] for o in out],
    )


def serve(cmd: str, target: str, draft: str, n: int) -> dict[float, tuple[float, int, list]]:
    port = free_port()
    argv = [*shlex.split(cmd), "serve", "-m", target, "-md", draft, "-np", "4", "-c", "1024"]
    proc = subprocess.Popen(
        [*argv, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=AB_ENV,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        load(url, 0.0, 8)  # warm-up: the controller's first rounds, the caches
        return {temp: load(url, temp, n) for temp in (0.0, 0.8)}
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> int:
    opts = ab_parser(__doc__, reps=2, n=96).parse_args()
    check_builds(opts.a, opts.b)
    target, draft = (str(p) for p in ensure_demo_pair())
    runs: dict[str, list] = {"a": [], "b": []}
    for rep in range(opts.reps):
        for side in ("a", "b") if rep % 2 == 0 else ("b", "a"):
            got = serve(getattr(opts, side), target, draft, opts.n)
            runs[side].append(got)
            rates = ", ".join(f"temp {t}: {k / w:.1f} tok/s" for t, (w, k, _) in got.items())
            print(f"rep {rep} {side}: {rates}", flush=True)
    print("\n| temperature | A tokens/s | B tokens/s | B/A | greedy texts |")
    print("|---|---|---|---|---|")
    for temp in (0.0, 0.8):
        a = [r[temp][1] / r[temp][0] for r in runs["a"]]
        b = [r[temp][1] / r[temp][0] for r in runs["b"]]
        ratio = statistics.median(y / x for x, y in zip(a, b, strict=True))
        same = all(x[temp][2] == y[temp][2] for x, y in zip(runs["a"], runs["b"], strict=True))
        texts = ("same" if same else "differ") if temp == 0.0 else "-"
        print(
            f"| {temp} | {statistics.median(a):.1f} | {statistics.median(b):.1f} |"
            f" {ratio:.2f}x | {texts} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
