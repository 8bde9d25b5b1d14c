"""The Responses API against chat completions on one running `specgen serve`: the same
request through ``/v1/chat/completions`` and ``/v1/responses``, streamed, greedy,
alternating in ABBA order (a shared machine's drift hits both alike), medians.

Reported per route: the client's time to the first text delta (TTFT) and its output
tokens (the usage the stream ends with) over the stream's whole time; and whether every
answer was the same text on both routes (the Responses route is the chat request that
asks the same, so greedy answers must match).

Usage (start the server first, under the model lock, with a model that has a chat
template; the measurements used the SmolLM2-135M-Instruct F32 target and its Q4_1 draft):
    .venv/bin/python scripts/responses_ab.py http://127.0.0.1:8080 [--reps 8] [-n 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import openai

PROMPT = "Write a short story about a robot who learns to paint."


def _chat(c: openai.OpenAI, n: int) -> tuple[float, float, str]:
    t0, first, tokens, text = time.perf_counter(), None, 0, ""
    stream = c.chat.completions.create(
        model="any", messages=[{"role": "user", "content": PROMPT}], max_tokens=n,
        temperature=0, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    for chunk in stream:
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            first = first if first is not None else time.perf_counter() - t0
            text += delta
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return first or 0.0, tokens / (time.perf_counter() - t0), text


def _responses(c: openai.OpenAI, n: int) -> tuple[float, float, str]:
    t0, first, tokens, text = time.perf_counter(), None, 0, ""
    stream = c.responses.create(
        model="any", input=PROMPT, max_output_tokens=n, temperature=0, stream=True
    )
    for event in stream:
        if event.type == "response.output_text.delta":
            first = first if first is not None else time.perf_counter() - t0
            text += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            usage = event.response.usage
            tokens = usage.output_tokens if usage is not None else 0
    return first or 0.0, tokens / (time.perf_counter() - t0), text


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("-n", type=int, default=128)
    a = p.parse_args(argv)
    c = openai.OpenAI(base_url=a.url.rstrip("/") + "/v1", api_key="any", max_retries=0)
    routes = {"chat": _chat, "responses": _responses}
    for f in routes.values():  # warm: the prompt's cache, the first-request costs
        f(c, a.n)
    runs: dict[str, list[tuple[float, float, str]]] = {name: [] for name in routes}
    for rep in range(a.reps):
        order = list(routes) if rep % 2 == 0 else list(reversed(routes))
        for name in order:
            runs[name].append(routes[name](c, a.n))
    for name, xs in runs.items():
        ttft = statistics.median(x[0] for x in xs) * 1000
        tps = statistics.median(x[1] for x in xs)
        print(f"{name}: TTFT median {ttft:.0f} ms, {tps:.1f} tokens/s median ({len(xs)} runs)")
    same = {x[2] for xs in runs.values() for x in xs}
    print(f"the same text on both routes in every run: {'yes' if len(same) == 1 else 'no'}")
    return 0 if len(same) == 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
