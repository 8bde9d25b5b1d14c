"""The options shared by several commands, each declared once, and the groups they come in.

A group (`Group`) is a run of options that builds one frozen shape: `MODEL` builds
`ModelFlags`, `SAMPLING` and `GRAMMAR` build `SamplingFlags` (both defined in
`specgen.flags`, which the library shares), `OUTPUT` builds `OutputFlags` and `PROMPT`
`PromptFlags` (here). A command declares a parameter per group, ``model: Annotated[ModelFlags,
MODEL]``, and `grouped` puts the group's options into the signature Typer reads, then hands
the command the shape built from their values: each shape is validated when built, every
message naming the flag. A command that shows an option with another default or help, or
lacks some, says so with `Group.but` and `Group.without`.

A leaf: imports Typer, `specgen.errors` and `specgen.flags` (both cheap), so every command
module can import it.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, NamedTuple, TypeVar, get_args, get_origin

import typer

from specgen.errors import ConfigError
from specgen.flags import ModelFlags, SamplingFlags, seed_or_random

__all__ = [
    "GRAMMAR",
    "LOGPROBS",
    "MODEL",
    "OUTPUT",
    "PROMPT",
    "SAMPLING",
    "Group",
    "ModelFlags",
    "Opt",
    "OutputFlags",
    "PromptFlags",
    "SamplingFlags",
    "check_output_path",
    "grouped",
    "opt",
    "seed_or_random",
]

ModelsOpt = Annotated[
    Path | None,
    typer.Option("--models", help="Extra models.yaml merged over the packaged and user ones."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


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


@dataclass(frozen=True)
class PromptFlags:
    """How the prompt becomes tokens (--raw, --system, --chat-template): see
    `specgen.chat.build_prompt`."""

    raw: bool = False
    system: str | None = None
    chat_template: Path | None = None


_Shape = TypeVar("_Shape")


class Opt(NamedTuple):
    """One option of a group: its type annotated with its ``typer.Option`` (names, help),
    as Typer reads a parameter, and its default."""

    annotation: Any
    default: Any


def opt(kind: Any, default: Any, *names: str, **option: Any) -> Opt:
    """An option of type `kind` (as Typer reads it), with its default, flag names and
    ``typer.Option``'s other arguments (``help=...``)."""
    return Opt(Annotated[kind, typer.Option(*names, **option)], default)


class Group(Generic[_Shape]):
    """Options declared once that build one frozen shape (a dataclass whose fields are
    the options' parameter names): the values Typer parses become ``shape(**values)``.

    Immutable: `but`, `without`, `only` and ``+`` make new groups.
    """

    def __init__(self, shape: type[_Shape], **options: Opt) -> None:
        self.shape = shape
        self.options = options

    def but(self, **changes: Any) -> Group[_Shape]:
        """The same options with other defaults (a value) or another option in the same
        place (an `Opt`: another help text or type)."""
        unknown = set(changes) - set(self.options)
        assert not unknown, f"not options of this group: {unknown}"
        return Group(
            self.shape,
            **{
                name: c if isinstance(c, Opt) else o._replace(default=c)
                for name, o in self.options.items()
                for c in [changes.get(name, o)]
            },
        )

    def without(self, *names: str) -> Group[_Shape]:
        """The options but `names` (their fields keep the shape's defaults)."""
        assert set(names) <= set(self.options), set(names) - set(self.options)
        return Group(self.shape, **{n: o for n, o in self.options.items() if n not in names})

    def only(self, *names: str) -> Group[_Shape]:
        """The options `names` alone, in this group's order."""
        assert set(names) <= set(self.options), set(names) - set(self.options)
        return Group(self.shape, **{n: o for n, o in self.options.items() if n in names})

    def __add__(self, other: Group[_Shape]) -> Group[_Shape]:
        assert other.shape is self.shape and not set(other.options) & set(self.options)
        return Group(self.shape, **self.options, **other.options)

    def parameters(self) -> list[inspect.Parameter]:
        """The options as keyword parameters, as Typer reads them from a signature."""
        kind = inspect.Parameter.KEYWORD_ONLY
        return [
            inspect.Parameter(name, kind, default=o.default, annotation=o.annotation)
            for name, o in self.options.items()
        ]

    def build(self, values: dict[str, Any]) -> _Shape:
        """The shape from the options' values, taken out of `values` (Typer's, by name).

        Raises:
            ConfigError: as the shape's validation, naming the flag.
        """
        return self.shape(**{name: values.pop(name) for name in self.options})


