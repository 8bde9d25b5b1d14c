"""The one sink: everything specgen shows goes through here (tests/test_layout.py checks that
nothing else touches sys.stdout, sys.stderr, print or a Rich Console).

stdout carries the command's result: generated text as UTF-8 bytes (byte-exact in a pipe,
whatever the console's encoding), one JSON object per line, plain lines, Rich tables, and the
live view's console. stderr carries the rest: status, spinners, progress bars, notes and
warnings, the one-line error, a traceback under SPECGEN_DEBUG, and llama.cpp's own log
(--verbose).

The streams are looked up at each call, never bound at import, so a redirected ``sys.stdout``
(pytest's capsys, a caller's) sees everything.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType

if TYPE_CHECKING:
    from rich.status import Status


#: columns of a console whose stream is not a terminal: a file or a pipe has no edge, so
#: tables get the width they need and text is never wrapped or cropped (Rich's default of
#: 80 columns cut a `specgen models > file` table into 7-character pieces, issue 22)
UNWRAPPED_WIDTH = 10_000


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader went away (`| head`): raised for the command line's one handler
        (`specgen.cli.app`), which ends quietly; Rich's own exits with status 1."""
        raise BrokenPipeError


def console(*, stderr: bool = False, width: int | None = None, soft_wrap: bool = False) -> Console:
    """A Rich console on stdout, or on stderr for status and progress.

    Args:
        stderr: write to stderr instead of stdout.
        width: columns; ``None`` sizes it to the terminal, and when the stream is not a
            terminal (a file, a pipe) makes it unwrapped: tables take their natural width
            and lines are never wrapped or cropped.
        soft_wrap: let long lines run on instead of wrapping them.
    """
    c = _Console(stderr=stderr, width=width, soft_wrap=soft_wrap)
    if width is None and not c.is_terminal:
        c = _Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True)
    return c


# -- stdout ------------------------------------------------------------------------------------


def stdout_is_terminal() -> bool:
    """True when stdout is a terminal."""
    return sys.stdout.isatty()


def stdout_redraws() -> bool:
    """True when stdout is a terminal that can move its cursor (the live view's condition):
    not ``TERM=dumb`` (Emacs' shell, some CI logs), where the view could draw no styles
    and its legend named bold it never drew (Rich's own test, `Console.is_dumb_terminal`)."""
    return stdout_is_terminal() and os.environ.get("TERM", "").lower() not in ("dumb", "unknown")


def write_text(text: str) -> None:
    """Generated text on stdout as UTF-8 bytes, flushed at once so a pipe streams.

    Raises:
        BrokenPipeError: the reader went away (see ``discard_stdout``).
    """
    out = sys.stdout.buffer
    out.write(text.encode("utf-8"))
    out.flush()


def discard_stdout() -> None:
    """Point stdout's file descriptor at /dev/null: after the reader of a pipe went away
    (`| head`), the interpreter's final flush then has nowhere to complain."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def write_line(line: str) -> None:
    """One plain line on stdout (tab-separated listings)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def write_json(obj: Any) -> None:
    """``obj`` as one JSON line on stdout (UTF-8 kept as is)."""
    write_line(json.dumps(obj, ensure_ascii=False))


def show(*renderables: RenderableType, soft_wrap: bool = False, highlight: bool = True) -> None:
    """Rich renderables (tables, text) on stdout, one after the other (unwrapped when
    stdout is not a terminal, see ``console``)."""
    c = console(soft_wrap=soft_wrap)
    for r in renderables:
        c.print(r, highlight=highlight)


# -- stderr ------------------------------------------------------------------------------------


def err_console() -> Console:
    """The stderr console that spinners and progress bars draw on."""
    return console(stderr=True)


@contextmanager
def spinner(message: str) -> Iterator[Status]:
    """A spinner on stderr while the block runs; ``.update(msg)`` changes its message."""
    with err_console().status(message) as status:
        yield status


def note(*renderables: RenderableType, style: str | None = None) -> None:
    """Notes, warnings and the record on stderr (Rich markup allowed, no highlighting)."""
    c = err_console()
    for r in renderables:
        c.print(r, style=style, highlight=False)


def status_line(message: str) -> None:
    """One status line on stderr, printed as written (no markup)."""
    err_console().print(message, highlight=False, markup=False)


def notice(message: str) -> None:
    """One line on stderr for something the user should know but that is not an error
    ("specgen: note: ..."), plain so that it reads the same in a terminal and in a log."""
    sys.stderr.write(f"specgen: note: {message}\n")
    sys.stderr.flush()


def warning(message: str) -> None:
    """One plain line on stderr: ``specgen: warning: MESSAGE``."""
    sys.stderr.write(f"specgen: warning: {message}\n")
    sys.stderr.flush()


def error(message: str) -> None:
    """The one-line error: ``specgen: error: MESSAGE`` on stderr."""
    sys.stderr.write(f"specgen: error: {message}\n")
    sys.stderr.flush()


def debug_traceback() -> None:
    """The traceback of the exception being handled, on stderr (SPECGEN_DEBUG)."""
    traceback.print_exc(file=sys.stderr)


def log(text: str) -> None:
    """Raw text on stderr, as it comes (llama.cpp's log lines under --verbose)."""
    sys.stderr.write(text)
    sys.stderr.flush()
