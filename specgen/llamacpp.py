"""The engine adapter: the only module that imports `llama_cpp`.

Uses llama.cpp's C API through llama-cpp-python's low-level bindings: one model, one
context, one sequence (id 0). Logits come back as zero-copy numpy views of llama.cpp's
output buffer, and only for the rows the loop asks for, so nothing grows as
n_ctx x n_vocab (the high-level `Llama(logits_all=True)` would allocate 4.3 GB for
Gemma 3 at n_ctx 4096).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from specgen.engine import Logits, VocabInfo
from specgen.errors import (
    ChatTemplateError,
    ConfigError,
    EngineError,
    ModelFileError,
    ModelLoadError,
    RpcError,
)
from specgen.models.gguf import GGUF_MAGIC, implied_size, read_magic

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


# Lines llama.cpp logs when a file ends before its header says it should.
_TRUNCATION_SIGNS = ("not within the file bounds", "remaining file size", "failed to read")


def _load_failure(path: Path) -> ModelFileError:
    """The error for a NULL from llama_model_load_from_file: llama.cpp's own reason (its
    last line, "failed to load model", says nothing), and for a file that ends early, that
    it is truncated or corrupt, with its size and the size its header implies."""
    lines = [ln.strip() for ln in _recent_log if ln.strip()]
    truncated = next((ln for ln in lines if any(s in ln for s in _TRUNCATION_SIGNS)), None)
    reason = truncated or next((ln for ln in lines if "error loading model:" in ln), _last_error())
    reason = reason.split("error loading model:", 1)[-1].strip()
    try:
        size = path.stat().st_size
    except OSError:
        return ModelFileError(f"llama.cpp could not load {path}: {reason}")
    expected = implied_size(path)
    if expected is not None and expected > size:
        return ModelFileError(
            f"{path} is truncated: {size:,} bytes, its header implies {expected:,}"
            f" (llama.cpp: {reason}): download or build it again"
        )
    if truncated is not None:
        return ModelFileError(
            f"{path} is truncated or corrupt ({size:,} bytes; llama.cpp: {reason}):"
            " download or build it again"
        )
    return ModelFileError(f"llama.cpp could not load {path} ({size:,} bytes): {reason}")


def default_threads() -> int:
    """CPU threads to use when -t is 0: the CPUs this process may run on (also the
    "usable CPUs" of bench's record)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def check_gguf_file(path: Path) -> None:
    """Refuse a path that cannot be a GGUF model before llama.cpp sees it.

    Raises:
        ModelFileError: missing, a directory, unreadable, empty, or without the GGUF magic.
    """
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a GGUF file")
    if not path.is_file():
        raise ModelFileError(f"not a file: {path}")
    try:
        magic = read_magic(path)
    except OSError as e:
        raise ModelFileError(f"cannot read {path}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file (bad magic {magic!r}): {path}")


@dataclass(frozen=True)
class EngineConfig:
    """Settings for one model.

    Attributes:
        n_ctx: context size in tokens (0 = the model's training context).
        n_gpu_layers: layers offloaded to the GPU (-1 or 99 = all, 0 = CPU only).
        n_threads: CPU threads for generation and batch evaluation (0 = llama.cpp default).
        n_batch: maximum tokens per llama_decode call (longer prompts are split).
        local_only: offload only to this machine's devices, never to RPC servers (the
            draft's setting: it must not pay network round trips).
        swa_full: keep every position in the sliding-window layers (llama.cpp's
            `--swa-full`). Off by default: llama.cpp then sizes those layers' cache to the
            window plus one batch (Gemma 3: 512 + n_batch cells instead of n_ctx), and
            `truncate` re-evaluates the context in the rare case a rollback reaches
            positions that cache no longer holds.
    """

    n_ctx: int = 4096
    n_gpu_layers: int = 0
    n_threads: int = 0
    n_batch: int = 512
    local_only: bool = False
    swa_full: bool = False


class LlamaEngine:
    """One GGUF model with a KV cache, implementing `specgen.engine.Engine`.

    `tokens` mirrors the cache: positions 0..len(tokens)-1 are evaluated. `decode_s`
    counts the seconds spent inside `llama_decode` and the `llama_synchronize` after it
    since the engine was created: the evaluation's share of the time (on a GPU backend,
    kernels and the copy of the logits back); everything else is host work.

    Raises (constructor):
        ModelFileError: missing, non-GGUF or truncated file (llama.cpp returns NULL).
        ModelLoadError: the context could not be created (memory, n_ctx).
        KeyboardInterrupt: Ctrl-C while loading: llama.cpp's load is cancelled at its next
            tensor (context creation is waited for), everything made so far is freed.
    """

    def __init__(self, path: Path | str, config: EngineConfig = EngineConfig()) -> None:
        self._model = None
        self._ctx = None
        self._batch = None
        self.path = Path(path)
        self.name = self.path.name
        check_gguf_file(self.path)
        try:
            self._open(config)
        except BaseException:  # Ctrl-C included: free what was made, then pass it on
            self.close()
            raise

    def _open(self, config: EngineConfig) -> None:
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = config.n_gpu_layers if config.n_gpu_layers >= 0 else 999
        mparams.progress_callback = _PROGRESS_CALLBACK_REF
        _recent_log.clear()  # what llama.cpp logs from here explains a failure
        devices, self.devices = _offload_devices(config)
        if devices is not None:  # read during the load only
            mparams.devices = ctypes.cast(devices, ctypes.c_void_p)
        _raise_if_interrupted()  # one caught in a log line since the last check
        with _sigint_deferred():
            model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if model:
            self._model = model
        _raise_if_interrupted()  # the load was cancelled (NULL) or has just finished
        if not model:  # NULL: truncated, corrupt or unsupported
            raise _load_failure(self.path)
        self._vocab = llama_cpp.llama_model_get_vocab(model)

        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = config.n_ctx
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = config.n_batch
        cparams.n_seq_max = 1
        # llama.cpp's default (4 threads) oversubscribes small machines badly: use the
        # CPUs this process may run on unless told otherwise.
        n_threads = config.n_threads if config.n_threads > 0 else default_threads()
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        # Without swa_full, sliding-window layers (Gemma 3) keep n_swa + n_ubatch cells
        # and reuse cells that have left the window; `truncate` checks that a rollback
        # still has the window it needs (see `_window_intact`).
        cparams.swa_full = config.swa_full
        cparams.no_perf = True
        with _sigint_deferred():  # no cancel hook here: Ctrl-C is raised once it returns
            ctx = llama_cpp.llama_init_from_model(model, cparams)
        if ctx:
            self._ctx = ctx
        _raise_if_interrupted()
        if not ctx:
            raise ModelLoadError(
                f"llama.cpp could not create a context for {self.name} (n_ctx={config.n_ctx}):"
                f" {_last_error()}"
            )
        self._mem = llama_cpp.llama_get_memory(ctx)
        # llama.cpp may round n_ctx up and clamps n_batch to it: use what it chose
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        # window of the sliding-window layers in positions, 0 when the model has none
        self.n_swa = int(llama_cpp.llama_model_n_swa(model))
        self.n_reprocessed = 0  # times truncate had to re-evaluate the whole context
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.tokens: list[int] = []
        self.decode_s = 0.0
        v = self._vocab
        self.vocab = VocabInfo(
            vocab_type=int(llama_cpp.llama_vocab_type(v)),
            n_vocab=self.n_vocab,
            bos=int(llama_cpp.llama_vocab_bos(v)),
            eos=int(llama_cpp.llama_vocab_eos(v)),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(v)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(v)),
        )
        self._piece_cache: dict[int, bytes] = {}
        self.n_params = int(llama_cpp.llama_model_n_params(model))  # weights, not bytes

    # -- vocabulary ---------------------------------------------------------------

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        """Tokenize UTF-8 bytes; special-token text (e.g. ``<start_of_turn>``) is parsed."""
        n_max = len(text) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, text, len(text), buf, n_max, add_special, True)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(
                self._vocab, text, len(text), buf, n_max, add_special, True
            )
        if n < 0:
            raise EngineError(f"{self.name}: tokenization failed")
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """Bytes the token renders to in output text; control tokens give b''."""
        piece = self._piece_cache.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            piece = buf.raw[: max(n, 0)]
            self._piece_cache[token] = piece
        return piece

    def token_text(self, token: int) -> str:
        """The vocabulary entry as stored (`llama_vocab_get_text`)."""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def chat_template(self) -> str | None:
        """The GGUF's default chat template (`tokenizer.chat_template`), or None."""
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def is_eog(self, token: int) -> bool:
        """End-of-generation token (EOS, EOT, ...) per `llama_vocab_is_eog`."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # -- evaluation ---------------------------------------------------------------

    def decode(self, tokens: list[int], all_logits: bool = False) -> Logits:
        """Append `tokens` at positions len(self.tokens)... and evaluate them.

        Splits into chunks of n_batch; output rows are requested only for the last
        token, or for every token of the final chunk when `all_logits` (the loop never
        asks for more than K+1 rows, which fit one chunk).

        Returns:
            (n_rows, n_vocab) float32 zero-copy view of llama.cpp's logits buffer:
            valid until the next decode or truncate on this engine.

        Raises:
            EngineError: the tokens do not fit in the context, or llama_decode failed.
            KeyboardInterrupt: Ctrl-C; a chunk of 64 tokens or more is aborted at once and
                dropped from the cache (the caller rolls back to `tokens` either way).
        """
        if self._ctx is None:
            raise EngineError(f"{self.name}: the model is closed")
        if not tokens:
            raise EngineError("decode called with no tokens")
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise EngineError(
                f"{self.name}: {len(self.tokens) + len(tokens)} tokens exceed the context"
                f" of {self.n_ctx}"
            )
        if all_logits and len(tokens) > self.n_batch:
            raise EngineError(f"{self.name}: {len(tokens)} output rows exceed n_batch")
        batch = self._batch
        assert batch is not None  # allocated with the context, freed only by close()
        n_out = 0
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            last_chunk = start + self.n_batch >= len(tokens)
            pos0 = len(self.tokens)
            for i, tok in enumerate(chunk):
                batch.token[i] = tok
                batch.pos[i] = pos0 + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                want = last_chunk and (all_logits or i == len(chunk) - 1)
                batch.logits[i] = 1 if want else 0
            batch.n_tokens = len(chunk)
            t0 = time.perf_counter()
            rc = self._decode_batch(batch, len(chunk))
            if rc == 0:
                # a GPU backend may still be computing: wait here, so the wait is
                # counted as evaluation and not as the host work that reads the logits
                llama_cpp.llama_synchronize(self._ctx)
            self.decode_s += time.perf_counter() - t0
            if rc != 0:
                # A failed or aborted decode may leave part of this chunk in the cache: drop
                # it so the cache matches `tokens` again.
                llama_cpp.llama_memory_seq_rm(self._mem, 0, pos0, -1)
                _raise_if_interrupted()  # code 2: aborted by Ctrl-C
                raise EngineError(f"{self.name}: llama_decode failed (code {rc}): {_last_error()}")
            _raise_if_interrupted()  # caught in a log line: the loop rolls the cache back
            self.tokens.extend(chunk)
            n_out = len(chunk) if all_logits else 1
        return self._logits(n_out)

    def _decode_batch(self, batch: llama_cpp.llama_batch, n_tokens: int) -> int:
        """`llama_decode`; a long batch (a prompt chunk, which can take seconds on a large
        model) is aborted by Ctrl-C through llama.cpp's abort callback (return code 2)."""
        if n_tokens < _ABORTABLE_TOKENS:
            return int(llama_cpp.llama_decode(self._ctx, batch))
        llama_cpp.llama_set_abort_callback(self._ctx, _DECODE_ABORT_REF, None)
        try:
            with _sigint_deferred():
                return int(llama_cpp.llama_decode(self._ctx, batch))
        finally:
            llama_cpp.llama_set_abort_callback(self._ctx, _NO_DECODE_ABORT, None)

    def _logits(self, n_rows: int) -> Logits:
        # Outputs are stored contiguously in batch order (llama.h, llama_get_logits), so
        # row 0's pointer covers all n_rows; checked against llama_get_logits_ith.
        ptr0 = llama_cpp.llama_get_logits_ith(self._ctx, -n_rows)
        if not ptr0:
            raise EngineError(f"{self.name}: llama.cpp returned no logits")
        if n_rows > 1:
            ptr_last = llama_cpp.llama_get_logits_ith(self._ctx, -1)
            step = ctypes.sizeof(ctypes.c_float) * self.n_vocab * (n_rows - 1)
            if ctypes.addressof(ptr_last.contents) - ctypes.addressof(ptr0.contents) != step:
                raise EngineError(f"{self.name}: logits rows are not contiguous")
        return np.ctypeslib.as_array(ptr0, shape=(n_rows, self.n_vocab))

    def truncate(self, n: int) -> None:
        """Roll the cache back to its first n positions (`llama_memory_seq_rm`).

        With a window-sized sliding-window cache, llama.cpp reuses the cells of positions
        that have left the window of the newest position, so a rollback can need cells
        that are gone. The speculative loop does not get there: the target rolls back to
        at least the length it had before its last decode, whose window llama.cpp never
        evicts; the draft rolls back at most K - 1 single-token passes, and its ring of
        n_swa + n_batch cells holds the last ~n_swa + n_batch - K positions (measured:
        1011-1018 for Gemma 3 at K = 8). Deeper rollbacks can: then the context is
        evaluated again from position 0 (llama-server's "forcing full prompt
        re-processing") and `n_reprocessed` counts it.

        Raises:
            EngineError: llama.cpp cannot drop that range (e.g. a recurrent model), the
            cache still holds positions >= n afterwards, or re-evaluating failed.
        """
        if self._ctx is None:  # closed: there is no cache left to keep consistent
            return
        # Always ask llama.cpp, even when `tokens` says there is nothing to drop: after
        # an interrupt the cache may hold a chunk that `tokens` has not recorded yet.
        ok = llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1)
        pos_max = llama_cpp.llama_memory_seq_pos_max(self._mem, 0)
        if not ok or pos_max >= n:
            raise EngineError(
                f"{self.name}: the KV cache cannot roll back to {n} tokens"
                " (recurrent or hybrid models are not supported for speculation)"
            )
        del self.tokens[n:]
        if not self._window_intact():
            kept = self.tokens
            self.tokens = []
            if not llama_cpp.llama_memory_seq_rm(self._mem, 0, -1, -1):
                raise EngineError(f"{self.name}: the KV cache cannot be cleared")
            self.n_reprocessed += 1
            self.decode(kept)

    def _window_intact(self) -> bool:
        """Whether the sliding-window layers hold every position the next one attends to.

        Position m = len(tokens) attends to keys p with m - p < n_swa (llama.cpp's
        `is_masked_swa`, standard type; the chunked type needs fewer), so positions
        max(0, m - n_swa + 1)..m-1 must be cached; llama.cpp keeps each sequence's cached
        positions contiguous (`llama_memory_seq_pos_min` documents it), so the smallest
        one decides.
        """
        m = len(self.tokens)
        if self.n_swa <= 0 or m == 0:
            return True
        pos_min = int(llama_cpp.llama_memory_seq_pos_min(self._mem, 0))
        return 0 <= pos_min <= max(0, m - self.n_swa + 1)

    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> LlamaEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def backend_of(system_info: str) -> str:
    """The GPU backend compiled into llama.cpp, from its system-info line ("CPU" if none)."""
    s = system_info.upper()
    for name, marks in (
        ("CUDA", ("CUDA",)),
        ("Metal", ("METAL", "MTL")),
        ("Vulkan", ("VULKAN",)),
        ("ROCm", ("HIP", "ROCM")),
        ("SYCL", ("SYCL",)),
    ):
        if any(m in s for m in marks):
            return name
    return "CPU"


