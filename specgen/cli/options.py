"""The options shared by several commands, as Annotated aliases (llama.cpp's flag names),
and the one place their values are checked (`check_model_flags`, `check_sampling_flags`,
`seed_or_random`): every message names the flag.

A leaf: imports Typer and only `specgen.errors`, so every command module can import it.
"""

from __future__ import annotations

import math
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from specgen.errors import ConfigError

# --draft values that are not models (kept equal to specgen.session's, which this leaf
# cannot import)
_MODEL_FREE_DRAFTS = ("none", "ngram")

TargetOpt = Annotated[
    str | None,
    typer.Option("--target", "-m", help="Target model: a GGUF path or a registry name."),
]
DraftOpt = Annotated[
    str | None,
    typer.Option(
        "--draft",
        "-md",
        help="Draft model: a GGUF path, a registry name, 'ngram' (prompt lookup, no model),"
        " 'none' (ordinary decoding) or 'auto' (the smallest GGUF on disk with the target's"
        " tokenizer, see `specgen models --local`).",
    ),
]
PairOpt = Annotated[str | None, typer.Option("--pair", help="A registry pair name.")]
ModelsOpt = Annotated[
    Path | None,
    typer.Option("--models", help="Extra models.yaml merged over the packaged and user ones."),
]
NglOpt = Annotated[int, typer.Option("--n-gpu-layers", "-ngl", help="Target layers on GPU.")]
NgldOpt = Annotated[int, typer.Option("--n-gpu-layers-draft", "-ngld", help="Draft layers on GPU.")]
ThreadsOpt = Annotated[
    int, typer.Option("--threads", "-t", help="CPU threads (0 = the CPUs available).")
]
CtxOpt = Annotated[
    int,
    typer.Option(
        "--ctx-size",
        "-c",
        help="Context size in tokens (0 = the model's own; llama.cpp rounds up to 256).",
    ),
]
TempOpt = Annotated[
    float, typer.Option("--temp", help="Temperature; 0 or below = greedy (as in llama.cpp).")
]
NoLiveOpt = Annotated[bool, typer.Option("--no-live", help="Plain text even on a TTY.")]
ShowRejectedOpt = Annotated[
    bool, typer.Option("--show-rejected", help="Show rejected proposals struck through.")
]
TopKOpt = Annotated[
    int, typer.Option("--top-k", help="Top-k (0 or negative = off, as in llama.cpp).")
]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Top-p (1 = off).")]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Min-p (0 = off).")]
SeedOpt = Annotated[
    int | None,
    typer.Option("--seed", help="Random seed; -1 or omitted = random (as in llama.cpp)."),
]
DraftMaxOpt = Annotated[
    str,
    typer.Option("--draft-max", help="Block size K, or 'auto' to adapt it each round."),
]
DraftPMinOpt = Annotated[
    float,
    typer.Option("--draft-p-min", help="Stop a block when the draft's top p < P (0 to 1)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
TraceOpt = Annotated[
    Path | None,
    typer.Option("--trace", help="Write one JSON object per round to FILE.jsonl."),
]
RpcOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        help="ggml-rpc-server hosts, HOST:PORT[,HOST:PORT...]: -ngl puts target layers on"
        " them; the draft stays local. No authentication: trusted networks only.",
    ),
]
SwaFullOpt = Annotated[
    bool,
    typer.Option(
        "--swa-full",
        help="Full-size cache for sliding-window layers (Gemma 3): more memory, and no"
        " re-evaluation after rollbacks deeper than the window.",
    ),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's log lines.")]
SystemOpt = Annotated[
    str | None,
    typer.Option("--system", help="System message (needs a chat template)."),
]
RawOpt = Annotated[
    bool,
    typer.Option("--raw", help="Send the prompt as it is, without the chat template."),
]
ChatTemplateOpt = Annotated[
    Path | None,
    typer.Option(
        "--chat-template",
        help="Jinja2 chat template FILE instead of the one in the target's GGUF.",
    ),
]


def check_model_flags(
    *,
    target: str | None,
    draft: str | None,
    ctx_size: int,
    threads: int,
    n_gpu_layers: int,
    n_gpu_layers_draft: int,
) -> None:
    """Refuse model flags that are invalid before anything is read or loaded.

    Raises:
        ConfigError: naming the flag: -c or -t below 0, -ngl/-ngld below -1 (-1 = all
            layers), or a draft model (-md FILE) without -m (the draft must share the
            target's vocabulary; ``--draft none`` and ``--draft ngram`` alone run on the
            demo target, as they need no second model).
    """
    if ctx_size < 0:
        raise ConfigError(
            f"-c/--ctx-size must be 0 (the model's own context) or more, got {ctx_size}"
        )
    if threads < 0:
        raise ConfigError(f"-t/--threads must be 0 (the CPUs available) or more, got {threads}")
    for flag, n in (("-ngl", n_gpu_layers), ("-ngld", n_gpu_layers_draft)):
        if n < -1:
            raise ConfigError(f"{flag} must be -1 (all layers), 0 (CPU only) or more, got {n}")
    if target is None and draft is not None and draft not in _MODEL_FREE_DRAFTS:
        raise ConfigError(
            f"-md {draft} needs -m too: give the target it drafts for"
            " (or neither, for the demo pair)"
        )


def check_sampling_flags(*, temp: float, draft_p_min: float = 0.0) -> None:
    """Refuse sampling values that mean nothing (top-p and min-p are checked by
    ``specgen.sampling.SamplingParams``). Negative temperatures are greedy, as in llama.cpp.

    Raises:
        ConfigError: naming the flag: --temp not a finite number, --draft-p-min outside
            [0, 1] (it is a probability).
    """
    if not math.isfinite(temp):
        raise ConfigError(f"--temp must be a number (0 or below = greedy), got {temp}")
    if not 0.0 <= draft_p_min <= 1.0:
        raise ConfigError(f"--draft-p-min must be in [0, 1] (a probability), got {draft_p_min}")


def check_stop_strings(stop: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The --stop strings as a tuple, refusing an empty one (it would match before the
    first token, so nothing could ever be generated).

    Raises:
        ConfigError: naming the flag.
    """
    stops = tuple(stop or ())
    if any(s == "" for s in stops):
        raise ConfigError('--stop needs a non-empty string (--stop "" would end at once)')
    return stops


def seed_or_random(seed: int | None) -> int:
    """The seed to use: ``seed`` itself, or a random one for None or -1 (llama.cpp's
    "random seed", ``LLAMA_DEFAULT_SEED``).

    Raises:
        ConfigError: a seed below -1.
    """
    if seed is None or seed == -1:
        return secrets.randbits(31)
    if seed < -1:
        raise ConfigError(f"--seed must be -1 (random) or 0 or more, got {seed}")
    return seed


def check_output_path(flag: str, path: Path) -> None:
    """Refuse an output path that cannot be written, before any work: a directory, or a
    parent directory that is missing or read-only.

    Raises:
        ConfigError: naming the flag.
    """
    if path.is_dir():
        raise ConfigError(f"{flag}: {path} is a directory; give a file name")
    parent = path.parent.resolve()
    if not parent.is_dir():
        raise ConfigError(f"{flag}: no such directory: {path.parent}")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{flag}: cannot write {path}: permission denied")
