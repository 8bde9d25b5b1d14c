"""Three of `specgen serve`'s goals that the load sweep does not show, on the demo pair:
- one stream's decode tokens/s against `specgen run` on the same prompt, greedy (serve's
  `timings.predicted_per_second` and run's `stats.tokens_per_s` are both generated tokens
  over decode wall time), alternating run and serve `--reps` times, medians;
- peak memory with --parallel slots against `run` at the same context per slot;
- the loop's host time per step per active slot, read from the server's own /metrics
  (`specgen_host_seconds_per_slot`) while --parallel streams run at temperature 0.8.

    python scripts/serve_footprint.py [--ctx 2048] [--parallel 4] [-n 128] [--reps 3]

Runs one model process at a time. Prints a Markdown table; --json FILE writes the figures.
Peak RSS is the kernel's high-water mark (VmHWM; ru_maxrss for `run`), in MiB.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def specgen(*args: str) -> list[str]:
    return [sys.executable, "-m", "specgen", *args]


def run_once(ctx: int, n: int) -> tuple[float, float]:
    """(peak RSS MiB, decode tokens/s) of one greedy `specgen run --raw` on the demo pair,
    the peak measured by a wrapper process."""
    code = (
        "import resource, subprocess, sys;"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True, check=True);"
        "sys.stdout.write(r.stdout.strip() + chr(10));"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    cmd = specgen("run", "-c", str(ctx), "-n", str(n), "--temp", "0", "--ignore-eos")
    cmd += ["--raw", "--json", PROMPT]
    out = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"specgen run failed: {out.stderr.strip().splitlines()[-1:]}")
    *body, peak = out.stdout.strip().splitlines()
    stats = json.loads("\n".join(body))["stats"]
    return int(peak) / 1024, float(stats["tokens_per_s"])  # ru_maxrss is KiB on Linux


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("specgen serve exited before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit(f"{url} not ready after {timeout_s:.0f} s")


def vm_hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)
    assert m, "no VmHWM in /proc status"
    return int(m.group(1)) / 1024


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def serve_once(ctx: int, parallel: int, n: int, temp: float, load: bool) -> dict[str, float]:
    """Start serve, time one greedy request alone (after one warm-up request); with `load`
    also run `parallel` concurrent requests at `temp` twice and read /metrics and VmHWM."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specgen("serve", "-c", str(ctx), "--parallel", str(parallel), "--port", str(port))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out: dict[str, float] = {}
    try:
        wait_ready(url, proc)
        greedy = {"prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": True}
        for _ in range(2):
            r = httpx.post(f"{url}/v1/completions", json=greedy, timeout=600)
            r.raise_for_status()
        out["alone_tokens_per_s"] = float(r.json()["timings"]["predicted_per_second"])
        if load:
            body = {**greedy, "temperature": temp}
            with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
                before = httpx.get(f"{url}/metrics", timeout=10).text
                for _ in range(2):
                    futures = [
                        pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=600)
                        for _ in range(parallel)
                    ]
                    for f in futures:
                        f.result().raise_for_status()
            after = httpx.get(f"{url}/metrics", timeout=10).text
            count = delta(before, after, "specgen_host_seconds_per_slot_count")
            total = delta(before, after, "specgen_host_seconds_per_slot_sum")
            out["host_ms_per_step_per_slot"] = 1000 * total / count if count else float("nan")
            out["steps"] = count
            out["peak_rss_mib"] = vm_hwm_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return out


def delta(before: str, after: str, name: str) -> float:
    return metric(after, name) - metric(before, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot (-c)")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("-n", type=int, default=128, help="tokens per request")
    ap.add_argument("--temp", type=float, default=0.8, help="temperature of the load")
    ap.add_argument("--reps", type=int, default=3, help="alternations of run and serve")
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args()
    runs, serves = [], []
    for rep in range(a.reps):
        runs.append(run_once(a.ctx, a.n))
        serves.append(serve_once(a.ctx, a.parallel, a.n, a.temp, load=rep == a.reps - 1))
        print(
            f"rep {rep + 1}: run {runs[-1][1]:.1f} tok/s, serve alone"
            f" {serves[-1]['alone_tokens_per_s']:.1f} tok/s",
            file=sys.stderr,
        )
    run_tps = statistics.median(r[1] for r in runs)
    serve_tps = statistics.median(s["alone_tokens_per_s"] for s in serves)
    run_mib = max(r[0] for r in runs)
    last = serves[-1]
    ratio = last["peak_rss_mib"] / run_mib
    print("| what | value | goal |\n|---|---:|---:|")
    print(
        f"| one stream, greedy, decode tokens/s: serve / run (medians of {a.reps}) |"
        f" {serve_tps:.1f} / {run_tps:.1f} = {serve_tps / run_tps:.2f}× | ≥ 0.95× |"
    )
    print(f"| peak RSS, `specgen run -c {a.ctx}` | {run_mib:.0f} MiB | |")
    print(
        f"| peak RSS, `specgen serve -c {a.ctx} --parallel {a.parallel}` |"
        f" {last['peak_rss_mib']:.0f} MiB ({ratio:.2f}×) | ≤ 1.3× |"
    )
    print(
        f"| host time per step per active slot, temp {a.temp:g}, {a.parallel} streams |"
        f" {last['host_ms_per_step_per_slot']:.2f} ms (mean of {last['steps']:.0f} steps)"
        " | ≤ 3 ms |"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"run": runs, "serve": serves, "args": vars(a)}, f, indent=2)


if __name__ == "__main__":
    main()