def backend() -> str:
    """The backend this llama-cpp-python build computes with: CUDA, Metal, ... or CPU."""
    return backend_of(llama_cpp.llama_print_system_info().decode(errors="replace"))


def supports_gpu_offload() -> bool:
    """Whether -ngl / -ngld can do anything in this build (`llama_supports_gpu_offload`)."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> dict[str, str]:
    """llama.cpp build facts for reproducibility records: versions and backends."""
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "gpu_offload": str(bool(llama_cpp.llama_supports_gpu_offload())),
    }


# -- RPC: the one place that touches ggml's backend registry ------------------------------------

# The default wheel is built without the RPC backend (`llama_supports_rpc()` is false).
REBUILD_WITH_RPC = (
    'CMAKE_ARGS="-DGGML_RPC=on" .venv/bin/pip install --force-reinstall --no-cache-dir'
    f" llama-cpp-python=={llama_cpp.__version__}"
)
RPC_PROBE_TIMEOUT_S = 5.0
# ggml-rpc.cpp in llama-cpp-python 0.3.36's llama.cpp: RPC_CMD_HELLO is always 14; the
# request is the client's 24 transport-capability bytes (RPC_CONN_CAPS_SIZE; zeros = plain
# TCP), the answer is major, minor, patch, padding and the server's 24 capability bytes.
# A server is compatible when its major equals ours and its minor is not newer.
_RPC_CMD_HELLO = 14
_RPC_CONN_CAPS_SIZE = 24
_RPC_PROTO_MAJOR, _RPC_PROTO_MINOR = 7, 0

_rpc_endpoints: list[str] = []  # servers registered in this process, in order


@dataclass(frozen=True)
class Device:
    """One ggml backend device (`ggml_backend_dev_get`).

    Attributes:
        name: ggml's name, e.g. ``CPU``, ``CUDA0``, ``RPC0``.
        description: e.g. the CPU model, or ``HOST:PORT`` for an RPC device.
        remote: True for a device that lives on an RPC server.
    """

    name: str
    description: str
    remote: bool


class _Ggml:
    """ctypes declarations of the few ggml-backend functions the bindings do not wrap.

    They are looked up through libllama's handle, which resolves them in the very libggml
    that llama.cpp uses (declared from ggml-backend.h and ggml.h of llama.cpp as vendored in
    llama-cpp-python 0.3.36).
    """

    def __init__(self) -> None:
        lib = llama_cpp.llama_cpp._lib
        p, s, n = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p

        def fn(name: str, restype: object, *argtypes: object) -> Any:
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = list(argtypes)
            return f

        self.reg_by_name = fn("ggml_backend_reg_by_name", p, n)
        self.reg_get_proc_address = fn("ggml_backend_reg_get_proc_address", p, p, n)
        self.reg_name = fn("ggml_backend_reg_name", n, p)
        self.register = fn("ggml_backend_register", None, p)
        self.dev_count = fn("ggml_backend_dev_count", s)
        self.dev_get = fn("ggml_backend_dev_get", p, s)
        self.dev_name = fn("ggml_backend_dev_name", n, p)
        self.dev_description = fn("ggml_backend_dev_description", n, p)
        self.dev_type = fn("ggml_backend_dev_type", ctypes.c_int, p)
        self.dev_backend_reg = fn("ggml_backend_dev_backend_reg", p, p)
        self.set_abort_callback = fn("ggml_set_abort_callback", p, p)
        self.add_server_type = ctypes.CFUNCTYPE(p, n)


_ggml_api: _Ggml | None = None


def _ggml() -> _Ggml:
    global _ggml_api
    if _ggml_api is None:
        _ggml_api = _Ggml()
    return _ggml_api


# ggml_backend_dev_type: CPU, GPU, IGPU, ACCEL, META (ggml-backend.h)
_DEV_TYPE_GPU, _DEV_TYPE_IGPU = 1, 2


def rpc_supported() -> bool:
    """True when this llama-cpp-python was built with llama.cpp's RPC backend."""
    return bool(llama_cpp.llama_supports_rpc())


