"""Open the real backend: resolve and load the models as `run` does, start the scheduler,
compile the chat template, and describe the model for /v1/models (GGUF SHA-256s computed
once here, at start).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from specgen.server.app import Backend
from specgen.server.metrics import Metrics
from specgen.server.shapes import Defaults


@dataclass(frozen=True)
class ServeArgs:
    """The model flags of `specgen serve` (the same as `run`'s) and the slots."""

    target: str | None
    draft: str | None
    pair: str | None
    models: Path | None
    ctx_size: int
    n_gpu_layers: int
    n_gpu_layers_draft: int
    threads: int
    rpc: str | None
    swa_full: bool
    draft_max: str
    draft_p_min: float
    chat_template: Path | None
    parallel: int
    queue: int
    alias: str | None
    defaults: Defaults


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def build_info() -> dict[str, str]:
    """specgen's version, the bindings' version and the llama.cpp backend."""
    from specgen import __version__
    from specgen.llamacpp import backend

    try:
        bindings = version("llama_cpp_python")
    except PackageNotFoundError:
        bindings = "unknown"
    return {"specgen": __version__, "llama_cpp_python": bindings, "backend": backend()}


def _slots(cfg: Any, n_parallel: int) -> Any:
    """The engine settings for `n_parallel` sequences (llama.cpp's ``n_seq_max``): -c stays
    each sequence's context, and the unified cache holds N x -c cells. Unchanged for an
    engine without sequences."""
    if "n_seq_max" not in {f.name for f in fields(cfg)}:
        return cfg
    return replace(cfg, n_seq_max=n_parallel)


def open_backend(a: ServeArgs, metrics: Metrics, say: Callable[[str], None]) -> Backend:
    """Load the models and start the scheduler.

    Raises:
        ModelFileError, ModelLoadError, VocabMismatchError, RpcError, ConfigError,
        ChatTemplateError: as `specgen run` does for the same flags.
    """
    from specgen.chat import ChatFormatter, load_template, prompt_tokens
    from specgen.flags import parse_draft_max
    from specgen.models.resolve import resolve_models
    from specgen.session import ModelSpec, load, load_notes

    draft_max = parse_draft_max(a.draft_max)
    target_path, draft_path, _pair_k = resolve_models(a.target, a.draft, a.pair, a.models, None)
    spec = ModelSpec.from_flags(
        target_path,
        draft_path,
        a.ctx_size,
        a.n_gpu_layers,
        a.n_gpu_layers_draft,
        a.threads,
        a.rpc,
        # several sequences in one window-sized sliding-window cache did not roll back
        # exactly (tests/test_sequences.py): keep the full cache with more than one slot
        swa_full=a.swa_full or a.parallel > 1,
    )
    spec = replace(
        spec,
        target_cfg=_slots(spec.target_cfg, a.parallel),
        draft_cfg=_slots(spec.draft_cfg, a.parallel),
    )
    from specgen.server.scheduler import Scheduler

    loaded = load(spec, a.defaults.params, draft_p_min=a.draft_p_min)
    try:
        for line in (*loaded.warnings, *load_notes(spec, loaded)):
            say(line)
        if loaded.target.n_swa > 0 and a.parallel > 1 and not a.swa_full:
            say(
                f"{loaded.target.name} has sliding-window layers: with {a.parallel} slots"
                " their cache is kept full-size (--swa-full), where rollback is exact"
            )
        target = loaded.target
        template = load_template(target, a.chat_template)
        formatter = ChatFormatter(template, target) if template is not None else None
        draft_file = Path(spec.draft) if isinstance(spec.draft, Path) else None
        card: dict[str, Any] = {
            "target": {"file": target.path.name, "sha256": sha256_of(target.path)},
            "draft": (
                {"file": draft_file.name, "sha256": sha256_of(draft_file)}
                if draft_file is not None
                else {"kind": loaded.draft_name}
            ),
            "chat_template": template.to_dict() if template is not None else None,
            "n_vocab": target.n_vocab,
            "n_parallel": a.parallel,
            "draft_max": a.draft_max,
            "build": build_info(),
        }
        scheduler = Scheduler(
            target,  # type: ignore[arg-type]
            loaded.drafter,
            n_parallel=a.parallel,
            queue_max=a.queue,
            draft_max=draft_max,
            observer=metrics.observe_batch,
        )
        card["n_ctx_slot"] = scheduler.n_ctx_slot
        scheduler.start()
    except BaseException:
        loaded.close()
        raise
    return Backend(
        scheduler=scheduler,
        tokenize=lambda text: prompt_tokens(target, text.encode("utf-8")),
        render_chat=formatter.tokens if formatter is not None else None,
        n_vocab=target.n_vocab,
        model_id=a.alias or target.path.name,
        card=card,
        close=loaded.close,
    )
