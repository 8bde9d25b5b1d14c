"""The `specgen` command line: thin Typer commands; errors become one line here."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

try:  # recent Typer vendors click; older ones use the click package
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

from specgen import cli_bench, cli_models, cli_verify
from specgen.errors import ConfigError, SpecgenError

app = typer.Typer(
    name="specgen",
    help="Fast local text generation with exact speculative decoding on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# -- shared options (llama.cpp's flag names) --------------------------------------------
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
    Path | None, typer.Option("--models", help="Extra models.yaml merged over the others.")
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
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's log lines.")]


def _read_prompt(prompt: str | None) -> bytes:
    if prompt is None or prompt == "-":
        # byte for byte: a trailing newline is part of the prompt
        return sys.stdin.buffer.read()
    return prompt.encode("utf-8", "surrogateescape")


@app.command(
    epilog="Examples:\n\n"
    "  specgen run 'Once upon a time'                 # embedded demo pair\n\n"
    "  specgen run -m big.gguf -md small.gguf -n 128 --temp 0 'def fib(n):'\n\n"
    "  echo 'Summarize: ...' | specgen run --pair qwen2.5-coder-7b --json\n\n"
    "  specgen run -m big.gguf --draft none 'Hello'    # ordinary decoding (baseline)"
)
def run(
    prompt: Annotated[
        str | None, typer.Argument(help="Prompt text; omit or '-' to read stdin.")
    ] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    models: ModelsOpt = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", help="Tokens to generate.")
    ] = 256,
    temp: TempOpt = 0.8,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    draft_max: DraftMaxOpt = "auto",
    draft_p_min: Annotated[
        float, typer.Option("--draft-p-min", help="Stop a block when the draft's top p < P.")
    ] = 0.0,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="Stop string (repeatable).")
    ] = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Do not stop at EOS.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="Plain text even on a TTY.")] = False,
    show_rejected: Annotated[
        bool, typer.Option("--show-rejected", help="Show rejected proposals struck through.")
    ] = False,
    n_gpu_layers: NglOpt = 0,
    n_gpu_layers_draft: NgldOpt = 0,
    threads: ThreadsOpt = 0,
    ctx_size: CtxOpt = 4096,
    verbose: VerboseOpt = False,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="Write one JSON object per round to FILE.jsonl."),
    ] = None,
) -> None:
    """Generate text with a draft and a target model (or the target alone)."""
    from specgen import commands

    if max_tokens < 1:
        raise ConfigError(f"-n must be at least 1, got {max_tokens}")
    code = commands.run(
        commands.RunArgs(
            prompt=_read_prompt(prompt),
            target=target,
            draft=draft,
            pair=pair,
            models=models,
            max_tokens=max_tokens,
            temp=temp,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            draft_max=draft_max,
            draft_p_min=draft_p_min,
            stop=tuple(stop or ()),
            ignore_eos=ignore_eos,
            json_out=json_out,
            live=not (no_live or json_out) and sys.stdout.isatty(),
            show_rejected=show_rejected,
            n_gpu_layers=n_gpu_layers,
            n_gpu_layers_draft=n_gpu_layers_draft,
            threads=threads,
            ctx_size=ctx_size,
            verbose=verbose,
            trace=trace,
        )
    )
    raise typer.Exit(code)


# Command groups that live in their own modules (each imports its heavy parts lazily).
for _module in (cli_models, cli_bench, cli_verify):
    _module.register(app)


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"specgen: error: {message}\n")
    sys.stderr.flush()
    return code


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, map known errors to one stderr line.

    Exit codes: 0 ok, 1 error, 2 usage, 130 interrupted. SPECGEN_DEBUG=1 shows tracebacks.
    """
    debug = os.environ.get("SPECGEN_DEBUG", "") not in ("", "0")
    try:
        code = app(args=argv, standalone_mode=False)
    except SpecgenError as e:
        if debug:
            traceback.print_exc()
        code = _fail(str(e), e.exit_code)
    except typer.Abort:
        code = 130
    except KeyboardInterrupt:
        code = 130
    except ClickException as e:
        e.show()
        code = e.exit_code
    except OSError as e:
        if debug:
            traceback.print_exc()
        code = _fail(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), 1)
    except Exception as e:  # noqa: BLE001 - the one place that turns bugs into a line
        if debug:
            traceback.print_exc()
        code = _fail(
            f"unexpected {type(e).__name__}: {e} (set SPECGEN_DEBUG=1 for the traceback)", 1
        )
    sys.exit(code if isinstance(code, int) else 0)
