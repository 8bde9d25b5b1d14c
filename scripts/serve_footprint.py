"""Two of `specgen serve`'s goals that the load sweep does not show: peak memory with
--parallel slots against `specgen run` on the same pair and context per slot, and the
loop's host time per step per active slot, read from the server's own /metrics
(`specgen_host_seconds_per_slot`) while N streams run at temperature 0.8.

    python scripts/serve_footprint.py [--ctx 2048] [--parallel 4] [-n 128] [--temp 0.8]

Runs one model process at a time. Prints a Markdown table; --json FILE writes the figures.
Peak RSS is the kernel's high-water mark (VmHWM; ru_maxrss for `run`), in MiB.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def specgen(*args: str) -> list[str]:
    return [sys.executable, "-m", "specgen", *args]


def run_peak_mib(ctx: int, n: int, temp: float) -> float:
    """Peak RSS of `specgen run` on the demo pair, measured by a wrapper process."""
    code = (
        "import resource, subprocess, sys;"
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    cmd = specgen("run", "-c", str(ctx), "-n", str(n), "--temp", str(temp), PROMPT)
    out = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"specgen run failed: {out.stderr.strip().splitlines()[-1:]}")
    return int(out.stdout.split()[-1]) / 1024  # ru_maxrss is KiB on Linux


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


def serve_figures(ctx: int, parallel: int, n: int, temp: float) -> dict[str, float]:
    """Start serve, run `parallel` concurrent requests twice, read /metrics and VmHWM."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = specgen("serve", "-c", str(ctx), "--parallel", str(parallel), "--port", str(port))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        body = {
            "prompt": PROMPT,
            "max_tokens": n,
            "temperature": temp,
            "ignore_eos": True,
        }
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            for _ in range(2):
                futures = [
                    pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=600)
                    for _ in range(parallel)
                ]
                for f in futures:
                    f.result().raise_for_status()
        text = httpx.get(f"{url}/metrics", timeout=10).text
        peak = vm_hwm_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    count = metric(text, "specgen_host_seconds_per_slot_count")
    total = metric(text, "specgen_host_seconds_per_slot_sum")
    steps = metric(text, "specgen_steps_total")
    return {
        "peak_rss_mib": peak,
        "host_ms_per_step_per_slot": 1000 * total / count if count else float("nan"),
        "steps": steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot (-c)")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("-n", type=int, default=128, help="tokens per request")
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_mib = run_peak_mib(a.ctx, a.n, a.temp)
    serve = serve_figures(a.ctx, a.parallel, a.n, a.temp)
    ratio = serve["peak_rss_mib"] / run_mib
    print("| what | value | goal |\n|---|---:|---:|")
    print(f"| peak RSS, `specgen run -c {a.ctx}` | {run_mib:.0f} MiB | |")
    print(
        f"| peak RSS, `specgen serve -c {a.ctx} --parallel {a.parallel}` |"
        f" {serve['peak_rss_mib']:.0f} MiB ({ratio:.2f}×) | ≤ 1.3× |"
    )
    print(
        f"| host time per step per active slot, temp {a.temp:g}, {a.parallel} streams |"
        f" {serve['host_ms_per_step_per_slot']:.2f} ms (mean of {serve['steps']:.0f} steps)"
        " | ≤ 3 ms |"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"run_peak_rss_mib": run_mib, **serve, "args": vars(a)}, f, indent=2)


if __name__ == "__main__":
    main()