def parse_rpc_endpoints(spec: str) -> tuple[str, ...]:
    """Split ``--rpc HOST:PORT[,HOST:PORT...]`` into endpoints (llama.cpp's syntax).

    Raises:
        ConfigError: an empty list, an entry without ``:PORT``, or a port outside 1-65535.
            IPv6 literals are refused: ggml splits an endpoint at its first colon.
    """
    endpoints = tuple(e.strip() for e in spec.split(",") if e.strip())
    if not endpoints:
        raise ConfigError("--rpc: give at least one HOST:PORT")
    for e in endpoints:
        host, sep, port = e.partition(":")
        if e.count(":") > 1:
            raise ConfigError(f"--rpc: {e!r}: IPv6 addresses are not supported by ggml's RPC")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--rpc: {e!r} is not HOST:PORT (e.g. 192.168.1.10:50052)")
    return endpoints


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("connection closed")
        data += chunk
    return data


def probe_rpc_server(endpoint: str, timeout_s: float = RPC_PROBE_TIMEOUT_S) -> str:
    """Connect to one ggml-rpc-server and exchange its HELLO, with a timeout.

    ggml's own client aborts the whole process when it cannot connect or the versions
    differ (ggml-rpc.cpp, `rpc_dispatcher::start`), and its connect has no timeout; this
    probe turns those cases into an exception first. The probe disconnects before ggml
    connects: the server serves one client at a time.

    Returns:
        The server's protocol version, ``"major.minor.patch"``.

    Raises:
        RpcError: refused, unreachable, no answer within `timeout_s`, not an RPC server,
            or an incompatible protocol version. The message names the endpoint.
    """
    host, _, port = endpoint.partition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    except TimeoutError as e:
        raise RpcError(
            f"cannot reach RPC server {endpoint}: no answer within {timeout_s:g} s"
        ) from e
    except OSError as e:  # refused, no route, unknown host
        raise RpcError(f"cannot reach RPC server {endpoint}: {e.strerror or e}") from e
    try:
        with sock:
            sock.sendall(
                struct.pack("<BQ", _RPC_CMD_HELLO, _RPC_CONN_CAPS_SIZE) + bytes(_RPC_CONN_CAPS_SIZE)
            )
            (size,) = struct.unpack("<Q", _recv_exactly(sock, 8))
            answer = _recv_exactly(sock, size) if size == 4 + _RPC_CONN_CAPS_SIZE else b""
    except TimeoutError as e:
        raise RpcError(
            f"RPC server {endpoint} did not answer within {timeout_s:g} s (it serves one"
            " client at a time: is another process using it?)"
        ) from e
    except OSError as e:  # reset or closed mid-handshake
        raise RpcError(
            f"RPC server {endpoint} closed the connection during the handshake (not a"
            " ggml-rpc-server, or an incompatible version)"
        ) from e
    if not answer:
        raise RpcError(
            f"RPC server {endpoint} answered with an unknown handshake: build ggml-rpc-server"
            f" from the llama.cpp that llama-cpp-python {llama_cpp.__version__} bundles"
            " (README: Beyond one machine)"
        )
    major, minor, patch = answer[:3]
    if major != _RPC_PROTO_MAJOR or minor > _RPC_PROTO_MINOR:
        raise RpcError(
            f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}; llama-cpp-python"
            f" {llama_cpp.__version__} needs {_RPC_PROTO_MAJOR}.{_RPC_PROTO_MINOR}.x: build"
            " ggml-rpc-server from the same llama.cpp version (README: Beyond one machine)"
        )
    return f"{major}.{minor}.{patch}"


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
def _on_ggml_abort(message: bytes) -> None:
    # ggml calls abort() as soon as this returns, and its RPC client aborts on any lost
    # connection (ggml-rpc.cpp, RPC_STATUS_ASSERT, on its dispatcher thread): no exception
    # can unwind through llama_decode. So say what happened in one line and exit 1 here;
    # the output so far is flushed but declared incomplete, and no result is written.
    text = message.decode("utf-8", errors="replace").strip()
    where = ", ".join(_rpc_endpoints)
    if "RPC" in text or "connect" in text:
        detail = text.split(": ", 1)[-1]  # drop ggml's "file:line: " prefix
        line = (
            f"specgen: error: lost the connection to RPC server {where} ({detail});"
            " generation stopped, the output above is incomplete"
        )
    else:
        line = f"specgen: error: llama.cpp aborted: {text}"
    # the sink flushes generated text at every write, so only the cursor needs restoring
    try:
        if os.isatty(1):  # the live view hides the cursor: give it back
            os.write(1, b"\x1b[?25h\n")
    except OSError:  # exiting anyway
        pass
    os.write(2, (line + "\n").encode())
    os._exit(1)


