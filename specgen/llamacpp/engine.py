"""The engine adapter: one GGUF model, one context, implementing `specgen.engine.Engine`.

Uses llama.cpp's C API through llama-cpp-python's low-level bindings: one model, one
context, one sequence (id 0) by default, or N sequences in one unified cache for the
server (`EngineConfig.n_seq_max`, `LlamaEngine.sequence`, `LlamaEngine.decode_batch`).
Logits come back as zero-copy numpy views of llama.cpp's output buffer, and only for the
rows the loop asks for, so nothing grows as n_ctx x n_vocab (the high-level
`Llama(logits_all=True)` would allocate 4.3 GB for Gemma 3 at n_ctx 4096).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from specgen.engine import Logits, SeqDecode, VocabInfo
from specgen.errors import EngineError, ModelLoadError
from specgen.fileio import check_model_path
from specgen.llamacpp.devices import offload_devices
from specgen.llamacpp.loading import (
    EngineConfig,
    default_threads,
    extra_buffers_safe,
    load_failure,
)
from specgen.llamacpp.sequence import SequenceView
from specgen.llamacpp.signals import (
    _ABORTABLE_TOKENS,
    _DECODE_ABORT_REF,
    _NO_DECODE_ABORT,
    _PROGRESS_CALLBACK_REF,
    _last_error,
    _raise_if_interrupted,
    _recent_log,
    _sigint_deferred,
)
from specgen.llamacpp.vocab import VocabularyMixin

_CTX_PAD = 256
"""llama.cpp pads a context to a multiple of this many cells (`llama_context`'s constructor)."""

#: llama.cpp's ``-fa`` values (`EngineConfig.flash_attn`)
_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


class LlamaEngine(VocabularyMixin):
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
        check_model_path(self.path)
        try:
            self._open(config)
        except BaseException:  # Ctrl-C included: free what was made, then pass it on
            self.close()
            raise

    def _open(self, config: EngineConfig) -> None:
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = config.n_gpu_layers if config.n_gpu_layers >= 0 else 999
        mparams.progress_callback = _PROGRESS_CALLBACK_REF
        mparams.use_extra_bufts = extra_buffers_safe()
        _recent_log.clear()  # what llama.cpp logs from here explains a failure
        devices, self.devices = offload_devices(config.n_gpu_layers, config.local_only)
        if devices is not None:  # read during the load only
            mparams.devices = ctypes.cast(devices, ctypes.c_void_p)
        _raise_if_interrupted()  # one caught in a log line since the last check
        with _sigint_deferred():
            model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if model:
            self._model = model
        _raise_if_interrupted()  # the load was cancelled (NULL) or has just finished
        if not model:  # NULL: truncated, corrupt or unsupported
            raise load_failure(self.path)
        self._vocab = llama_cpp.llama_model_get_vocab(model)

        cparams = llama_cpp.llama_context_default_params()
        n_seq = max(1, config.n_seq_max)
        # llama.cpp clamps n_batch to the n_ctx asked, then pads n_ctx to a multiple of
        # 256: padded here first, so that -c 16 gets a batch that holds a block (a 16-row
        # batch in a 256-cell context failed at the first block of K = 16)
        cparams.n_ctx = -(-config.n_ctx // _CTX_PAD) * _CTX_PAD if config.n_ctx > 0 else 0
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = config.n_batch
        cparams.n_seq_max = n_seq
        # One buffer for all sequences: a sequence may use any free cell, so the cache
        # splits by what each slot holds, not in N fixed parts.
        cparams.kv_unified = n_seq > 1
        # llama.cpp's default (4 threads) oversubscribes small machines badly: use the
        # CPUs this process may run on unless told otherwise.
        n_threads = config.n_threads if config.n_threads > 0 else default_threads()
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        # Without swa_full, sliding-window layers (Gemma 3) keep n_swa + n_ubatch cells
        # and reuse cells that have left the window; `truncate` checks that a rollback
        # still has the window it needs (see `_window_intact`).
        cparams.swa_full = config.swa_full
        cparams.flash_attn_type = _FLASH_ATTN[config.flash_attn]
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
        self.n_seq = n_seq
        self.n_ctx_total = int(llama_cpp.llama_n_ctx(ctx))
        # each sequence's share: N of them always fit the unified cache together
        self.n_ctx = self.n_ctx_total // n_seq
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        # window of the sliding-window layers in positions, 0 when the model has none
        self.n_swa = int(llama_cpp.llama_model_n_swa(model))
        self.n_reprocessed = 0  # times truncate had to re-evaluate the whole context
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, n_seq)
        # what each sequence's cells hold, in position order (sequence 0 is `tokens`)
        self._seqs: list[list[int]] = [[] for _ in range(n_seq)]
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
        self._views = [SequenceView(self, i) for i in range(n_seq)]  # with the vocabulary
        self.n_params = int(llama_cpp.llama_model_n_params(model))  # weights, not bytes

    @property
    def tokens(self) -> list[int]:
        """Sequence 0's cached tokens (the single-stream engine's whole cache)."""
        return self._seqs[0]

    @tokens.setter
    def tokens(self, value: list[int]) -> None:
        self._seqs[0] = value

    def sequence(self, seq: int) -> SequenceView:
        """Sequence `seq`'s view: an `Engine` whose decode and truncate touch only that
        sequence's cells (the same object for each call).

        Raises:
            EngineError: seq is not in 0..n_seq-1.
        """
        if not 0 <= seq < self.n_seq:
            raise EngineError(f"{self.name}: sequence {seq} is not in 0..{self.n_seq - 1}")
        return self._views[seq]

    # -- evaluation ---------------------------------------------------------------

    def decode(
        self, tokens: list[int], all_logits: bool = False, rows: Sequence[int] | None = None
    ) -> Logits:
        """Append `tokens` to sequence 0 at positions len(self.tokens)... and evaluate them.

        Splits into chunks of n_batch; output rows are requested only for the last
        token, or for every token of the final chunk when `all_logits`, or for the indices
        `rows` (which must all fall in the final chunk; the loop never asks for more than
        K+1 rows, which fit one chunk). A token without a row skips the output layer
        (on the demo target, its 262,144 x 640 head: several ms a row on a CPU).

        Returns:
            (n_rows, n_vocab) float32 zero-copy view of llama.cpp's logits buffer:
            valid until the next decode or truncate on this engine.

        Raises:
            EngineError: the tokens do not fit in the context, or llama_decode failed.
            KeyboardInterrupt: Ctrl-C; a chunk of 64 tokens or more is aborted at once and
                dropped from the cache (the caller rolls back to `tokens` either way).
        """
        return self._decode_seq(0, tokens, all_logits, rows)

    def _decode_seq(
        self, seq: int, tokens: list[int], all_logits: bool, rows: Sequence[int] | None = None
    ) -> Logits:
        """`decode` for sequence `seq` (see there)."""
        self._check_open()
        if not tokens:
            raise EngineError("decode called with no tokens")
        held = len(self._seqs[seq])
        if held + len(tokens) > self.n_ctx:
            raise EngineError(
                f"{self.name}: {held + len(tokens)} tokens exceed the context of {self.n_ctx}"
            )
        if all_logits and rows is None and len(tokens) > self.n_batch:
            raise EngineError(f"{self.name}: {len(tokens)} output rows exceed n_batch")
        last0 = (len(tokens) - 1) // self.n_batch * self.n_batch  # the final chunk's start
        if rows is not None and any(not last0 <= r < len(tokens) for r in rows):
            raise EngineError(f"{self.name}: rows {list(rows)} not in the final batch")
        n_out = 0
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            if start != last0:
                flags: Sequence[int] = ()
            elif rows is not None:
                flags = [r - start for r in rows]
            else:
                flags = range(len(chunk)) if all_logits else (len(chunk) - 1,)
            n_out = self._eval([(seq, chunk, flags)])
        if n_out == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        return self._logits(n_out)

    def decode_batch(self, parts: list[SeqDecode], copy: bool = True) -> list[Logits]:
        """Evaluate several sequences' tokens in ONE llama_decode (the server's step: every
        slot's block to score and the prompt chunks of slots being prefilled).

        Each part's tokens continue its own sequence's positions; output rows are asked
        only for each part's last n_rows tokens (or its `SeqDecode.rows`), so a prompt
        chunk costs no logits row.

        Returns:
            per part, in order, (n_rows, n_vocab) float32: row i scores the token after
            tokens[len - n_rows + i]. Slices of one copy of llama.cpp's buffer, so they
            stay valid after the next decode (which overwrites that buffer); with
            `copy=False`, slices of the buffer itself (1 MB a row less to copy with a
            262,144-token vocabulary), valid only until this context's next decode.

        Raises:
            EngineError: no parts, a sequence twice or out of range, more than n_batch
                tokens in all, a sequence past its context, or llama_decode failed (no
                sequence keeps any of its new tokens then).
        """
        self._check_open()
        seqs = [p.seq for p in parts]
        if not parts or len(set(seqs)) != len(seqs):
            raise EngineError(f"{self.name}: a batch needs distinct sequences, got {seqs}")
        total = 0
        for p in parts:
            if (
                not 0 <= p.seq < self.n_seq
                or not p.tokens
                or not 0 <= p.n_rows <= len(p.tokens)
                or (p.rows is not None and not _ascending_within(p.rows, len(p.tokens), p.n_rows))
            ):
                raise EngineError(
                    f"{self.name}: bad batch part (sequence {p.seq}, {len(p.tokens)} tokens,"
                    f" {p.n_rows} rows)"
                )
            held = len(self._seqs[p.seq]) + len(p.tokens)
            if held > self.n_ctx:
                raise EngineError(
                    f"{self.name}: sequence {p.seq}: {held} tokens exceed its context of"
                    f" {self.n_ctx}"
                )
            total += len(p.tokens)
        if total > self.n_batch:
            raise EngineError(f"{self.name}: {total} tokens exceed one batch of {self.n_batch}")
        n_out = self._eval([(p.seq, p.tokens, p.wanted()) for p in parts])
        if n_out:
            rows = self._logits(n_out)
            if copy:  # the next decode overwrites the buffer
                rows = np.array(rows)
        else:
            rows = np.zeros((0, self.n_vocab), dtype=np.float32)
        out: list[Logits] = []
        at = 0
        for p in parts:
            out.append(rows[at : at + p.n_rows])
            at += p.n_rows
        return out

    def _eval(self, parts: list[tuple[int, list[int], Sequence[int]]]) -> int:
        """One llama_decode of (sequence, tokens, indices of the tokens that get a row,
        ascending) parts; on success each sequence's `tokens` are extended. Returns the
        output rows.

        Raises:
            EngineError: llama_decode failed; every part's new cells are dropped first.
            KeyboardInterrupt: Ctrl-C (see `decode`).
        """
        batch = self._batch
        assert batch is not None  # allocated with the context, freed only by close()
        i = n_out = 0
        for seq, chunk, wanted in parts:
            pos0 = len(self._seqs[seq])
            for j, tok in enumerate(chunk):
                batch.token[i + j] = tok
                batch.pos[i + j] = pos0 + j
                batch.n_seq_id[i + j] = 1
                batch.seq_id[i + j][0] = seq
                batch.logits[i + j] = 0
            for j in wanted:
                batch.logits[i + j] = 1
            i += len(chunk)
            n_out += len(wanted)
        batch.n_tokens = i
        t0 = time.perf_counter()
        rc = self._decode_batch(batch, i)
        if rc == 0:
            # a GPU backend may still be computing: wait here, so the wait is
            # counted as evaluation and not as the host work that reads the logits
            llama_cpp.llama_synchronize(self._ctx)
        self.decode_s += time.perf_counter() - t0
        if rc != 0:
            # A failed or aborted decode may leave part of this batch in the cache: drop
            # it so every sequence's cache matches its `tokens` again.
            for seq, _, _ in parts:
                llama_cpp.llama_memory_seq_rm(self._mem, seq, len(self._seqs[seq]), -1)
            _raise_if_interrupted()  # code 2: aborted by Ctrl-C
            raise EngineError(f"{self.name}: llama_decode failed (code {rc}): {_last_error()}")
        _raise_if_interrupted()  # caught in a log line: the loop rolls the cache back
        for seq, chunk, _ in parts:
            self._seqs[seq].extend(chunk)
        return n_out

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
        self._truncate_seq(0, n)

    def _truncate_seq(self, seq: int, n: int) -> None:
        """`truncate` for sequence `seq`: only its cells are dropped (see there)."""
        if self._ctx is None:  # closed: there is no cache left to keep consistent
            return
        # Always ask llama.cpp, even when `tokens` says there is nothing to drop: after
        # an interrupt the cache may hold a chunk that `tokens` has not recorded yet.
        ok = llama_cpp.llama_memory_seq_rm(self._mem, seq, n, -1)
        pos_max = llama_cpp.llama_memory_seq_pos_max(self._mem, seq)
        if not ok or pos_max >= n:
            raise EngineError(
                f"{self.name}: the KV cache cannot roll back to {n} tokens"
                " (recurrent or hybrid models are not supported for speculation)"
            )
        del self._seqs[seq][n:]
        if not self._window_intact(seq):
            kept = self._seqs[seq]
            self._seqs[seq] = []
            if not llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1):
                raise EngineError(f"{self.name}: the KV cache cannot be cleared")
            self.n_reprocessed += 1
            self._decode_seq(seq, kept, False)

    def _copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make sequence `dst` hold the first n positions of sequence `src`, sharing
        their cells (`llama_memory_seq_cp(mem, src, dst, 0, n)`: with a unified cache the
        cells are tagged with both sequence ids, nothing is copied or evaluated again), so
        several choices of one request pay one prefill. `dst` is cleared first.

        Raises:
            EngineError: `src` holds fewer than n positions, or the copy did not give
                `dst` exactly n positions.
        """
        self._check_open()
        if len(self._seqs[src]) < n:
            raise EngineError(
                f"{self.name}: sequence {src} holds {len(self._seqs[src])} positions, not {n}"
            )
        self._truncate_seq(dst, 0)
        if n == 0:
            return
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, 0, n)
        if int(llama_cpp.llama_memory_seq_pos_max(self._mem, dst)) != n - 1:
            raise EngineError(f"{self.name}: the KV cache could not share {n} positions")
        self._seqs[dst] = list(self._seqs[src][:n])

    def _window_intact(self, seq: int = 0) -> bool:
        """Whether the sliding-window layers hold every position the next one attends to.

        Position m = len(tokens) attends to keys p with m - p < n_swa (llama.cpp's
        `is_masked_swa`, standard type; the chunked type needs fewer), so positions
        max(0, m - n_swa + 1)..m-1 must be cached; llama.cpp keeps each sequence's cached
        positions contiguous (`llama_memory_seq_pos_min` documents it), so the smallest
        one decides.
        """
        m = len(self._seqs[seq])
        if self.n_swa <= 0 or m == 0:
            return True
        self._check_open()
        pos_min = int(llama_cpp.llama_memory_seq_pos_min(self._mem, seq))
        return 0 <= pos_min <= max(0, m - self.n_swa + 1)

    def close(self) -> None:
        """Free the batch, context and model (idempotent); then every call that reaches
        llama.cpp raises EngineError ("the model is closed")."""
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


def _ascending_within(rows: tuple[int, ...], n_tokens: int, n_rows: int) -> bool:
    """Whether `rows` are n_rows distinct ascending indices into n_tokens tokens."""
    return (
        len(rows) == n_rows
        and all(0 <= r < n_tokens for r in rows)
        and all(a < b for a, b in zip(rows, rows[1:], strict=False))
    )
