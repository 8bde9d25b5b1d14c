"""The asyncio event loop that `specgen serve` and the load client of `bench --url` run
on: uvloop's (libuv) where it is installed, asyncio's own elsewhere (uvloop has no
Windows build).

Both do some work per socket read and write (a chunk of a stream each), part of it in the
event loop itself, and on a 2-core machine every bit of it is taken from llama.cpp's
threads: uvloop does the loop's part in C (measured: the load client's CPU about a tenth
lower; `specgen serve` at four and eight sampled streams a few percent faster, with
httptools beside it, see README). uvicorn, run inside this loop, finds it there.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on uvloop's loop when uvloop imports (same semantics: a new
    loop, closed at the end; Ctrl-C cancels `main` and raises KeyboardInterrupt)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def blocking(main: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The coroutine function `main` as a plain function (the same parameters and
    docstring) that runs it to completion with `run`."""

    @functools.wraps(main)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return run(main(*args, **kwargs))

    return call
