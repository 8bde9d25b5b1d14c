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
GENERATING = re.compile(rb"(?<![\d.])[1-9]\d* tokens")
"""The live footer counting generated tokens: the prompt is evaluated and rounds are
under way (the footer is drawn, with "0 tokens" and "tok/s", already during the prefill)."""
DEADLINE_S = 300
"""For a wait on a bounded amount of work: never reached when well, however slow the
machine; the assertions are on what was shown, never on how long it took."""


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


def read_until(
    master: int, proc, deadline_s: float, pattern: bytes | re.Pattern[bytes] | None = None
) -> bytes:
    """What the terminal showed until `pattern` (a substring or a regex, searched with the
    escape sequences removed) appeared, the child closed the terminal, or `deadline_s`."""
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
            if pattern is not None and _found(pattern, ANSI.sub(b"", out)):
                break
        elif proc.poll() is not None:
            break
    return out


def _found(pattern: bytes | re.Pattern[bytes], screen: bytes) -> bool:
    if isinstance(pattern, bytes):
        return pattern in screen
    return pattern.search(screen) is not None


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
    raw = read_until(master, proc, DEADLINE_S)
    proc.wait(timeout=60)
    os.close(master)
    screen = ANSI.sub(b"", raw).decode("utf-8", "replace")
    assert proc.returncode == 0, screen
    assert "\x1b[" in raw.decode("utf-8", "replace")  # styled: the view, not plain text
    assert "acceptance" in screen
    assert re.search(r"speedup\s+\d+\.\d+×", screen), screen
    assert re.search(r"finished\s+length", screen), screen  # finish reason in the summary


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
    # tokens on the screen: past the prefill, so there is text to keep; -n 2000 with
    # --ignore-eos keeps the run going long after, at any machine speed
    before = read_until(master, proc, DEADLINE_S, pattern=GENERATING)
    assert GENERATING.search(ANSI.sub(b"", before)), ANSI.sub(b"", before)[-2000:]
    proc.send_signal(signal.SIGINT)
    after = read_until(master, proc, DEADLINE_S)
    proc.wait(timeout=60)
    os.close(master)
    screen = ANSI.sub(b"", before + after).decode("utf-8", "replace")
    assert proc.returncode == 130, screen
    assert "Traceback" not in screen
    assert re.search(r"finished\s+interrupted \(Ctrl-C\)", screen), screen
    kept = re.search(r"tokens\s+(\d+) generated", screen)  # the summary counts the text kept
    assert kept and 0 < int(kept[1]) < 2000, screen
