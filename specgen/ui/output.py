"""Where the commands write: Rich consoles on stdout or stderr (the one place they are made)."""

from __future__ import annotations

from rich.console import Console


def console(*, stderr: bool = False, width: int | None = None, soft_wrap: bool = False) -> Console:
    """A Rich console on stdout, or on stderr for status and progress; ``width=None`` sizes
    it to the terminal."""
    return Console(stderr=stderr, width=width, soft_wrap=soft_wrap)