def grouped(command: Callable[..., Any]) -> Callable[..., Any]:
    """A Typer command whose parameters annotated ``Annotated[Shape, group]`` each stand
    for the `Group`'s options: Typer sees the options in their place (``inspect.signature``
    of the returned function), and the command is called with the shape built from them,
    groups built in the order of the parameters (so the first invalid flag is named)."""
    signature = inspect.signature(command, eval_str=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, Group[Any]] = {}
    for p in signature.parameters.values():
        group = _group_of(p.annotation)
        if group is None:
            params.append(p)
        else:
            groups[p.name] = group
            params.extend(group.parameters())

    @functools.wraps(command)
    def with_shapes(**values: Any) -> Any:
        shapes = {name: group.build(values) for name, group in groups.items()}
        return command(**values, **shapes)

    with_shapes.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    # typing.get_type_hints (Typer reads it too) must see the options, not the shapes
    with_shapes.__annotations__ = {
        **{p.name: p.annotation for p in params},
        "return": signature.return_annotation,
    }
    return with_shapes


def _group_of(annotation: Any) -> Group[Any] | None:
    if get_origin(annotation) is not Annotated:
        return None
    return next((m for m in get_args(annotation)[1:] if isinstance(m, Group)), None)


#: the models and how llama.cpp runs them
MODEL = Group(
    ModelFlags,
    target=opt(
        str | None, None, "--target", "-m", help="Target model: a GGUF path or a registry name."
    ),
    draft=opt(
        str | None,
        None,
        "--draft",
        "-md",
        help="Draft model: a GGUF path, a registry name, 'ngram' (prompt lookup, no model),"
        " 'none' (ordinary decoding) or 'auto' (the smallest GGUF on disk with the target's"
        " tokenizer, see `specgen models --local`).",
    ),
    pair=opt(str | None, None, "--pair", help="A registry pair name."),
    models=Opt(ModelsOpt, None),
    n_gpu_layers=opt(int, 0, "--n-gpu-layers", "-ngl", help="Target layers on GPU."),
    n_gpu_layers_draft=opt(int, 0, "--n-gpu-layers-draft", "-ngld", help="Draft layers on GPU."),
    rpc=opt(
        str | None,
        None,
        "--rpc",
        help="ggml-rpc-server hosts, HOST:PORT[,HOST:PORT...]: -ngl puts target layers on"
        " them; the draft stays local. No authentication: trusted networks only.",
    ),
    threads=opt(int, 0, "--threads", "-t", help="CPU threads (0 = the CPUs available)."),
    ctx_size=opt(
        int,
        4096,
        "--ctx-size",
        "-c",
        help="Context size in tokens (0 = the model's own; llama.cpp rounds up to 256).",
    ),
    swa_full=opt(
        bool,
        False,
        "--swa-full",
        help="Full-size cache for sliding-window layers (Gemma 3): more memory, and no"
        " re-evaluation after rollbacks deeper than the window.",
    ),
    flash_attn=opt(
        str,
        "auto",
        "--flash-attn",
        "-fa",
        help="llama.cpp's flash attention, both models: 'on', 'off' or 'auto' (its default)."
        " 'off' makes logits independent of how a context is split into decodes (scoring).",
    ),
    draft_p_min=opt(
        float, 0.0, "--draft-p-min", help="Stop a block when the draft's top p < P (0 to 1)."
    ),
    lookup=opt(
        str | None,
        None,
        "--lookup",
        help="With a draft model: propose tokens by prompt lookup where the text copies"
        " its context and the model elsewhere: 'on', 'off' or 'auto' (default: on).",
    ),
)
#: how to sample (both models, under the same settings), draft and stop
SAMPLING = Group(
    SamplingFlags,
    max_tokens=opt(int, 256, "--max-tokens", "-n", help="Tokens to generate."),
    temp=opt(float, 0.8, "--temp", help="Temperature; 0 or below = greedy (as in llama.cpp)."),
    top_k=opt(int, 40, "--top-k", help="Top-k (0 or negative = off, as in llama.cpp)."),
    top_p=opt(float, 0.95, "--top-p", help="Top-p (1 = off)."),
    min_p=opt(float, 0.05, "--min-p", help="Min-p (0 = off)."),
    logit_bias=opt(
        list[str] | None,
        None,
        "--logit-bias",
        "-l",
        help="TOKEN_ID(+|-)BIAS added to that token's logit, e.g. 15043+1 or 15043-inf to"
        " ban it (repeatable; as in llama.cpp).",
    ),
    repeat_penalty=opt(
        float,
        1.0,
        "--repeat-penalty",
        help="Penalize tokens seen in the last --repeat-last-n (1.0 = off, as in llama.cpp;"
        " 0.01 to 100).",
    ),
    repeat_last_n=opt(
        int,
        64,
        "--repeat-last-n",
        help="Tokens the penalties look back, prompt included (0 = off, -1 = the context).",
    ),
    presence_penalty=opt(
        float, 0.0, "--presence-penalty", help="Subtracted from a token seen (-2 to 2; 0 = off)."
    ),
    frequency_penalty=opt(
        float,
        0.0,
        "--frequency-penalty",
        help="Subtracted per time a token was seen (-2 to 2; 0 = off).",
    ),
    seed=opt(
        int | None, None, "--seed", help="Random seed; -1 or omitted = random (as in llama.cpp)."
    ),
    draft_max=opt(
        str, "auto", "--draft-max", help="Block size K, or 'auto' to adapt it each round."
    ),
    stop=opt(
        list[str] | None,
        None,
        "--stop",
        help="Stop string (repeatable): the text ends where it begins.",
    ),
    ignore_eos=opt(
        bool,
        False,
        "--ignore-eos",
        help="Do not stop at end of generation (EOS, end of turn): an end token drawn is"
        " kept, as empty text (llama.cpp bans end tokens instead).",
    ),
    verify=opt(
        str | None,
        None,
        "--verify",
        help="Acceptance rule: 'block' (block verification), 'token' (token by token) or"
        " 'auto' (default: block at --temp > 0, where it accepts more; the two are equal"
        " when greedy). Both keep the target's distribution exactly.",
    ),
)
#: what the output must match (at most one of them)
GRAMMAR = Group(
    SamplingFlags,
    grammar=opt(
        str | None,
        None,
        "--grammar",
        help="A GBNF grammar the output must match (as in llama-cli; a Lark grammar is taken too).",
    ),
    grammar_file=opt(Path | None, None, "--grammar-file", help="Read the --grammar from FILE."),
    json_schema=opt(
        str | None,
        None,
        "--json-schema",
        "-j",
        help='A JSON Schema the output must follow, e.g. \'{"type": "object"}\' for any'
        " JSON object ('{}' allows any JSON value).",
    ),
    json_schema_file=opt(
        Path | None, None, "--json-schema-file", help="Read the --json-schema from FILE."
    ),
)
LOGPROBS = Group(
    SamplingFlags,
    logprobs=opt(
        int | None,
        None,
        "--logprobs",
        help="With --json: each token's log-probability under the target's raw logits,"
        " with the N (0-20) most likely tokens there.",
    ),
)
#: what a command shows and writes
OUTPUT = Group(
    OutputFlags,
    json_out=Opt(JsonOpt, False),
    no_live=opt(bool, False, "--no-live", help="Plain text even on a TTY."),
    show_rejected=opt(
        bool, False, "--show-rejected", help="Show rejected proposals struck through."
    ),
    trace=opt(Path | None, None, "--trace", help="Write one JSON object per round to FILE.jsonl."),
    verbose=opt(bool, False, "--verbose", help="Show llama.cpp's log lines."),
)
#: how the prompt becomes tokens
PROMPT = Group(
    PromptFlags,
    raw=opt(bool, False, "--raw", help="Send the prompt as it is, without the chat template."),
    system=opt(str | None, None, "--system", help="System message (needs a chat template)."),
    chat_template=opt(
        Path | None,
        None,
        "--chat-template",
        help="Jinja2 chat template FILE instead of the one in the target's GGUF.",
    ),
)