# Referenced for the life of the process: ggml keeps the raw pointer.
_ABORT_CALLBACK_REF = _on_ggml_abort


def add_rpc_servers(endpoints: tuple[str, ...] | list[str]) -> tuple[Device, ...]:
    """Register RPC servers as ggml devices, before any model loads.

    As llama.cpp's `common/arg.cpp::add_rpc_devices`: `ggml_backend_reg_by_name("RPC")`,
    `ggml_backend_rpc_add_server` through `ggml_backend_reg_get_proc_address`, then
    `ggml_backend_register` for each server's registry. Every server is probed first
    (`probe_rpc_server`). Models loaded afterwards put their -ngl layers on the RPC devices
    first (llama.cpp's default device order), unless `EngineConfig.local_only`.

    From here on a lost connection ends the process with one line on stderr and exit code
    1 (`_on_ggml_abort`): ggml's RPC client cannot report it any other way.

    Returns:
        All devices now registered (local and remote).

    Raises:
        RpcError: no RPC support in this build (the message gives the rebuild command), or
            a server fails its probe or reports no devices.
    """
    if not rpc_supported():
        raise RpcError(
            "--rpc needs llama-cpp-python built with llama.cpp's RPC backend; rebuild it"
            f" with: {REBUILD_WITH_RPC}"
        )
    new = [e for e in endpoints if e not in _rpc_endpoints]
    for endpoint in new:  # not a registered one: ggml holds its only client connection
        probe_rpc_server(endpoint)
    g = _ggml()
    g.set_abort_callback(ctypes.cast(_ABORT_CALLBACK_REF, ctypes.c_void_p))
    rpc_reg = g.reg_by_name(b"RPC")
    address = g.reg_get_proc_address(rpc_reg, b"ggml_backend_rpc_add_server") if rpc_reg else None
    if not address:
        raise RpcError(f"this llama.cpp has no RPC registry; rebuild with: {REBUILD_WITH_RPC}")
    add_server = g.add_server_type(address)
    for endpoint in new:
        _rpc_endpoints.append(endpoint)  # before connecting: an abort names it
        reg = add_server(endpoint.encode())
        if not reg:
            raise RpcError(f"RPC server {endpoint} reports no devices")
        g.register(reg)
    return list_devices()


