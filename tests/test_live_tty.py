"""`specgen run` on a real pseudo-terminal: the live view appears, its footer shows
acceptance and a measured speedup, Ctrl-C (SIGINT) keeps the text and exits 130, and
SIGTERM leaves the terminal as it found it."""

from __future__ import annotations

import os
import re
import signal

from support.tty import ANSI, DEADLINE_S, GENERATING, read_until, spawn


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


def test_sigterm_shows_the_cursor_again_and_exits_143(demo_pair):
    """`kill` or `timeout` during the live view: the cursor the view hid is shown again
    (the default action killed the process with it hidden, the shell's prompt then without
    a cursor), no traceback, 128 + SIGTERM."""
    t, d = demo_pair
    proc, master = spawn(
        ["run", "-m", str(t), "-md", str(d), "-n", "2000", "--temp", "0", "--ignore-eos",
         "-c", "4096", "Write a very long story about a dragon."]
    )  # fmt: skip
    before = read_until(master, proc, DEADLINE_S, pattern=GENERATING)
    assert b"\x1b[?25l" in before, ANSI.sub(b"", before)[-2000:]  # the view hid the cursor
    proc.send_signal(signal.SIGTERM)
    raw = before + read_until(master, proc, DEADLINE_S)
    proc.wait(timeout=60)
    os.close(master)
    screen = ANSI.sub(b"", raw).decode("utf-8", "replace")
    assert proc.returncode == 143, screen
    assert "Traceback" not in screen
    assert raw.rfind(b"\x1b[?25h") > raw.rfind(b"\x1b[?25l"), screen[-2000:]


def test_a_dumb_terminal_gets_the_plain_text_not_the_view(demo_pair):
    """TERM=dumb (Emacs' shell) moves no cursor and draws no style: the text as a pipe gets
    it, without the view's legend (which named bold it never drew)."""
    t, d = demo_pair
    proc, master = spawn(
        ["run", "-m", str(t), "-md", str(d), "-n", "8", "--temp", "0", "--ignore-eos", "Hi"],
        env={"TERM": "dumb"},
    )
    raw = read_until(master, proc, DEADLINE_S)
    proc.wait(timeout=60)
    os.close(master)
    screen = raw.decode("utf-8", "replace")
    assert proc.returncode == 0, screen
    assert "accepted draft" not in screen and "bold" not in screen, screen
