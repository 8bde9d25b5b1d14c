"""`specgen serve` on the SmolLM2 pair as a subprocess, and a client for it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent.parent
READY = re.compile(r"^specgen: serving (\S+) at (http://\S+)/v1 ")


def _threads() -> int:
    """2, or fewer when this process may use fewer CPUs (an xdist worker pinned to one by
    tests/conftest.py: two threads spinning on one core slow each other down)."""
    try:
        return min(2, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return 2


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    model_id: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0)

    def metric(self, name: str) -> float:
        # httpx's default 5 s read timeout is a wall-clock bound: on a loaded machine a
        # scrape beside a streaming request can take longer (it failed once so)
        for line in httpx.get(self.url + "/metrics", timeout=120).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"no metric {name}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def start(smol_pair, *flags: str) -> Server:
    target, draft = smol_pair
    cmd = [sys.executable, "-m", "specgen", "serve", "-m", str(target), "-md", str(draft)]
    cmd += ["--port", "0", "-c", "512", "-t", str(_threads()), *flags]  # a later -c wins
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = READY.match(line)
    if m is None:
        proc.kill()
        raise AssertionError(f"no ready line: {line!r} {proc.communicate()[1]}")
    return Server(proc, m.group(2), m.group(1))
