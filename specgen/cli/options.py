"""The options shared by several commands, each declared once, and the groups they come in.

A group (`Group`) is a run of options that builds one frozen shape: `MODEL` builds
`ModelFlags`, `SAMPLING` and `GRAMMAR` build `SamplingFlags` (both defined in
`specgen.flags`, which the library shares), `OUTPUT` builds `OutputFlags` and `PROMPT`
`PromptFlags` (here). A command declares a parameter per group, ``model: Annotated[ModelFlags,
MODEL]``, and `grouped` puts the group's options into the signature Typer reads, then hands
the command the shape built from their values: each shape is validated when built, every
message naming the flag. A command that shows an option with another default or help, or
lacks some, says so with `Group.but` and `Group.without`.

Each option's type and default are written once, in its shape's field: an `opt` gives only
its flag names and help (the library's shapes, which know nothing of flags), and a shape
the CLI alone builds declares each field with its option (`flag`, read back by `Group.of`).

A leaf: imports Typer, `specgen.errors` and `specgen.flags` (both cheap), so every command
module can import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import tempfile
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, NamedTuple, TypeVar, get_args, get_origin

import typer

from specgen.errors import ConfigError
from specgen.fileio import read_chat_template
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
    "FROM_SHAPE",
    "Opt",
    "OutputFlags",
    "PromptFlags",
    "SamplingFlags",
    "check_not_overwriting",
    "check_output_path",
    "grouped",
    "opt",
    "seed_or_random",
]


def check_output_path(flag: str, path: Path) -> None:
    """Refuse an output path that cannot be written, before any work: a directory, or a
    parent directory that is missing or read-only, or where no file can be created (tried:
    a permission check passes for root, and on a file system such as /proc).

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
    try:  # the results are written next to it, then renamed (`specgen.fileio`)
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        raise ConfigError(f"{flag}: cannot write {path}: {e.strerror or e}") from None


def check_not_overwriting(flag: str, path: Path | None, *others: tuple[str, Any]) -> None:
    """Refuse an output `path` that is the file of another flag (``(flag, path or name)``
    pairs; a registry name or None is no file): a --trace onto the -m model truncated it
    under llama.cpp's mapping (SIGBUS), one onto --json's file was overwritten by it.

    Raises:
        ConfigError: naming both flags.
    """
    if path is None or not path.exists():
        return
    for name, other in others:
        if other is None or not Path(other).exists():
            continue
        with contextlib.suppress(OSError):
            if os.path.samefile(path, other):
                raise ConfigError(f"{flag} and {name} name the same file: {path}")


_Shape = TypeVar("_Shape")


class _FromShape:
    def __repr__(self) -> str:
        return "<the shape's>"


#: an `Opt`'s type or default not given: the shape's field's (its annotation, its default)
FROM_SHAPE: Any = _FromShape()


class Opt(NamedTuple):
    """One option of a group: its flag names, ``typer.Option``'s other arguments (help,
    envvar, ...), and its type (as Typer reads it) and default, each `FROM_SHAPE` unless
    the option differs from its field (a tuple field read as a repeated option, another
    default for one command)."""

    names: tuple[str, ...]
    option: dict[str, Any]
    kind: Any = FROM_SHAPE
    default: Any = FROM_SHAPE

    def annotation(self) -> Any:
        """The type annotated with its ``typer.Option``, as Typer reads a parameter."""
        return Annotated[self.kind, typer.Option(*self.names, **self.option)]


def flag(
    *names: str,
    default: Any,
    kind: Any = FROM_SHAPE,
    cli_default: Any = FROM_SHAPE,
    **option: Any,
) -> Any:
    """A field of a shape the CLI alone builds, declared with its option (see `opt`):
    ``trace: Path | None = flag("--trace", default=None, help=...)``; `Group.of` reads
    the options back. `cli_default`: the option's default where it is not the field's (a
    repeated option's None for a tuple field). Returns a ``dataclasses.field``."""
    o = opt(*names, kind=kind, default=cli_default, **option)
    return dataclasses.field(default=default, metadata={"opt": o})


def opt(*names: str, kind: Any = FROM_SHAPE, default: Any = FROM_SHAPE, **option: Any) -> Opt:
    """An option with its flag names and ``typer.Option``'s other arguments (``help=...``);
    its type and default are its field's in the group's shape unless given here."""
    return Opt(names, option, kind, default)


