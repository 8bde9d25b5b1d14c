"""Several choices of one request (`n=4`) against four separate concurrent requests with
the same prompt, on the demo pair through `specgen serve -np 4`, alternating, medians.

Two modes, alternated within one run (ABBA order per repetition, so that drift of a
shared machine hits both alike), each with the same prompt text, `max_tokens`,
temperature (0.8, serve's defaults for top-k/top-p/min-p), EOS ignored:

- ``n4``: one /v1/completions request with ``n=4`` and ``seed=S`` (choice i is seeded
  S + i: the same law and the same streams as the separate requests below);
- ``sep4``: four concurrent /v1/completions requests with ``n=1`` and seeds S..S+3.

Reported per mode: the aggregate output tokens/s (every choice's tokens over the wall
time from sending to the last response) and the prompt tokens the target evaluated
(``specgen_prompt_evaluated_tokens_total``'s increase on /metrics), medians over the
repetitions; and the ratio n4 / sep4 (issue 35's goal: tokens/s >= 0.95x, one prefill
instead of four). Each trial's prompt starts with its own number so that no slot holds a
prefix of it from an earlier trial (a slot keeps its last prompt's cells, which would
hide the separate requests' prefills).

Usage (hold the model lock: two llama.cpp processes slow each other down):
    flock /tmp/specgen-model.lock .venv/bin/python scripts/choices_bench.py \
        [--reps 5] [-n 128] [--prompt extractive-quote] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from bench_common import emit, medians, provenance

# run as `python scripts/choices_bench.py`: scripts/ is on sys.path, so the server start-up
# helpers are serve_footprint's, not a copy
from serve_footprint import free_port, wait_ready

from specgen.bench.prompts import builtin_prompts

CHOICES = 4
METRIC = "specgen_prompt_evaluated_tokens_total"


def evaluated(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=60).text
    m = re.search(rf"^{METRIC} ([0-9.eE+-]+)$", text, re.M)
    if m is None:
        sys.exit(f"no {METRIC} on {url}/metrics")
    return float(m.group(1))


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return dict(r.json())


def trial(
    url: str, pool: concurrent.futures.Executor, mode: str, body: dict[str, Any]
) -> dict[str, float]:
    """One request with n=4 or four concurrent ones: (output tokens, wall s, tokens/s,
    prompt tokens evaluated, prompt tokens)."""
    before = evaluated(url)
    t0 = time.perf_counter()
    if mode == "n4":
        answers = [post(url, {**body, "n": CHOICES})]
    else:
        futures = [
            pool.submit(post, url, {**body, "seed": body["seed"] + i}) for i in range(CHOICES)
        ]
        answers = [f.result() for f in futures]
    wall_s = time.perf_counter() - t0
    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    choices = sum(len(a["choices"]) for a in answers)
    assert choices == CHOICES, f"{mode}: {choices} choices"
    return {
        "tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s,
        "prompt_evaluated": evaluated(url) - before,
        "prompt_tokens": answers[0]["usage"]["prompt_tokens"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions of the pair of modes")
    ap.add_argument("-n", type=int, default=128, help="max_tokens per choice")
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--prompt", default="extractive-quote", help="a built-in prompt id")
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot (-c)")
    ap.add_argument("--json", type=Path, help="write the figures to this file")
    ap.add_argument("--log", type=Path, help="write the server's stderr (a line per request)")
    a = ap.parse_args()
    text = {p.id: p.text for p in builtin_prompts()}[a.prompt]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "specgen", "serve", "-np", str(CHOICES), "-c", str(a.ctx)]
    log = a.log.open("w") if a.log is not None else subprocess.DEVNULL
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=log)
    runs: dict[str, list[dict[str, float]]] = {"n4": [], "sep4": []}
    try:
        wait_ready(url, proc)
        base = {"max_tokens": a.n, "temperature": a.temp, "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(CHOICES) as pool:
            for mode in ("n4", "sep4"):  # warm-up: the controller's first timings
                trial(
                    url, pool, mode, {**base, "prompt": f"0. {text}", "max_tokens": 16, "seed": 1}
                )
            for rep in range(a.reps):
                order = ("n4", "sep4") if rep % 2 == 0 else ("sep4", "n4")
                for j, mode in enumerate(order):
                    body = {**base, "prompt": f"{2 * rep + j + 1}. {text}", "seed": 100 * rep}
                    r = trial(url, pool, mode, body)
                    runs[mode].append(r)
                    print(
                        f"  rep {rep} {mode:4s} {r['tokens_per_s']:6.1f} tok/s ({r['tokens']:.0f}"
                        f" tokens in {r['wall_s']:.1f} s), prompt evaluated"
                        f" {r['prompt_evaluated']:.0f} of {r['prompt_tokens']:.0f}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    med = medians(runs, "tokens_per_s")
    pre = medians(runs, "prompt_evaluated")
    paired = statistics.median(
        x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(runs["n4"], runs["sep4"], strict=True)
    )
    out = {
        **provenance(),
        "prompt": a.prompt,
        "n": a.n,
        "temp": a.temp,
        "reps": a.reps,
        "median_tokens_per_s": med,
        "median_prompt_evaluated": pre,
        "ratio_n4_over_sep4": med["n4"] / med["sep4"],
        "median_paired_ratio": paired,
    }
    emit(out, a.json, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
