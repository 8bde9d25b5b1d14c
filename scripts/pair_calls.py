"""Short calls on one loaded `specgen.Pair`: what each call really takes (wall clock around
`Pair.generate`) against what its stats say (`stats.wall_s`), for calls of a few tokens,
greedy, on the demo pair (or `-m`/`-md`).

After a warm-up call, each configuration makes 7 calls of the same prompt; printed: the
medians over calls 2-7 in ms, ``[call, stats.wall_s]`` per configuration, as one JSON
line. Configurations: ``auto-8`` and ``auto-32`` (``draft_max="auto"``, 8 and 32 tokens),
``k4-8`` (``draft_max=4``, 8 tokens) and ``ordinary-8`` (``ordinary=True``: the target
alone).

To compare two commits, run it alternately from each checkout (``PYTHONPATH=CHECKOUT``,
from a directory outside both, so that ``python`` imports the checkout named), one process
at a time.

Usage:
    .venv/bin/python scripts/pair_calls.py [-m TARGET.gguf -md DRAFT.gguf]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import specgen

CONFIGS: dict[str, dict[str, Any]] = {
    "auto-8": {"max_tokens": 8},
    "auto-32": {"max_tokens": 32},
    "k4-8": {"max_tokens": 8, "draft_max": 4},
    "ordinary-8": {"max_tokens": 8, "ordinary": True},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", dest="target", default=None)
    ap.add_argument("-md", dest="draft", default=None)
    ap.add_argument("--calls", type=int, default=7)
    a = ap.parse_args()
    out = {}
    with specgen.load(a.target, a.draft) as pair:
        pair.generate("Warm up", max_tokens=4, temperature=0)
        for label, kw in CONFIGS.items():
            calls, stats = [], []
            for _ in range(a.calls):
                t0 = time.perf_counter()
                r = pair.generate("The capital of France is", temperature=0, **kw, ignore_eos=True)
                calls.append(time.perf_counter() - t0)
                stats.append(r.stats.wall_s)
            out[label] = [
                round(statistics.median(calls[1:]) * 1e3, 1),
                round(statistics.median(stats[1:]) * 1e3, 1),
            ]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
