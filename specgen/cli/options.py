"""The options shared by several commands, as Annotated aliases (llama.cpp's flag names).

A leaf: imports Typer and nothing of specgen, so every command module can import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

TargetOpt = Annotated[
    str | None,
    typer.Option("--target", "-m", help="Target model: a GGUF path or a registry name."),
]
DraftOpt = Annotated[
    str | None,
    typer.Option(
        "--draft",
        "-md",
        help="Draft model: a GGUF path, a registry name, 'ngram' (prompt lookup, no model)"
        " or 'none' (ordinary decoding).",
    ),
]
PairOpt = Annotated[str | None, typer.Option("--pair", help="A registry pair name.")]
ModelsOpt = Annotated[
    Path | None,
    typer.Option("--models", help="Extra models.yaml merged over the packaged and user ones."),
]
NglOpt = Annotated[int, typer.Option("--n-gpu-layers", "-ngl", help="Target layers on GPU.")]
NgldOpt = Annotated[int, typer.Option("--n-gpu-layers-draft", "-ngld", help="Draft layers on GPU.")]
ThreadsOpt = Annotated[int, typer.Option("--threads", "-t", help="CPU threads (0 = auto).")]
CtxOpt = Annotated[int, typer.Option("--ctx-size", "-c", help="Context size in tokens.")]
TempOpt = Annotated[float, typer.Option("--temp", help="Temperature; 0 = greedy.")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Top-k (0 = off).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Top-p (1 = off).")]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Min-p (0 = off).")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed (default: random).")]
DraftMaxOpt = Annotated[
    str,
    typer.Option("--draft-max", help="Block size K, or 'auto' to adapt it each round."),
]
DraftPMinOpt = Annotated[
    float, typer.Option("--draft-p-min", help="Stop a block when the draft's top p < P.")
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
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's log lines.")]