class Group(Generic[_Shape]):
    """Options declared once that build one frozen shape (a dataclass whose fields are
    the options' parameter names): the values Typer parses become ``shape(**values)``.
    An option's type and default are its field's (written once, in the shape) unless the
    `Opt` says otherwise.

    Immutable: `but`, `without`, `only` and ``+`` make new groups.
    """

    def __init__(self, shape: type[_Shape], **options: Opt) -> None:
        self.shape = shape
        # read the shape only for options not yet resolved: the groups made from others
        # (`but`, `without`, `only`, ``+``) hold resolved ones, and every command's groups
        # are built at start-up
        hints: dict[str, Any] = {}
        fields: dict[str, dataclasses.Field[Any]] = {}
        if any(o.kind is FROM_SHAPE or o.default is FROM_SHAPE for o in options.values()):
            hints = typing.get_type_hints(shape)
            fields = {f.name: f for f in dataclasses.fields(shape)}  # type: ignore[arg-type]
        self.options = {
            name: o._replace(
                kind=hints[name] if o.kind is FROM_SHAPE else o.kind,
                default=fields[name].default if o.default is FROM_SHAPE else o.default,
            )
            for name, o in options.items()
        }
        missing = [n for n, o in self.options.items() if o.default is dataclasses.MISSING]
        assert not missing, f"give these options a default: {missing}"

    @classmethod
    def of(cls, shape: type[_Shape]) -> Group[_Shape]:
        """The options a shape declares in its fields (`flag`), in their order."""
        fields = dataclasses.fields(shape)  # type: ignore[arg-type]
        return cls(shape, **{f.name: f.metadata["opt"] for f in fields if "opt" in f.metadata})

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
            inspect.Parameter(name, kind, default=o.default, annotation=o.annotation())
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
    target=opt("--target", "-m", help="Target model: a GGUF path or a registry name."),
    draft=opt(
        "--draft",
        "-md",
        help="Draft model: a GGUF path, a registry name, 'ngram' (prompt lookup, no model),"
        " 'none' (ordinary decoding) or 'auto' (the smallest GGUF on disk with the target's"
        " tokenizer, see `specgen models --local`).",
    ),
    pair=opt("--pair", help="A registry pair name."),
    models=opt("--models", help="Extra models.yaml merged over the packaged and user ones."),
    n_gpu_layers=opt("--n-gpu-layers", "-ngl", help="Target layers on GPU."),
    n_gpu_layers_draft=opt("--n-gpu-layers-draft", "-ngld", help="Draft layers on GPU."),
    rpc=opt(
        "--rpc",
        help="ggml-rpc-server hosts, HOST:PORT[,HOST:PORT...]: -ngl puts target layers on"
        " them; the draft stays local. No authentication: trusted networks only.",
    ),
    threads=opt("--threads", "-t", help="CPU threads (0 = the CPUs available)."),
    ctx_size=opt(
        "--ctx-size",
        "-c",
        help="Context size in tokens (0 = the model's own; llama.cpp rounds up to 256).",
    ),
    swa_full=opt(
        "--swa-full",
        help="Full-size cache for sliding-window layers (Gemma 3): more memory, and no"
        " re-evaluation after rollbacks deeper than the window.",
    ),
    flash_attn=opt(
        "--flash-attn",
        "-fa",
        help="llama.cpp's flash attention, both models: 'on', 'off' or 'auto' (its default)."
        " 'off' makes logits independent of how a context is split into decodes (scoring).",
    ),
    draft_p_min=opt("--draft-p-min", help="Stop a block when the draft's top p < P (0 to 1)."),
    lookup=opt(
        "--lookup",
        help="With a draft model: propose tokens by prompt lookup where the text copies"
        " its context and the model elsewhere: 'on', 'off' or 'auto' (default: on).",
    ),
)
#: how to sample (both models, under the same settings), draft and stop
SAMPLING = Group(
    SamplingFlags,
    max_tokens=opt("--max-tokens", "-n", help="Tokens to generate."),
    temp=opt("--temp", help="Temperature; 0 or below = greedy (as in llama.cpp)."),
    top_k=opt("--top-k", help="Top-k (0 or negative = off, as in llama.cpp)."),
    top_p=opt("--top-p", help="Top-p (1 = off)."),
    min_p=opt("--min-p", help="Min-p (0 = off)."),
    logit_bias=opt(
        "--logit-bias",
        "-l",
        kind=list[str] | None,
        default=None,
        help="TOKEN_ID(+|-)BIAS added to that token's logit, e.g. 15043+1 or 15043-inf to"
        " ban it (repeatable; as in llama.cpp).",
    ),
    repeat_penalty=opt(
        "--repeat-penalty",
        help="Penalize tokens seen in the last --repeat-last-n (1.0 = off, as in llama.cpp;"
        " 0.01 to 100).",
    ),
    repeat_last_n=opt(
        "--repeat-last-n",
        help="Tokens the penalties look back, prompt included (0 = off, -1 = the context).",
    ),
    presence_penalty=opt(
        "--presence-penalty", help="Subtracted from a token seen (-2 to 2; 0 = off)."
    ),
    frequency_penalty=opt(
        "--frequency-penalty",
        help="Subtracted per time a token was seen (-2 to 2; 0 = off).",
    ),
    seed=opt("--seed", help="Random seed; -1 or omitted = random (as in llama.cpp)."),
    draft_max=opt("--draft-max", help="Block size K, or 'auto' to adapt it each round."),
    stop=opt(
        "--stop",
        kind=list[str] | None,
        default=None,
        help="Stop string (repeatable): the text ends where it begins.",
    ),
    ignore_eos=opt(
        "--ignore-eos",
        help="Do not stop at end of generation (EOS, end of turn): an end token drawn is"
        " kept, as empty text (llama.cpp bans end tokens instead).",
    ),
    verify=opt(
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
        "--grammar",
        help="A GBNF grammar the output must match (as in llama-cli; a Lark grammar is taken too).",
    ),
    grammar_file=opt("--grammar-file", help="Read the --grammar from FILE."),
    json_schema=opt(
        "--json-schema",
        "-j",
        kind=str | None,
        help='A JSON Schema the output must follow, e.g. \'{"type": "object"}\' for any'
        " JSON object ('{}' allows any JSON value).",
    ),
    json_schema_file=opt("--json-schema-file", help="Read the --json-schema from FILE."),
)
LOGPROBS = Group(
    SamplingFlags,
    logprobs=opt(
        "--logprobs",
        help="With --json: each token's log-probability under the target's raw logits,"
        " with the N (0-20) most likely tokens there.",
    ),
)