def list_devices() -> tuple[Device, ...]:
    """Every ggml device registered in this process, in ggml's order."""
    g = _ggml()
    out = []
    for i in range(g.dev_count()):
        dev = g.dev_get(i)
        reg = g.dev_backend_reg(dev)
        out.append(
            Device(
                name=(g.dev_name(dev) or b"").decode(),
                description=(g.dev_description(dev) or b"").decode(),
                remote=bool(reg) and g.reg_name(reg) == b"RPC",
            )
        )
    return tuple(out)


def rpc_endpoints() -> tuple[str, ...]:
    """The RPC servers registered in this process (`add_rpc_servers`), in order."""
    return tuple(_rpc_endpoints)


def _offload_devices(config: EngineConfig) -> tuple[ctypes.Array | None, tuple[str, ...]]:
    """The `llama_model_params.devices` array for `config`, and the names of the devices the
    model may use.

    llama.cpp's default (devices NULL) puts RPC devices first, then GPUs; `local_only`
    passes this machine's GPUs only, so the model never touches the network. The CPU
    always holds what is not offloaded (and the input embeddings).
    """
    g = _ggml()
    gpus: list[int] = []
    remote: list[int] = []
    for i in range(g.dev_count()):
        dev = g.dev_get(i)
        if g.dev_type(dev) not in (_DEV_TYPE_GPU, _DEV_TYPE_IGPU):
            continue
        reg = g.dev_backend_reg(dev)
        (remote if reg and g.reg_name(reg) == b"RPC" else gpus).append(dev)
    chosen = gpus if config.local_only else remote + gpus
    names = tuple((g.dev_name(d) or b"").decode() for d in chosen)
    names = (names if config.n_gpu_layers != 0 else ()) + ("CPU",)
    if not (config.local_only and remote):
        return None, names  # llama.cpp's own choice is the same
    array = (ctypes.c_void_p * (len(gpus) + 1))(*gpus, None)
    return array, names


