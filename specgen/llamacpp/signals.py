"""Ctrl-C and llama.cpp's log across ctypes callbacks.

An exception must never escape a ctypes callback (Python prints "Exception ignored on calling
ctypes callback function" and the C code carries on), so a Ctrl-C seen inside llama.cpp only
sets `_interrupted`; it is raised as KeyboardInterrupt once the C call has returned
(`_raise_if_interrupted`). llama.cpp's log is kept (its tail explains failures) and printed
only with `--verbose`.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import signal
import threading
from collections.abc import Callable, Iterator

import llama_cpp

_log: Callable[[str], None] | None = None  # where --verbose sends llama.cpp's log lines
_recent_log: collections.deque[str] = collections.deque(maxlen=20)

# Ctrl-C seen while llama.cpp was running: by the SIGINT handler of `_sigint_deferred`, or
# caught inside a ctypes callback. An exception must never escape a ctypes callback: Python
# prints "Exception ignored on calling ctypes callback function" and drops it, and the C
# code carries on as if nothing happened. It is raised as KeyboardInterrupt once the C
# call has returned (`_raise_if_interrupted`).
_interrupted = threading.Event()


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # Keep the tail of llama.cpp's log so a failure can say why; print only when asked.
    try:
        line = text.decode("utf-8", errors="replace")
        _recent_log.append(line)
        if _log is not None:
            _log(line)
    except KeyboardInterrupt:  # Ctrl-C landed here, in C's call stack: deliver it later
        _interrupted.set()
    except Exception:  # noqa: BLE001 - a log line is not worth a crash (stderr closed, ...)
        pass


@llama_cpp.llama_progress_callback
def _progress_callback(progress: float, user_data: ctypes.c_void_p) -> bool:
    # Called between tensors while a model loads; returning False cancels the load, and
    # llama_model_load_from_file then returns NULL.
    try:
        return not _interrupted.is_set()
    except KeyboardInterrupt:
        _interrupted.set()
        return False


@llama_cpp.ggml_abort_callback
def _decode_abort_callback(user_data: ctypes.c_void_p) -> bool:
    # Called by the CPU backend between graph nodes of a decode; True aborts it (code 2).
    try:
        return _interrupted.is_set()
    except KeyboardInterrupt:
        _interrupted.set()
        return True


# Decodes of at least this many tokens (prompt chunks) can be aborted by Ctrl-C. The abort
# callback runs once per graph node (about 400 per pass of the demo target): noise for a
# prompt chunk, but a cost the loop's short decodes (K + 1 tokens) need not pay.
_ABORTABLE_TOKENS = 64

# The ctypes callbacks must stay referenced for the life of the process: llama.cpp keeps
# the raw pointers, and a collected callback crashes at its next call.
_LOG_CALLBACK_REF = _log_callback
_PROGRESS_CALLBACK_REF = _progress_callback
_DECODE_ABORT_REF = _decode_abort_callback
_NO_DECODE_ABORT = llama_cpp.ggml_abort_callback()  # NULL
llama_cpp.llama_log_set(_LOG_CALLBACK_REF, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


def _on_sigint(signum: int, frame: object) -> None:
    _interrupted.set()


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Around a long llama.cpp call (loading a model, creating a context, a prompt chunk):
    Ctrl-C only sets `_interrupted`, which cancels a model load at its next progress
    callback and aborts a decode at its next graph node; the caller raises it with
    `_raise_if_interrupted` once the call has returned and what it made is owned.
    Python's default handler would raise KeyboardInterrupt inside llama.cpp's log callback
    instead, where it is lost. SIGINT is left alone outside the main thread or when someone
    else handles it (an embedding application, or ignored by the parent)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _raise_if_interrupted() -> None:
    """Raise the KeyboardInterrupt that arrived during a llama.cpp call (then forget it)."""
    if _interrupted.is_set():
        _interrupted.clear()
        raise KeyboardInterrupt


def set_verbose(verbose: bool, log: Callable[[str], None]) -> None:
    """Pass llama.cpp's own log lines to ``log`` when ``verbose`` (`--verbose`; the CLI gives
    the sink's stderr writer); silent by default, this module never prints."""
    global _log
    _log = log if verbose else None


def _last_error() -> str:
    lines = [ln.strip() for ln in _recent_log if ln.strip()]
    return lines[-1] if lines else "no detail from llama.cpp (run with --verbose)"