@dataclass(frozen=True)
class OutputFlags:
    """What a command shows and writes (--json, --no-live, --show-rejected, --trace,
    --verbose).

    Raises:
        ConfigError: a --trace path that cannot be written (checked when built, before any
            model is loaded or the prompt read).
    """

    json_out: bool = flag("--json", default=False, help="Print one JSON object.")
    no_live: bool = flag("--no-live", default=False, help="Plain text even on a TTY.")
    show_rejected: bool = flag(
        "--show-rejected", default=False, help="Show rejected proposals struck through."
    )
    trace: Path | None = flag(
        "--trace", default=None, help="Write one JSON object per round to FILE.jsonl."
    )
    verbose: bool = flag("--verbose", default=False, help="Show llama.cpp's log lines.")

    def __post_init__(self) -> None:
        if self.trace is not None:
            check_output_path("--trace", self.trace)


def as_text(arg: str) -> str:
    """Text from the command line or the terminal as the prompt's bytes are read: bytes
    that are not UTF-8 (which Python keeps as lone surrogates, unencodable) become U+FFFD."""
    return arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass(frozen=True)
class PromptFlags:
    """How the prompt becomes tokens (--raw, --system, --chat-template): see
    `specgen.chat.build_prompt`."""

    raw: bool = flag(
        "--raw", default=False, help="Send the prompt as it is, without the chat template."
    )
    system: str | None = flag(
        "--system", default=None, help="System message (needs a chat template)."
    )
    chat_template: Path | None = flag(
        "--chat-template",
        default=None,
        help="Jinja2 chat template FILE instead of the one in the target's GGUF.",
    )

    def __post_init__(self) -> None:
        if self.system is not None:
            object.__setattr__(self, "system", as_text(self.system))
        # before the models load (a second or more): the conflicts and the file
        if self.raw and (self.system is not None or self.chat_template is not None):
            raise ConfigError("--raw sends the prompt as it is: drop --system / --chat-template")
        if self.chat_template is not None:
            read_chat_template(self.chat_template)


#: what a command shows and writes
OUTPUT = Group.of(OutputFlags)
#: how the prompt becomes tokens
PROMPT = Group.of(PromptFlags)
#: options of groups that some commands take alone (`specgen models`, `verify --json`)
ModelsOpt = MODEL.options["models"].annotation()
JsonOpt = OUTPUT.options["json_out"].annotation()
