"""Open the real backend: load the models through the one loader (`specgen.session.open`,
as `run` does) with a sequence per slot, start the public API's batch engine
(`specgen.Pair.scheduler`), compile the chat template, and describe the model for
/v1/models (GGUF SHA-256s computed once here, at start).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.flags import ModelFlags, SamplingFlags
from specgen.hybrid import HybridDrafter
from specgen.server.app import Backend
from specgen.server.metrics import Metrics
from specgen.server.responses import deliver

if TYPE_CHECKING:
    from specgen.session import Session


@dataclass(frozen=True)
class ServeArgs:
    """What `specgen serve` loads and how it serves.

    Attributes:
        model: the model flags, `run`'s (with more than one slot the sliding-window cache
            is kept full-size, see `open_backend`).
        sampling: the start sampling flags: the draft's warpers at load, --draft-max
            (fixed K, or auto: the batch controller).
        parallel: -np, slots served at once (sequences in each model's cache).
        queue: --queue, requests that may wait for a slot.
        alias: --alias, the model id (None: the target's file name).
        chat_template: --chat-template FILE instead of the GGUF's.
        slo_ttft_s, slo_tpot_s: --slo-ttft and --slo-tpot in seconds (None: no target):
            the batch controller's latency targets (`specgen.control.batch.BatchController`).
        cache_ram_mib: --cache-ram, MiB of host memory for the prompt cache (-1: no limit,
            0: none; `specgen.sched.promptcache`).
    """

    model: ModelFlags
    sampling: SamplingFlags
    parallel: int = 4
    queue: int = 64
    alias: str | None = None
    chat_template: Path | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    cache_ram_mib: int = 8192


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


def open_backend(
    a: ServeArgs,
    metrics: Metrics,
    show: Callable[[Session], None],
    say: Callable[[str], None],
) -> Backend:
    """Load the models through `specgen.session.open` (as every command does) with a
    sequence per slot, and start the scheduler.

    Args:
        show: shows the session's warnings and notes (the CLI's `show_messages`).
        say: one line on stderr (serve's own note about the sliding-window cache).

    Raises:
        ModelFileError, ModelLoadError, VocabMismatchError, RpcError, ConfigError,
        ChatTemplateError: as `specgen run` does for the same flags.
    """
    # start-up time: the loader loads numpy and llama.cpp, after the socket is bound
    from specgen import session

    # several sequences in one window-sized sliding-window cache did not roll back exactly
    # (tests/test_sequences.py): keep the full cache with more than one slot
    flags = replace(a.model, swa_full=a.model.swa_full or a.parallel > 1)
    opened = session.open(flags, a.sampling.params(), n_seq_max=a.parallel)
    try:
        show(opened)
        if opened.target.n_swa > 0 and a.parallel > 1 and not a.model.swa_full:
            say(
                f"{opened.target.name} has sliding-window layers: with {a.parallel} slots"
                " their cache is kept full-size (--swa-full), where rollback is exact"
            )
        return _serving(a, opened, metrics)
    except BaseException:
        opened.close()
        raise


def _serving(a: ServeArgs, opened: Session, metrics: Metrics) -> Backend:
    """The started scheduler over `opened`, the chat template and the model's card."""
    # start-up time: the API and the chat module load numpy
    from specgen import Pair
    from specgen.chat import ChatFormatter, load_template, prompt_tokens
    from specgen.constraints import eog_ids
    from specgen.grammar import compile_grammar, tokenizer_for
    from specgen.server.tools import TemplateTools
    from specgen.server.vocabulary import Vocabulary

    target = opened.target
    template = load_template(target, a.chat_template)
    formatter = ChatFormatter(template, target) if template is not None else None
    scheduler = Pair(opened).scheduler(
        n_parallel=a.parallel,
        queue_max=a.queue,
        draft_max=a.sampling.k,
        observer=metrics.observe_batch,
        deliver=deliver,
        slo_ttft_s=a.slo_ttft_s,
        slo_tpot_s=a.slo_tpot_s,
        prompt_cache_mib=a.cache_ram_mib,
    )
    card = model_card(opened, template.to_dict() if template is not None else None, a)
    card["n_ctx_slot"] = scheduler.n_ctx_slot
    scheduler.start()

    # the longest text a token stands for: what no prompt's tokens can hold more of
    longest = max(
        max(len(target.token_bytes(t)), len(target.token_text(t).encode()))
        for t in range(target.n_vocab)
    )

    def tokenize(text: str, add: bool = True) -> list[int]:  # BOS where the model adds one
        return prompt_tokens(target, text.encode("utf-8"), add)

    return Backend(
        scheduler=scheduler,
        tokenize=tokenize,
        render_chat=formatter.tokens if formatter is not None else None,
        n_vocab=target.n_vocab,
        model_id=a.alias or target.path.name,
        card=card,
        close=opened.close,
        check_grammar=lambda spec: compile_grammar(spec, tokenizer_for(target)),
        end_tokens=lambda: eog_ids(target),
        max_token_bytes=longest,
        vocabulary=Vocabulary(
            tokenize=tokenize,
            # control tokens render as b"" in output text; here as their text
            token_bytes=lambda t: target.token_bytes(t) or target.token_text(t).encode(),
            bos=target.token_text(target.vocab.bos) if target.vocab.bos >= 0 else None,
            eos=target.token_text(target.vocab.eos) if target.vocab.eos >= 0 else None,
            chat_template=template.text if template is not None else None,
            n_vocab=target.n_vocab,
        ),
        tool_template=(
            TemplateTools.of(formatter.template.text, formatter.text)
            if formatter is not None
            else TemplateTools()
        ),
    )


def model_card(opened: Session, template: dict[str, str] | None, a: ServeArgs) -> dict[str, Any]:
    """The model's entry in /v1/models under ``meta``: both files with their SHA-256
    (computed here, once at start), the chat template, the slots and the build."""
    target, draft = opened.target, opened.spec.draft
    return {
        "target": {"file": target.path.name, "sha256": sha256_of(target.path)},
        "draft": (
            {"file": draft.name, "sha256": sha256_of(draft)}
            if isinstance(draft, Path)
            else {"kind": opened.draft_name}
        ),
        "chat_template": template,
        "n_vocab": target.n_vocab,
        "n_parallel": a.parallel,
        "draft_max": a.sampling.draft_max,
        "lookup": isinstance(opened.drafter, HybridDrafter),
        "build": build_info(),
    }
