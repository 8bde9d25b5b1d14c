"""`specgen run` on a real pseudo-terminal: the live view appears, its footer shows
acceptance and a measured speedup, and Ctrl-C (SIGINT) keeps the text and exits 130."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def spawn(args: list[str], env: dict | None = None):
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgen", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={
            **os.environ,
            "COLUMNS": "100",
            "LINES": "30",
            "TERM": "xterm-256color",
            **(env or {}),
        },
        close_fds=True,
    )
    os.close(slave)
    return proc, master


def read_until(master: int, proc, deadline_s: float, pattern: bytes | None = None) -> bytes:
    out = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if pattern is not None and pattern in ANSI.sub(b"", out):
                break
        elif proc.poll() is not None:
            break
    return out


def test_live_view_then_summary(demo_pair):
    t, d = demo_pair
    proc, master = spawn(
        [
            "run",
            "-m",
            str(t),
            "-md",
            str(d),
            "-n",
            "48",
            "--temp",
            "0",
            "--ignore-eos",
            "--draft-max",
            "4",
            "The three most important ideas in computer science are",
        ]
    )
    raw = read_until(master, proc, 240)
    proc.wait(timeout=60)
    os.close(master)
    screen = ANSI.sub(b"", raw).decode("utf-8", "replace")
    assert proc.returncode == 0, screen
    assert "\x1b[" in raw.decode("utf-8", "replace")  # styled: the view, not plain text
    assert "acceptance" in screen
    assert re.search(r"speedup\s+\d+\.\d+×", screen), screen
    assert "length" in screen  # finish reason in the summary


def test_sigint_keeps_the_text_and_exits_130(demo_pair):
    t, d = demo_pair
    proc, master = spawn(
        [
            "run",
            "-m",
            str(t),
            "-md",
            str(d),
            "-n",
            "2000",
            "--temp",
            "0",
            "--ignore-eos",
            "-c",
            "4096",
            "Write a very long story about a dragon.",
        ]
    )
    # wait until generation is visibly under way (the footer shows tok/s)
    before = read_until(master, proc, 240, pattern=b"tok/s")
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    after = read_until(master, proc, 60)
    proc.wait(timeout=60)
    os.close(master)
    screen = ANSI.sub(b"", before + after).decode("utf-8", "replace")
    assert proc.returncode == 130, screen
    assert "Traceback" not in screen
    assert "interrupted" in screen
    assert "dragon" in screen or len(screen) > 200
