"""OpenAI's Predicted Outputs (``prediction``) through `specgen serve`: each task's chat
request with and without a prediction, alternating, medians.

The server runs as users start it (automatic K, prompt lookup beside the draft model,
one slot), greedy, so that with and without a prediction the answer is the same and only
its speed may differ. Tasks:

- ``edit``: rename a function in a short Python file given in the prompt; the prediction
  is the file as it is (OpenAI's own example of the feature). The prompt holds the file
  too, so prompt lookup already copies from it without a prediction.
- ``regenerate``: a question asked again with the first answer as the prediction (an
  editor regenerating, an agent retrying); nothing in the prompt to copy from.
- ``wrong``: the same question with an unrelated paragraph as the prediction: what a
  useless prediction costs.

Per task, two modes in ABBA order per repetition (drift of a shared machine hits both
alike): ``without`` and ``with`` the prediction. Reported per task: the median generation
speed of each mode (llama-server's ``timings.predicted_per_second``: output tokens over
the time after the prompt), the median of the paired ratios with / without, the median
share of output tokens accepted from prompt lookup, and whether every answer with the
prediction equalled the one without.

Usage (hold the model lock: two llama.cpp processes slow each other down):
    flock /tmp/specgen-model.lock .venv/bin/python scripts/prediction_bench.py \
        -m TARGET.gguf -md DRAFT.gguf [--reps 5] [-n 192] [--json out.json]
(an instruct pair with a chat template: the SmolLM2-135M-Instruct F32 target and its
Q4_1 draft in the measurements).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from bench_common import emit, provenance

# run as `python scripts/prediction_bench.py`: scripts/ is on sys.path, so the server
# start-up helpers are serve_footprint's, not a copy
from serve_footprint import free_port, wait_ready

CODE = '''def area(width, height):
    """The area of a rectangle."""
    return width * height


def total_area(rects):
    """The sum of the areas of (width, height) pairs."""
    return sum(area(w, h) for w, h in rects)


if __name__ == "__main__":
    print(area(3, 4))
    print(total_area([(1, 2), (3, 4)]))
'''
EDIT = (
    "Rename the function `area` to `rect_area` everywhere in this Python file. Reply with"
    f" the whole file only, in a code block.\n\n```python\n{CODE}```"
)
QUESTION = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
UNRELATED = (
    "The lighthouse stood at the end of the harbour wall, its paint flaking in the salt"
    " wind. Every evening the keeper climbed the spiral stairs, trimmed the wick and watched"
    " the fishing boats come home across the grey water."
)


def chat(url: str, content: str, n: int, prediction: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": n,
        "temperature": 0,
        "return_tokens": True,
    }
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return dict(r.json())


def figures(answer: dict[str, Any]) -> dict[str, Any]:
    spec, n = answer["speculative"], len(answer["tokens"])
    by = spec["num_accepted_draft_tokens_by_source"]  # from the prompt and the prediction
    lookup = by.get("lookup", 0) + by.get("prediction", 0)
    return {
        "tokens_per_s": answer["timings"]["predicted_per_second"],
        "tokens": n,
        "lookup_share": lookup / n if n else 0.0,
        "acceptance_rate": spec["acceptance_rate"],
        "ids": answer["tokens"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", required=True, type=Path, help="target GGUF (with a chat template)")
    ap.add_argument("-md", required=True, type=Path, help="draft GGUF")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of the pair of modes")
    ap.add_argument("-n", type=int, default=192, help="max_tokens")
    ap.add_argument("--json", type=Path, help="write the figures to this file")
    a = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "specgen", "serve", "-m", str(a.m), "-md", str(a.md)]
    cmd += ["-np", "1", "-c", "2048", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        wait_ready(url, proc)
        first = chat(url, QUESTION, a.n, None)["choices"][0]["message"]["content"]
        tasks = {
            "edit": (EDIT, CODE),
            "regenerate": (QUESTION, first),
            "wrong": (QUESTION, UNRELATED),
        }
        for task, (content, prediction) in tasks.items():
            runs[task] = {"without": [], "with": []}
            for rep in range(a.reps):
                order = ("without", "with") if rep % 2 == 0 else ("with", "without")
                for mode in order:
                    got = figures(chat(url, content, a.n, prediction if mode == "with" else None))
                    runs[task][mode].append(got)
                    print(
                        f"  {task:10s} rep {rep} {mode:7s} {got['tokens_per_s']:6.1f} tok/s,"
                        f" {got['tokens']} tokens, {got['lookup_share']:.0%} from lookup",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    out: dict[str, Any] = {**provenance(), "target": a.m.name, "draft": a.md.name,
                           "max_tokens": a.n, "reps": a.reps, "tasks": {}}  # fmt: skip
    for task, modes in runs.items():
        w, wo = modes["with"], modes["without"]
        out["tasks"][task] = {
            "without_tokens_per_s": statistics.median(r["tokens_per_s"] for r in wo),
            "with_tokens_per_s": statistics.median(r["tokens_per_s"] for r in w),
            "ratio": statistics.median(
                x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(w, wo, strict=True)
            ),
            "without_lookup_share": statistics.median(r["lookup_share"] for r in wo),
            "with_lookup_share": statistics.median(r["lookup_share"] for r in w),
            "same_answer": all(x["ids"] == wo[0]["ids"] for x in w + wo),
            "tokens": wo[0]["tokens"],
        }
    emit(out, a.json, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
