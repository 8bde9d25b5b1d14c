#!/usr/bin/env python3
"""What the load client of `specgen bench --url` costs: its CPU and the latency it adds per
request, measured against the tiny OpenAI-protocol server of the tests (tests/openai_stub.py),
run in its own process so that only the client's CPU is counted.

    PYTHONPATH=. .venv/bin/python scripts/load_overhead.py [--streams 8] [--chunks 128]
        [--delay-ms 25] [--requests 32]

The stub streams `--chunks` one-token chunks `--delay-ms` apart (25 ms: about a 2-core CPU's
pace at 4-8 streams). Figures:
- client CPU during the level: what `bench --url` itself reports (`client_cpu_percent`:
  the process's CPU seconds over the level's wall seconds, while requests run); and from
  the level's start to `run_load`'s return, its summary and teardown included (percent of
  one core);
- added latency per request: the client's E2EL − the server's own time for the same
  request (request read to `[DONE]` written), split into sending and receiving (both
  processes stamp `time.perf_counter()`, one monotonic clock on Linux): an upper bound on
  what the client adds, since it also holds loopback TCP and the stub's own Python server
  (a thread per stream under one GIL). Sending is split again at the moment the client
  hands the request to the socket: before it is the client's own time.
Goals (issue 19): under 1 ms per request and under 5% CPU at 8 streams. The machine is
shared and noisy: take the median of several runs.
"""

from __future__ import annotations

import argparse
import bisect
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=128)
    ap.add_argument("--delay-ms", type=float, default=25.0)
    ap.add_argument("--requests", type=int, default=32)
    a = ap.parse_args()

    from specgen.bench.load import LoadPrompt, LoadSettings, parse_servers, run_load, transport
    from specgen.bench.loadstats import LoadLevel

    written: list[float] = []  # when each request reached the socket
    send = transport._Stream.send

    async def stamped(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer.startswith(b"POST "):
            written.append(time.perf_counter())
        await send(self, buffer, timeout)

    transport._Stream.send = stamped  # type: ignore[method-assign]

    stub = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "openai_stub.py"),
            "--chunks",
            str(a.chunks),
            "--delay-ms",
            str(a.delay_ms),
        ],  # fmt: skip
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stub.stdout is not None and stub.stdin is not None
        url = stub.stdout.readline().strip()
        settings = LoadSettings(
            levels=(LoadLevel(0.0, concurrency=a.streams),), num_prompts=a.requests,
            max_tokens=a.chunks, seed=1000, warmup=1,
        )  # fmt: skip
        prompts = [LoadPrompt(f"p{i}", "k", prompt=f"prompt {i}") for i in range(8)]
        mark: list[float] = []

        def progress(p) -> None:  # the level begins: start the CPU clock there
            if not mark and "warm-up" not in p.description:
                mark.extend((_cpu_s(), time.perf_counter()))

        result = run_load(parse_servers([url], []), prompts, settings, progress=progress)
        cpu, wall = _cpu_s() - mark[0], time.perf_counter() - mark[1]
        stub.stdin.write("durations\n")
        stub.stdin.flush()
        server_s = json.loads(stub.stdout.readline())
    finally:
        stub.terminate()
        stub.wait()

    run = result.runs[0]
    server = {seed: t for seed, t in server_s}  # by seed: the request's index + settings.seed
    ok = [(r, server[settings.seed + r.index]) for r in run.records if r.ok]
    send_ms = np.asarray([(t[0] - r.start_s) * 1000 for r, t in ok])
    recv_ms = np.asarray([(r.end_s - t[1]) * 1000 for r, t in ok])
    added_ms = send_ms + recv_ms
    heads = sorted(written)
    own_ms = np.asarray(
        [(heads[bisect.bisect_left(heads, r.start_s)] - r.start_s) * 1000 for r, _ in ok]
    )
    chunks = sum(len(r.chunk_s) for r in run.records)
    print(f"{a.streams} streams, {a.requests} requests of {a.chunks} chunks {a.delay_ms:g} ms"
          f" apart ({chunks / wall:.0f} chunks/s); {run.summary.n_failed} failed")  # fmt: skip
    level_cpu = run.client_cpu if run.client_cpu is not None else float("nan")
    print(f"client CPU during the level: {100 * level_cpu:.1f}% of one core (bench's own"
          f" client_cpu_percent); from the level's start to run_load's return, its summary"
          f" and teardown included: {100 * cpu / wall:.1f}% over {wall:.1f} s"
          f" ({1e6 * cpu / chunks:.0f} µs per chunk, {1000 * cpu / a.requests:.1f} ms per"
          f" request)")  # fmt: skip
    print(f"added latency per request (client E2EL − server time): mean {added_ms.mean():.2f} ms,"
          f" p99 {np.percentile(added_ms, 99):.2f} ms; of which sending (client start → server"
          f" reads the request) {send_ms.mean():.2f} ms (the client's own part, start → request"
          f" on the socket: {own_ms.mean():.2f} ms), receiving (server writes [DONE] → client"
          f" has parsed it) {recv_ms.mean():.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
