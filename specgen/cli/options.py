"""The options shared by several commands, as Annotated aliases (llama.cpp's flag names),
and the three shapes a command passes them on in, each built once from Typer's values
(``ModelFlags.pick(locals())``) and validated when built, every message naming the flag:
`ModelFlags` and `SamplingFlags` (defined in `specgen.flags`, which the library shares) and
`OutputFlags` (what to show, here).

A leaf: imports Typer, `specgen.errors` and `specgen.flags` (both cheap), so every command
module can import it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from specgen.errors import ConfigError
from specgen.flags import (
    ModelFlags,
    SamplingFlags,
    check_model_flags,
    pick,
    seed_or_random,
)

__all__ = [
    "ModelFlags",
    "OutputFlags",
    "PromptFlags",
    "SamplingFlags",
    "check_model_flags",
    "check_output_path",
    "pick",
    "seed_or_random",
]

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
LogitBiasOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--logit-bias",
        "-l",
        help="TOKEN_ID(+|-)BIAS added to that token's logit, e.g. 15043+1 or 15043-inf to"
        " ban it (repeatable; as in llama.cpp).",
    ),
]
RepeatPenaltyOpt = Annotated[
    float,
    typer.Option(
        "--repeat-penalty",
        help="Penalize tokens seen in the last --repeat-last-n (1.0 = off, as in llama.cpp).",
    ),
]
RepeatLastNOpt = Annotated[
    int,
    typer.Option(
        "--repeat-last-n",
        help="Tokens the penalties look back, prompt included (0 = off, -1 = the context).",
    ),
]
PresencePenaltyOpt = Annotated[
    float,
    typer.Option("--presence-penalty", help="Subtracted from a token seen (-2 to 2; 0 = off)."),
]
FrequencyPenaltyOpt = Annotated[
    float,
    typer.Option(
        "--frequency-penalty", help="Subtracted per time a token was seen (-2 to 2; 0 = off)."
    ),
]
GrammarOpt = Annotated[
    str | None,
    typer.Option("--grammar", help="A GBNF grammar the output must match (as in llama-cli)."),
]
GrammarFileOpt = Annotated[
    Path | None, typer.Option("--grammar-file", help="Read the --grammar from FILE.")
]
JsonSchemaOpt = Annotated[
    str | None,
    typer.Option(
        "--json-schema",
        "-j",
        help="A JSON Schema the output must follow, e.g. '{}' for any JSON object.",
    ),
]
JsonSchemaFileOpt = Annotated[
    Path | None, typer.Option("--json-schema-file", help="Read the --json-schema from FILE.")
]
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
VerifyOpt = Annotated[
    str | None,
    typer.Option(
        "--verify",
        help="Acceptance rule: 'block' (block verification), 'token' (token by token) or"
        " 'auto' (default: block at --temp > 0, where it accepts more; the two are equal"
        " when greedy). Both keep the target's distribution exactly.",
    ),
]
LookupOpt = Annotated[
    str | None,
    typer.Option(
        "--lookup",
        help="With a draft model: propose tokens by prompt lookup where the text copies"
        " its context and the model elsewhere: 'on', 'off' or 'auto' (default: on).",
    ),
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
StopOpt = Annotated[
    list[str] | None,
    typer.Option("--stop", help="Stop string (repeatable): the text ends where it begins."),
]
LogprobsOpt = Annotated[
    int | None,
    typer.Option(
        "--logprobs",
        help="With --json: each token's log-probability under the target's raw logits,"
        " with the N (0-20) most likely tokens there.",
        min=0,
        max=20,
    ),
]
IgnoreEosOpt = Annotated[
    bool, typer.Option("--ignore-eos", help="Do not stop at end of generation (EOS, end of turn).")
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


@dataclass(frozen=True)
class OutputFlags:
    """What a command shows and writes (--json, --no-live, --show-rejected, --trace,
    --verbose).

    Raises:
        ConfigError: a --trace path that cannot be written (checked when built, before any
            model is loaded or the prompt read).
    """

    json_out: bool = False
    no_live: bool = False
    show_rejected: bool = False
    trace: Path | None = None
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.trace is not None:
            check_output_path("--trace", self.trace)

    @classmethod
    def pick(cls, values: Mapping[str, Any], **override: Any) -> OutputFlags:
        """From a Typer command's ``locals()`` (see `specgen.flags.pick`)."""
        return pick(cls, values, **override)


@dataclass(frozen=True)
class PromptFlags:
    """How the prompt becomes tokens (--raw, --system, --chat-template): see
    `specgen.chat.build_prompt`."""

    raw: bool = False
    system: str | None = None
    chat_template: Path | None = None

    @classmethod
    def pick(cls, values: Mapping[str, Any], **override: Any) -> PromptFlags:
        """From a Typer command's ``locals()`` (see `specgen.flags.pick`)."""
        return pick(cls, values, **override)
