"""Calls that need a deep native stack, run one at a time on a thread of their own
(`on_deep_stack`).

llguidance compiles a grammar by recursion as deep as its longest chain of rules, about
3 KB of native stack a rule: a chain of 3,000 rules (51 KB of Lark, or a 190 KB JSON
Schema of chained ``$ref``) overflowed a thread's default 8 MiB and the process died of
SIGSEGV, a server with every request in it (2026-12-07). `STACK_BYTES` covers the
deepest grammar llguidance accepts at all: past 65,535 symbols it refuses the grammar (a
chain of 30,000 rules compiled in 128 MiB). The stack is reserved address space; only the
pages a compile touches are used.

One thread, one call at a time: a compile holds the GIL for as long as it runs (seconds
for a long GBNF grammar, whose conversion to Lark is Python), so compiles side by side
would only take turns with each other and take more turns from the server's event loop
and its step loop.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

STACK_BYTES = 512 << 20
"""The compile thread's stack (bytes)."""

_T = TypeVar("_T")
_jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def _serve() -> None:
    while True:
        fn, done = _jobs.get()
        if not done.set_running_or_notify_cancel():
            continue
        try:
            done.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
            done.set_exception(e)


def _start() -> None:
    global _thread
    with _started:
        if _thread is not None and _thread.is_alive():
            return
        # threading.stack_size is the whole process's setting for threads started next:
        # set for this one, then put back
        before = threading.stack_size(STACK_BYTES)
        try:
            _thread = threading.Thread(target=_serve, name="specgen-deep-stack", daemon=True)
            _thread.start()
        finally:
            threading.stack_size(before)


def on_deep_stack(fn: Callable[[], _T]) -> _T:
    """``fn()`` on the deep-stack thread (`STACK_BYTES`), after the calls queued before it;
    its result, or its exception raised here. Called on that thread itself, ``fn`` runs at
    once (a compile inside a compile would otherwise wait for itself).

    Raises:
        whatever ``fn`` raises.
    """
    if threading.current_thread() is _thread:
        return fn()
    _start()
    done: Future[_T] = Future()
    _jobs.put((fn, done))
    return done.result()
