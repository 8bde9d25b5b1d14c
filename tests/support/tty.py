"""`specgen` on a real pseudo-terminal: start it, read what the terminal shows."""

from __future__ import annotations

import os
import pty
import re
import select
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
