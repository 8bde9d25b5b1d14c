"""Where the commands write: Rich consoles on stdout or stderr (the one place they are made)."""

from __future__ import annotations

import sys

from rich.console import Console


def console(*, stderr: bool = False, width: int | None = None, soft_wrap: bool = False) -> Console:
    """A Rich console on stdout, or on stderr for status and progress; ``width=None`` sizes
    it to the terminal."""
    return Console(stderr=stderr, width=width, soft_wrap=soft_wrap)


def notice(message: str) -> None:
    """One line on stderr for something the user should know but that is not an error
    ("specgen: note: ..."), plain so that it reads the same in a terminal and in a log."""
    sys.stderr.write(f"specgen: note: {message}\n")
    sys.stderr.flush()
