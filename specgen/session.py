"""The one loader: what the user asked for (`specgen.flags.ModelFlags`) -> resolved files ->
a load spec -> an open target and drafter, with the warnings and notes about them
(`open` -> `Session`). Every command and the public API load through `open`; prints nothing
(the CLI shows a session's messages with `specgen.cli.loading.show_messages`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from specgen import llamacpp
from specgen.compat import check_compatible
from specgen.drafters import ModelDrafter
from specgen.engine import Drafter
from specgen.errors import ModelFileError, ModelLoadFailure
from specgen.flags import DRAFT_AUTO, DRAFT_NGRAM, DRAFT_NONE, ModelFlags, verify_rule
from specgen.generate import AutoK, FixedK, KPolicy, StartUp, VerifyRule
from specgen.hybrid import HybridDrafter
from specgen.llamacpp import (
    EngineConfig,
    LlamaEngine,
    add_rpc_servers,
    backend_of,
    parse_rpc_endpoints,
    supports_gpu_offload,
)
from specgen.models.files import sha256_file
from specgen.models.header import check_gguf_file, explain_load_failure, header_fields
from specgen.models.resolve import resolve_models
from specgen.ngram import NgramDrafter
from specgen.sampling import SamplingParams


@dataclass(frozen=True)
class ModelSpec:
    """Where the models come from and how to run them.

    Attributes:
        target: path (or registry name, resolved before this point).
        draft: path, `none` (ordinary decoding) or `ngram` (prompt lookup).
        target_cfg, draft_cfg: llama.cpp settings for each model (-ngl / -ngld, -t, -c).
        rpc: ggml-rpc-server endpoints (``--rpc``), registered before the models load.
    """

    target: Path
    draft: Path | str
    target_cfg: EngineConfig
    draft_cfg: EngineConfig
    rpc: tuple[str, ...] = ()

    @classmethod
    def from_flags(
        cls,
        target: Path | str,
        draft: Path | str,
        n_ctx: int,
        n_gpu_layers: int,
        n_gpu_layers_draft: int,
        n_threads: int,
        rpc: str | None = None,
        swa_full: bool = False,
        flash_attn: str = "auto",
    ) -> ModelSpec:
        """The spec the shared flags describe: -c and -t for both models, -ngl for the
        target, -ngld for the draft, `--rpc` servers for the target only (the draft's
        layers stay on this machine: it runs K times per round and must not pay a network
        round trip each time). `swa_full` (`--swa-full`) and `flash_attn` (`-fa`) apply
        to both models.

        Raises:
            ConfigError: `rpc` is not a HOST:PORT list.
        """
        target_cfg = EngineConfig(
            n_ctx=n_ctx,
            n_gpu_layers=n_gpu_layers,
            n_threads=n_threads,
            swa_full=swa_full,
            flash_attn=flash_attn,
        )
        return cls(
            rpc=parse_rpc_endpoints(rpc) if rpc is not None else (),
            target=Path(target),
            draft=draft,
            target_cfg=target_cfg,
            draft_cfg=replace(target_cfg, n_gpu_layers=n_gpu_layers_draft, local_only=True),
        )


@dataclass
class Loaded:
    """An open target and drafter; `close()` frees both. `warnings`: one-line messages
    for the user about the pair (the caller prints them; see `swap_warning`)."""

    target: LlamaEngine
    drafter: Drafter | None
    draft_name: str
    warnings: tuple[str, ...] = ()
    draft_engine: LlamaEngine | None = None  # a model drafter's (for its devices)

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        self.target.close()


Status = Callable[[str], None]


def open_engine(path: Path, config: EngineConfig) -> LlamaEngine:
    """`LlamaEngine(path, config)` after checking the file's GGUF magic, and with the size
    its header implies when llama.cpp cannot load it.

    Raises:
        ModelFileError: missing, not GGUF, truncated or otherwise unloadable.
        ModelLoadError: the context could not be created.
    """
    check_gguf_file(path)
    try:
        return LlamaEngine(path, config)
    except ModelLoadFailure as e:
        raise explain_load_failure(e) from e


@dataclass
class Session:
    """An open pair and what the user should be told about it; `close()` frees both models
    (also as a context manager).

    Attributes:
        target: the target engine.
        drafter: the drafter, or None for ``--draft none``.
        draft_name: the draft's file name, or ``none`` / ``ngram``.
        spec: what was loaded, and how.
        flags: what was asked for.
        k_init: the registry pair's recommended block size (the controller starts there),
            or None.
        warnings: one line each, about the pair (a draft larger than its target).
        notes: one line each, what llama.cpp does otherwise than asked (see `load_notes`).
        load_s: seconds spent resolving and loading, wall clock.
        draft_engine: a model drafter's engine (for its devices), else None.
        start_up: what the first generation with a drafter measured, for the later ones.
    """

    target: LlamaEngine
    drafter: Drafter | None
    draft_name: str
    spec: ModelSpec
    flags: ModelFlags
    k_init: int | None = None
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    load_s: float = field(default=0.0, compare=False)
    draft_engine: LlamaEngine | None = None
    start_up: StartUp = field(default_factory=StartUp, compare=False, repr=False)

    def policy(self, draft_max: int | None) -> KPolicy:
        """The block-size policy for ``--draft-max`` (None = auto, from `k_init`)."""
        return make_policy(draft_max, k_init=self.k_init)

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        self.target.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def open(  # noqa: A001 - the module's verb: `session.open(flags)`
    flags: ModelFlags,
    params: SamplingParams | None = None,
    status: Status | None = None,
    *,
    n_seq_max: int = 1,
) -> Session:
    """Resolve the names in `flags` (registry, pair, demo), build the spec, load both models
    and say what the user should know.

    Args:
        flags: which models and how to run them.
        params: the draft's warpers (q must use the target's); default `SamplingParams()`.
        status: called with one-line progress messages ("loading target ...").
        n_seq_max: sequences each model's cache holds (`specgen serve`'s slots, see
            `with_sequences`); 1 for one stream.

    Raises:
        ConfigError: unknown or not-downloaded names, --pair with -m, a bad --rpc list.
        ModelFileError, ModelLoadError: a model cannot be opened.
        VocabMismatchError: the draft's tokenizer differs (llama.cpp's rules).
        RpcError: an RPC server cannot be used, or this build has no RPC support.
    """
    t0 = time.perf_counter()
    target, draft, k_init = resolve_models(
        flags.target, flags.draft, flags.pair, flags.models, status
    )
    spec = ModelSpec.from_flags(
        target,
        draft,
        flags.ctx_size,
        flags.n_gpu_layers,
        flags.n_gpu_layers_draft,
        flags.threads,
        flags.rpc,
        swa_full=flags.swa_full,
        flash_attn=flags.flash_attn,
    )
    spec = with_sequences(spec, n_seq_max)
    lookup = resolve_lookup(flags.lookup, draft)
    loaded = load(spec, params or SamplingParams(), flags.draft_p_min, status=status, lookup=lookup)
    return Session(
        loaded.target,
        loaded.drafter,
        loaded.draft_name,
        spec,
        flags,
        k_init=k_init,
        warnings=loaded.warnings,
        notes=tuple(auto_note(flags, draft) + load_notes(spec, loaded)),
        load_s=time.perf_counter() - t0,
        draft_engine=loaded.draft_engine,
    )


def with_sequences(spec: ModelSpec, n_seq: int) -> ModelSpec:
    """`spec` with caches of `n_seq` sequences (llama.cpp's ``n_seq_max``) for both models:
    -c stays each sequence's context, so the unified cache holds n_seq x -c cells (-c 0,
    the model's own context, is then shared by all). Unchanged for one sequence."""
    if n_seq == 1:
        return spec

    def each(cfg: EngineConfig) -> EngineConfig:
        return replace(cfg, n_ctx=cfg.n_ctx * n_seq, n_seq_max=n_seq)

    return replace(spec, target_cfg=each(spec.target_cfg), draft_cfg=each(spec.draft_cfg))


def load(
    spec: ModelSpec,
    params: SamplingParams,
    draft_p_min: float = 0.0,
    ngram_n: int = 4,
    status: Status | None = None,
    lookup: bool = False,
) -> Loaded:
    """Open both models and check the draft's vocabulary against the target's. With
    `lookup` (`resolve_lookup`) a draft model drafts with prompt lookup beside it
    (`specgen.hybrid.HybridDrafter`).

    Raises:
        ModelFileError, ModelLoadError: a model cannot be opened.
        VocabMismatchError: the draft's tokenizer differs (llama.cpp's rules).
        RpcError: an RPC server cannot be used, or this build has no RPC support.
    """
    say = status or (lambda _msg: None)
    if spec.rpc:
        say(f"connecting to RPC server {', '.join(spec.rpc)}")
        add_rpc_servers(spec.rpc)
    say(f"loading target {spec.target.name}")
    target = open_engine(spec.target, spec.target_cfg)
    try:
        if spec.draft == DRAFT_NONE:
            return Loaded(target, None, DRAFT_NONE)
        if spec.draft == DRAFT_NGRAM:
            return Loaded(target, NgramDrafter(target.n_vocab, n_max=ngram_n), DRAFT_NGRAM)
        path = Path(spec.draft)
        say(f"loading draft {path.name}")
        draft = open_engine(path, spec.draft_cfg)
        try:
            say("checking vocabularies")
            check_compatible(target.vocab, draft.vocab, target.token_text, draft.token_text)
        except BaseException:
            draft.close()
            raise
        model = ModelDrafter(draft, params, target.n_vocab, draft_p_min)
        drafter: Drafter = HybridDrafter(model, n_max=ngram_n) if lookup else model
        warning = swap_warning(
            target.name, target.path.stat().st_size, target.n_params,
            draft.name, draft.path.stat().st_size, draft.n_params,
        )  # fmt: skip
        return Loaded(target, drafter, path.name, (warning,) if warning else (), draft)
    except BaseException:
        target.close()
        raise


def resolve_lookup(lookup: str | None, draft: Path | str) -> bool:
    """`--lookup on|off|auto` (None = auto) beside `--draft` (checked by `ModelFlags`):
    whether the draft model drafts with prompt lookup (hybrid drafting). auto is on:
    measured no worse than the model alone on prose and better on text that quotes its
    context (scripts/hybrid_bench.py, README)."""
    if draft in (DRAFT_NGRAM, DRAFT_NONE):
        return False
    return lookup != "off"


def resolve_verify(verify: str | None, params: SamplingParams) -> VerifyRule:
    """`--verify block|token|auto` under `params` (see `specgen.flags.verify_rule`).

    Raises:
        ConfigError: an unknown value.
    """
    return verify_rule(verify, params.greedy)  # type: ignore[return-value]


# The rebuild command of the GPU guide (docs/guides/gpu.md).
GPU_REBUILD = (
    'CMAKE_ARGS="-DGGML_CUDA=on" .venv/bin/pip install --force-reinstall --no-cache-dir'
    " llama-cpp-python==0.3.36"
)


def auto_note(flags: ModelFlags, draft: Path | str) -> list[str]:
    """``-md auto`` chose a file from disk: say which, so that no model is used unnamed."""
    if flags.draft != DRAFT_AUTO or not isinstance(draft, Path):
        return []
    return [f"-md auto chose {draft.name} ({draft})"]


def load_notes(spec: ModelSpec, loaded: Loaded | None = None) -> list[str]:
    """What the user asked for that llama.cpp will not do as asked, one line each, to be
    said once on stderr: GPU layers on a build without GPU offload (ignored), and, once
    loaded, a context size llama.cpp rounded up (it pads n_ctx to a multiple of 256)."""
    notes = []
    asked = [("-ngl", spec.target_cfg.n_gpu_layers)]
    if isinstance(spec.draft, Path):
        asked.append(("-ngld", spec.draft_cfg.n_gpu_layers))
    flags = [flag for flag, n in asked if n != 0]
    if flags and not supports_gpu_offload():
        notes.append(
            f"{'/'.join(flags)} ignored: this llama-cpp-python build has no GPU backend"
            f" (CPU only); rebuild it for CUDA with: {GPU_REBUILD}"
        )
    if loaded is not None:
        # per sequence: a cache of several (`with_sequences`) gives each its share
        asked_ctx = spec.target_cfg.n_ctx // max(1, spec.target_cfg.n_seq_max)
        n_ctx = loaded.target.n_ctx
        if asked_ctx > 0 and n_ctx != asked_ctx:
            notes.append(
                f"-c {asked_ctx} became {n_ctx}: llama.cpp rounds the context up"
                " to a multiple of 256"
            )
    return notes


SWAP_HINT = "did you swap -m and -md?"
_SLOW_DRAFT_MARGIN = 1.5
_TIMING_FLOOR_S = 1e-3
"""Passes under a millisecond (tiny test models) differ by scheduling noise alone: a
draft that fast is never called slow."""


def _gb(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.2f} GB"


def swap_warning(
    target_name: str, target_bytes: int, target_params: int,
    draft_name: str, draft_bytes: int, draft_params: int,
) -> str | None:  # fmt: skip
    """The warning for a draft larger than its target, by file size or parameter count,
    else None. Such a draft is rarely cheaper per token than its target, and then no block
    size can pay (the controller then never drafts); most often the two files were given
    the wrong way round."""
    if draft_bytes > target_bytes:
        what = f"{_gb(draft_bytes)} against {_gb(target_bytes)}"
    elif draft_params > target_params:
        what = f"{draft_params / 1e9:.2f}B against {target_params / 1e9:.2f}B parameters"
    else:
        return None
    return (
        f"the draft {draft_name} is larger than the target {target_name} ({what}):"
        f" speculation is unlikely to pay; {SWAP_HINT}"
    )


def slow_draft_warning(ordinary_token_s: float | None, draft_token_s: float | None) -> str | None:
    """The warning for a draft measured slower per token than its target's ordinary pass
    (`specgen.events.Prefilled`'s timings) by a clear margin, else None: no block size can
    then pay, and `--draft-max auto` decodes ordinarily. The margin (1.5x) keeps two models
    of the same size, whose timings differ only by noise, from being called swapped; a draft
    pass under 1 ms is never called slow (noise, at that size)."""
    if ordinary_token_s is None or draft_token_s is None or draft_token_s < _TIMING_FLOOR_S:
        return None
    if draft_token_s < _SLOW_DRAFT_MARGIN * ordinary_token_s:
        return None
    return (
        f"the draft measured slower than the target ({draft_token_s * 1e3:.1f} ms against"
        f" {ordinary_token_s * 1e3:.1f} ms per token): speculation cannot pay, so"
        f" --draft-max auto decodes ordinarily; {SWAP_HINT} (or is the draft on the CPU"
        " while the target is on a GPU? see -ngld)"
    )


def make_policy(draft_max: int | None, k_max: int = 16, k_init: int | None = None) -> KPolicy:
    """FixedK for a number; for `auto` the controller (`specgen.control.batch`), whose
    largest K is at least `k_init` (a registry pair's recommended block size)."""
    if draft_max is not None:
        return FixedK(draft_max)
    return AutoK(max(k_max, k_init or 0))


# -- facts for a measurement's record (bench reaches llama.cpp and the model files only
# through here)


def default_threads() -> int:
    """The CPU threads llama.cpp uses for ``-t 0`` (the CPUs this process may run on)."""
    return llamacpp.default_threads()


def software_facts() -> dict[str, Any]:
    """The llama.cpp build: bindings and library versions, backend, GPU offload, ggml's
    system_info line."""
    info = llamacpp.system_info()
    return {
        "llama_cpp_python": info.get("llama_cpp_python"),
        "llama_cpp": info.get("llama_cpp"),
        "backend": backend_of(info.get("system_info", "")),
        "gpu_offload": info.get("gpu_offload") == "True",
        "system_info": info.get("system_info"),
    }


def model_file_facts(path: Path) -> dict[str, Any]:
    """SHA-256, architecture and file type (llama.cpp's ``general.file_type``, or None) of
    one model file; the header keys are None when the header cannot be read."""
    try:
        meta = header_fields(path, ("general.architecture", "general.file_type"))
    except (ModelFileError, OSError):
        meta = {}
    return {
        "sha256": sha256_file(path),
        "architecture": meta.get("general.architecture"),
        "file_type": meta.get("general.file_type"),
    }
