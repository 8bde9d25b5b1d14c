"""`specgen run`: the Typer command, and below it what the command does: resolve the models,
load them, drive the loop, and write plain text, JSON or the live view.

The model-side modules are imported inside the functions so that `specgen --help` and the
other commands start without loading llama.cpp.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from specgen.cli.options import (
    CtxOpt,
    DraftMaxOpt,
    DraftOpt,
    DraftPMinOpt,
    JsonOpt,
    MinPOpt,
    ModelsOpt,
    NgldOpt,
    NglOpt,
    PairOpt,
    RpcOpt,
    SeedOpt,
    TargetOpt,
    TempOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    TraceOpt,
    VerboseOpt,
)
from specgen.errors import ConfigError, PromptError

if TYPE_CHECKING:
    from specgen.sampling import SamplingParams

EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class RunArgs:
    prompt: bytes
    target: str | None
    draft: str | None
    pair: str | None
    models: Path | None
    max_tokens: int
    temp: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    draft_max: str
    draft_p_min: float
    stop: tuple[str, ...]
    ignore_eos: bool
    json_out: bool
    live: bool
    show_rejected: bool
    n_gpu_layers: int
    n_gpu_layers_draft: int
    threads: int
    ctx_size: int
    verbose: bool
    trace: Path | None = None  # --trace FILE.jsonl (specgen.trace)
    rpc: str | None = None  # --rpc HOST:PORT[,...]


EPILOG = (
    "Examples:\n\n"
    "  specgen run 'Once upon a time'                 # embedded demo pair\n\n"
    "  specgen run -m big.gguf -md small.gguf -n 128 --temp 0 'def fib(n):'\n\n"
    "  echo 'Summarize: ...' | specgen run --pair qwen2.5-coder-7b --json\n\n"
    "  specgen run -m big.gguf --draft none 'Hello'    # ordinary decoding (baseline)"
)


def register(app: typer.Typer) -> None:
    """Add the `run` command to `app`."""
    app.command("run", epilog=EPILOG)(run)


def _read_prompt(prompt: str | None) -> bytes:
    if prompt is None or prompt == "-":
        # byte for byte: a trailing newline is part of the prompt
        return sys.stdin.buffer.read()
    return prompt.encode("utf-8", "surrogateescape")


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
    draft_p_min: DraftPMinOpt = 0.0,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="Stop string (repeatable).")
    ] = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Do not stop at EOS.")] = False,
    json_out: JsonOpt = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="Plain text even on a TTY.")] = False,
    show_rejected: Annotated[
        bool, typer.Option("--show-rejected", help="Show rejected proposals struck through.")
    ] = False,
    n_gpu_layers: NglOpt = 0,
    n_gpu_layers_draft: NgldOpt = 0,
    rpc: RpcOpt = None,
    threads: ThreadsOpt = 0,
    ctx_size: CtxOpt = 4096,
    verbose: VerboseOpt = False,
    trace: TraceOpt = None,
) -> None:
    """Generate text with a draft and a target model (or the target alone)."""
    if max_tokens < 1:
        raise ConfigError(f"-n must be at least 1, got {max_tokens}")
    code = execute(
        RunArgs(
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
            rpc=rpc,
        )
    )
    raise typer.Exit(code)


def execute(a: RunArgs) -> int:
    """Run one generation; returns the exit code (0, or 130 after Ctrl-C)."""
    from specgen.generate import GenerateConfig, generate
    from specgen.llamacpp import set_verbose
    from specgen.sampling import SamplingParams
    from specgen.session import make_policy, parse_draft_max

    set_verbose(a.verbose)
    if not a.prompt:
        raise PromptError("the prompt is empty")
    seed = a.seed if a.seed is not None else secrets.randbits(31)
    params = SamplingParams(temp=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p)
    draft_max = parse_draft_max(a.draft_max)
    if a.live:
        from specgen.ui import live as view
        from specgen.ui import output

        err = output.console(stderr=True)
        with view.loading_status(err, "preparing models", "models ready") as spinner:
            loaded, pair_k = _load(a, params, lambda msg: spinner.update(msg))
    else:
        loaded, pair_k = _load(a, params, None)
    writer = None
    events: Any = None  # a generator: closed below while the engines exist
    try:
        prompt = loaded.target.tokenize(a.prompt)
        config = GenerateConfig(
            max_tokens=a.max_tokens,
            params=params,
            stop=a.stop,
            ignore_eos=a.ignore_eos,
            seed=seed,
            # the baseline for the live view's speedup and the controller's choices
            measure_ordinary=3 if loaded.drafter is not None else 0,
            trace=a.trace is not None,
        )
        policy = make_policy(draft_max, k_init=pair_k)
        events = generate(loaded.target, loaded.drafter, prompt, config, policy)
        if a.trace is not None:  # --trace: one JSON line per round, written as it goes
            from specgen.trace import TraceWriter, tee, token_text_of

            writer = TraceWriter(
                a.trace,
                target=loaded.target.name,
                draft=loaded.draft_name,
                params=params,
                seed=seed,
                max_tokens=a.max_tokens,
                token_text=token_text_of(loaded.target),
            )
            events = tee(events, writer)
        if a.json_out:
            return _run_json(events, loaded.target.name, loaded.draft_name, seed, policy)
        if a.live:
            return _run_live(events, loaded.target.name, loaded.draft_name, a.show_rejected)
        return _run_plain(events)
    finally:
        # The generator restores the caches when closed: close it while the engines
        # still exist (a pipe closed by the reader leaves it suspended here).
        if events is not None:
            events.close()
        if writer is not None:
            writer.close()
        loaded.close()


def _load(a: RunArgs, params: SamplingParams, status):
    from specgen.models.resolve import resolve_models
    from specgen.session import ModelSpec, load

    target_path, draft_path, pair_k = resolve_models(a.target, a.draft, a.pair, a.models, status)
    spec = ModelSpec.from_flags(
        target_path,
        draft_path,
        a.ctx_size,
        a.n_gpu_layers,
        a.n_gpu_layers_draft,
        a.threads,
        a.rpc,
    )
    return load(spec, params, draft_p_min=a.draft_p_min, status=status), pair_k


def _run_live(events, target_name: str, draft_name: str, show_rejected: bool) -> int:
    from specgen.session import DRAFT_NONE
    from specgen.ui import live as view
    from specgen.ui import output

    state = view.ViewState(
        target_name, None if draft_name == DRAFT_NONE else draft_name, show_rejected=show_rejected
    )
    try:
        with view.LiveView(output.console(), state) as live:
            for ev in events:
                live.update(ev)
    except KeyboardInterrupt:
        events.close()
        return EXIT_INTERRUPTED  # the view has kept the text and printed the summary
    return EXIT_INTERRUPTED if state.finish_reason == "interrupted" else 0


def _run_plain(events) -> int:
    from specgen.events import Done, Step

    # UTF-8 bytes whatever the console encoding; flushed per round so pipes stream.
    out = sys.stdout.buffer
    done: Done | None = None
    written = 0
    try:
        for ev in events:
            text = ev.text if isinstance(ev, Step) else ""
            if isinstance(ev, Done):
                done = ev
                text = ev.text[written:]  # text released only at the end (held bytes)
            if text:
                out.write(text.encode("utf-8"))
                out.flush()
                written += len(text)
    except KeyboardInterrupt:
        events.close()
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`| head`): stop generating and exit quietly; stdout goes
        # to /dev/null so the interpreter's final flush does not complain
        events.close()
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return EXIT_INTERRUPTED if done and done.finish_reason == "interrupted" else 0


def _run_json(events, target_name: str, draft_name: str, seed: int | None, policy) -> int:
    from specgen.events import ACCEPTANCE_HOW, Done, Prefilled

    done: Done | None = None
    prefilled: Prefilled | None = None
    for ev in events:
        if isinstance(ev, Done):
            done = ev
        elif isinstance(ev, Prefilled):
            prefilled = ev
    assert done is not None
    stats = done.stats.to_dict()
    stats["wall_s"] = round(done.stats.prefill_s + done.stats.decode_s, 6)
    stats["acceptance_how"] = ACCEPTANCE_HOW
    obj = {
        "text": done.text,
        "tokens": list(done.tokens),
        "finish_reason": done.finish_reason,
        "target": target_name,
        "draft": draft_name,
        "seed": seed,
        "stats": {**stats, "k_history": done.stats.k_history},
    }
    if hasattr(policy, "summary"):  # the adaptive controller: its decisions, visible
        obj["controller"] = policy.summary()
    del prefilled
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    return EXIT_INTERRUPTED if done.finish_reason == "interrupted" else 0
