"""The asyncio event loop that `specgen serve` and the load client of `bench --url` run
on: uvloop's (libuv) where it is installed, asyncio's own elsewhere (uvloop has no
Windows build).

Both spend their own CPU mostly in the loop's work per socket read and write (a chunk of
a stream each), and on a 2-core machine every bit of it is taken from llama.cpp's
threads: uvloop does that work in C. uvicorn, run inside this loop, finds it there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on uvloop's loop when uvloop imports (same semantics: a new
    loop, closed at the end; Ctrl-C cancels `main` and raises KeyboardInterrupt)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
