"""What opening a model with llama.cpp needs around the load itself: the settings
(`EngineConfig`), the thread default, the path check before llama.cpp sees a file, and the
error for a NULL from `llama_model_load_from_file`, read from what llama.cpp logged."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from specgen.errors import ModelLoadFailure
from specgen.llamacpp.signals import _last_error, _recent_log

__all__ = ["EngineConfig", "default_threads", "extra_buffers_safe", "load_failure"]

# Lines llama.cpp logs when a file ends before its header says it should.
_TRUNCATION_SIGNS = ("not within the file bounds", "remaining file size", "failed to read")


@functools.cache
def extra_buffers_safe() -> bool:
    """Whether llama.cpp may repack weights into its CPU "extra" buffer types
    (`llama_model_params.use_extra_bufts`, llama-server's ``--no-repack`` when False).

    False on a CPU with AMX (Intel Sapphire Rapids and later: ``AMX_INT8 = 1`` in
    `llama_print_system_info`): there the AMX buffer type takes the quantized weights, and
    llama.cpp 0.3.36's `ggml_backend_amx_mul_mat` crashes the process (SIGSEGV) on the first
    decode of any quantized model (seen here on the demo pair and SmolLM2's Q4_1;
    llama.cpp issue 20824, closed without a fix). Without the extra buffers the weights
    stay in the CPU buffer and the ordinary CPU kernels run them. Every other CPU keeps
    the repacking (a faster layout of the same weights)."""
    import llama_cpp  # start-up time: loaded only with a model

    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    return "AMX_INT8 = 1" not in info


def load_failure(path: Path) -> ModelLoadFailure:
    """The error for a NULL from llama_model_load_from_file: llama.cpp's own reason (its
    last line, "failed to load model", says nothing), and for a file that ends early, that
    it is truncated or corrupt, with its size. (The size its header implies is added by
    `specgen.models.header.explain_load_failure`: reading a header is not this door's job.)"""
    lines = [ln.strip() for ln in _recent_log if ln.strip()]
    truncated = next((ln for ln in lines if any(s in ln for s in _TRUNCATION_SIGNS)), None)
    reason = truncated or next((ln for ln in lines if "error loading model:" in ln), _last_error())
    reason = reason.split("error loading model:", 1)[-1].strip()
    try:
        size = path.stat().st_size
    except OSError:
        return ModelLoadFailure(f"llama.cpp could not load {path}: {reason}", path, reason)
    if truncated is not None:
        return ModelLoadFailure(
            f"{path} is truncated or corrupt ({size:,} bytes; llama.cpp: {reason}):"
            " download or build it again",
            path,
            reason,
        )
    return ModelLoadFailure(
        f"llama.cpp could not load {path} ({size:,} bytes): {reason}", path, reason
    )


def default_threads() -> int:
    """CPU threads to use when -t is 0: the CPUs this process may run on (also the
    "usable CPUs" of bench's record)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


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
        flash_attn: llama.cpp's ``-fa``: "auto" (its default: on where the backend has
            it), "on" or "off". On a CPU, flash attention computes in lower precision
            when a decode holds few rows, so a token's logits depend on how its context
            was split into decodes (up to 0.13 nats at 1,200 tokens between 32- and
            512-row decodes); "off" makes them independent of it, a few percent slower
            (docs/measurements/2026-12-06-lm-eval.md).
        n_seq_max: sequences the cache holds (the server's slots, llama-server's -np).
            With N > 1 the cache is unified (`kv_unified`: one buffer for all sequences)
            of n_ctx cells (the server passes N x -c), and each sequence's context is
            n_ctx // N: N sequences at their limit always fit together. 1 (the default)
            is the single-stream engine.
    """

    n_ctx: int = 4096
    n_gpu_layers: int = 0
    n_threads: int = 0
    n_batch: int = 512
    local_only: bool = False
    swa_full: bool = False
    flash_attn: str = "auto"
    n_seq_max: int = 1