def compile_chat_template(
    template: str, bos_token: str, eos_token: str
) -> Callable[[Sequence[dict[str, str]]], str]:
    """Compile a Hugging Face-style chat template; returns ``messages -> prompt text``.

    Rendering is llama-cpp-python's `Jinja2ChatFormatter`: Jinja2 in an
    `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the
    `loopcontrols` extension, transformers' `tojson`, and the variables `messages`,
    `bos_token`, `eos_token`, `add_generation_prompt` (always true here),
    `raise_exception` and `strftime_now`, as transformers' `apply_chat_template` renders.

    Args:
        template: the Jinja2 source.
        bos_token, eos_token: the model's BOS and EOS token text (e.g. ``<bos>``).

    Raises:
        ChatTemplateError: the template does not compile (at once) or fails while rendering
            (when the returned function is called; `raise_exception` included); the message
            is one line without the template's source, which the caller adds.
    """
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    try:
        formatter = Jinja2ChatFormatter(template, eos_token=eos_token, bos_token=bos_token)
    except Exception as e:  # jinja2.TemplateSyntaxError and friends: user-supplied code
        raise ChatTemplateError(_template_error(e)) from e

    def render(messages: Sequence[dict[str, str]]) -> str:
        try:
            return formatter(messages=list(messages)).prompt  # type: ignore[arg-type]
        except Exception as e:  # the template's own raise_exception, undefined names, ...
            raise ChatTemplateError(_template_error(e)) from e

    return render


def _template_error(e: Exception) -> str:
    line = getattr(e, "lineno", None)
    msg = " ".join(str(getattr(e, "message", None) or e).split()) or type(e).__name__
    return f"line {line}: {msg}" if line else msg
