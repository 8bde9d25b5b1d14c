"""`specgen run`: the Typer command, and below it what the command does: resolve the models,
load them, drive the loop, and write plain text, JSON or the live view.

The model-side modules (numpy, llama.cpp) and the live view are imported inside the functions
so that `specgen --help` and the other commands start without loading them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from specgen.cli.options import (
    ChatTemplateOpt,
    CtxOpt,
    DraftMaxOpt,
    DraftOpt,
    DraftPMinOpt,
    JsonOpt,
    MinPOpt,
    ModelsOpt,
    NgldOpt,
    NglOpt,
    NoLiveOpt,
    PairOpt,
    RawOpt,
    RpcOpt,
    SeedOpt,
    ShowRejectedOpt,
    SwaFullOpt,
    SystemOpt,
    TargetOpt,
    TempOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    TraceOpt,
    VerboseOpt,
    check_model_flags,
    check_output_path,
    check_sampling_flags,
    check_stop_strings,
    seed_or_random,
)
from specgen.errors import ConfigError, PromptError
from specgen.events import ACCEPTANCE_HOW, Done, Prefilled, Step
from specgen.models.resolve import DRAFT_NONE, resolve_models
from specgen.ui import output

if TYPE_CHECKING:
    from specgen.sampling import SamplingParams

EXIT_INTERRUPTED = 130
# why a seeded `auto` run is not reproducible (issue 15): K follows measured timings, and
# each block size draws a different number of random numbers
SEED_NOTE = (
    "with --draft-max auto the block sizes follow measured timings, so at --temp > 0 the"
    " text can differ between runs with the same --seed; a fixed --draft-max reproduces it"
)


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
    raw: bool = False  # --raw: no chat template
    system: str | None = None  # --system TEXT
    chat_template: Path | None = None  # --chat-template FILE
    seed_given: bool = False  # --seed was on the command line (not a random one)
    swa_full: bool = False  # --swa-full


EPILOG = (
    "Examples:\n\n"
    "  specgen run 'Once upon a time'                 # embedded demo pair\n\n"
    "  specgen run -m big.gguf -md small.gguf -n 128 --temp 0 'def fib(n):'\n\n"
    "  echo 'Summarize: ...' | specgen run --pair qwen2.5-coder-7b --json\n\n"
    "  specgen run -m big.gguf --draft none 'Hello'    # ordinary decoding (baseline)\n\n"
    "  specgen run -m instruct.gguf -md small.gguf --system 'Be brief.' 'Write a haiku.'\n\n"
    "  specgen run -m instruct.gguf -md small.gguf --raw 'Once upon a time'  # no template"
)


def register(app: typer.Typer) -> None:
    """Add the `run` command to `app`."""
    app.command("run", epilog=EPILOG)(run)


def _read_prompt(prompt: str | None) -> bytes:
    from specgen.ui.output import notice

    if prompt is None or prompt == "-":
        if sys.stdin.isatty():  # otherwise the command seems to hang
            notice("reading the prompt from stdin: type it, then Ctrl-D on a new line to end")
        # byte for byte: a trailing newline is part of the prompt
        return sys.stdin.buffer.read()
    if "\n" not in prompt and len(prompt) < 4096 and _is_file(prompt):
        notice(
            f"the prompt is the text {prompt!r}, not the file's contents:"
            f" to generate from the file, run `specgen run ... < {prompt}`"
        )
    return prompt.encode("utf-8", "surrogateescape")


def _is_file(name: str) -> bool:
    try:
        return Path(name).expanduser().is_file()
    except (OSError, ValueError):  # a name too long or with a NUL is not a file
        return False


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
    no_live: NoLiveOpt = False,
    show_rejected: ShowRejectedOpt = False,
    n_gpu_layers: NglOpt = 0,
    n_gpu_layers_draft: NgldOpt = 0,
    rpc: RpcOpt = None,
    threads: ThreadsOpt = 0,
    ctx_size: CtxOpt = 4096,
    swa_full: SwaFullOpt = False,
    verbose: VerboseOpt = False,
    trace: TraceOpt = None,
    raw: RawOpt = False,
    system: SystemOpt = None,
    chat_template: ChatTemplateOpt = None,
) -> None:
    """Generate text with a draft and a target model (or the target alone).

    When the target carries a chat template (instruct models), the prompt is sent as one
    user message in it, as llama-cli and Ollama do; --raw sends the text as it is.
    """
    if max_tokens < 1:
        raise ConfigError(f"-n must be at least 1, got {max_tokens}")
    # every flag is checked before the prompt is read (stdin may wait for the user)
    check_model_flags(
        target=target,
        draft=draft,
        ctx_size=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
    )
    check_sampling_flags(temp=temp, draft_p_min=draft_p_min)
    stops = check_stop_strings(stop)
    from specgen.sampling import SamplingParams
    from specgen.session import parse_draft_max

    SamplingParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p)  # checks --top-p, --min-p
    parse_draft_max(draft_max)
    seed_given = seed is not None and seed != -1
    seed = seed_or_random(seed)
    if trace is not None:
        check_output_path("--trace", trace)
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
            seed_given=seed_given,
            draft_max=draft_max,
            draft_p_min=draft_p_min,
            stop=stops,
            ignore_eos=ignore_eos,
            json_out=json_out,
            live=not (no_live or json_out) and output.stdout_is_terminal(),
            show_rejected=show_rejected,
            n_gpu_layers=n_gpu_layers,
            n_gpu_layers_draft=n_gpu_layers_draft,
            threads=threads,
            ctx_size=ctx_size,
            verbose=verbose,
            trace=trace,
            rpc=rpc,
            raw=raw,
            system=system,
            chat_template=chat_template,
            swa_full=swa_full,
        )
    )
    raise typer.Exit(code)


def execute(a: RunArgs) -> int:
    """Run one generation; returns the exit code (0, or 130 after Ctrl-C)."""
    from specgen.chat import build_prompt
    from specgen.generate import GenerateConfig, check_prompt, generate
    from specgen.llamacpp import set_verbose
    from specgen.sampling import SamplingParams
    from specgen.session import make_policy, parse_draft_max

    set_verbose(a.verbose, output.log)
    if not a.prompt:
        raise PromptError("the prompt is empty")
    seed = seed_or_random(a.seed)  # a caller of execute() may leave it None
    params = SamplingParams(temp=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p)
    draft_max = parse_draft_max(a.draft_max)
    if a.live:
        from specgen.ui import live as view

        err = output.err_console()
        with view.loading_status(err, "preparing models", "models ready") as spinner:
            loaded, pair_k, loaded_notes = _load(a, params, lambda msg: spinner.update(msg))
    else:
        loaded, pair_k, loaded_notes = _load(a, params, None)
    for w in loaded.warnings:
        output.warning(w)
    if a.seed_given and draft_max is None and params.temp > 0 and loaded.drafter is not None:
        output.notice(SEED_NOTE)
    writer = None
    events: Any = None  # a generator: closed below while the engines exist
    try:
        from specgen.ui.output import notice

        prompt, template = build_prompt(
            loaded.target,
            a.prompt,
            raw=a.raw,
            system=a.system,
            template_file=a.chat_template,
        )
        check_prompt(prompt, loaded.target.n_ctx)  # an error is said alone, before notes
        for note in [*loaded_notes, *_fit_notes(len(prompt), a.max_tokens, loaded.target.n_ctx)]:
            notice(note)
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
        if not loaded.warnings:  # one warning about the pair at most
            events = _warn_slow_draft(events)
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
            info = template.to_dict() if template is not None else None
            return _run_json(events, loaded.target.name, loaded.draft_name, seed, policy, info)
        if a.live:
            # echoed dimmed above the reply: the raw text it continues, or the user's message
            shown = a.prompt.decode("utf-8", "replace")
            if template is not None:
                shown = shown.rstrip("\n") + "\n"
            return _run_live(events, loaded.target.name, loaded.draft_name, a.show_rejected, shown)
        return _run_plain(events)
    finally:
        # The generator restores the caches when closed: close it while the engines
        # still exist (a pipe closed by the reader leaves it suspended here).
        if events is not None:
            events.close()
        if writer is not None:
            writer.close()
        loaded.close()


def _fit_notes(n_prompt: int, max_tokens: int, n_ctx: int) -> list[str]:
    """A warning when the prompt plus -n cannot fit the context: generation would stop
    early with finish reason "context". The context holds the prompt and all generated
    tokens but the last (which is never evaluated), hence the + 1."""
    room = n_ctx - n_prompt + 1
    if n_prompt >= n_ctx or max_tokens <= room:
        return []  # a prompt that fills the context is refused with its own error
    return [
        f"the prompt ({n_prompt} tokens) plus -n {max_tokens} do not fit the context of"
        f" {n_ctx}: generation stops after at most {room} tokens (raise -c to go further)"
    ]


def _warn_slow_draft(events):
    """Pass the events through; warn when the draft's pass, timed after the prompt, is
    slower than the target's. Closing this generator closes `events`."""
    from specgen.events import Prefilled
    from specgen.session import slow_draft_warning

    try:
        for ev in events:
            if isinstance(ev, Prefilled):
                w = slow_draft_warning(ev.ordinary_token_s, ev.draft_token_s)
                if w is not None:
                    output.warning(w)
            yield ev
    finally:
        events.close()


def _load(a: RunArgs, params: SamplingParams, status):
    from specgen.session import ModelSpec, load, load_notes

    target_path, draft_path, pair_k = resolve_models(a.target, a.draft, a.pair, a.models, status)
    spec = ModelSpec.from_flags(
        target_path,
        draft_path,
        a.ctx_size,
        a.n_gpu_layers,
        a.n_gpu_layers_draft,
        a.threads,
        a.rpc,
        swa_full=a.swa_full,
    )
    loaded = load(spec, params, draft_p_min=a.draft_p_min, status=status)
    return loaded, pair_k, load_notes(spec, loaded)


def _run_live(
    events, target_name: str, draft_name: str, show_rejected: bool, prompt: str = ""
) -> int:
    from specgen.llamacpp import backend
    from specgen.ui import live as view

    state = view.ViewState(
        target_name,
        None if draft_name == DRAFT_NONE else draft_name,
        show_rejected=show_rejected,
        backend=backend(),
        prompt=prompt,
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
    # UTF-8 bytes whatever the console encoding; flushed per round so pipes stream.
    done: Done | None = None
    written = 0
    last = ""
    # a terminal gets a final newline so the prompt after it starts on its own line;
    # a pipe or file gets the text byte for byte
    end_line = output.stdout_is_terminal()
    try:
        for ev in events:
            text = ev.text if isinstance(ev, Step) else ""
            if isinstance(ev, Done):
                done = ev
                text = ev.text[written:]  # text released only at the end (held bytes)
            if text:
                output.write_text(text)
                written += len(text)
                last = text[-1]
    except KeyboardInterrupt:
        events.close()
        if end_line and last != "\n":
            output.write_text("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`| head`): stop generating and exit quietly
        events.close()
        output.discard_stdout()
        return 0
    if end_line and written and last != "\n":
        output.write_text("\n")
    return EXIT_INTERRUPTED if done and done.finish_reason == "interrupted" else 0


def _run_json(
    events,
    target_name: str,
    draft_name: str,
    seed: int | None,
    policy,
    chat_template: dict[str, str] | None = None,
) -> int:
    from specgen.llamacpp import backend

    done: Done | None = None
    prefilled: Prefilled | None = None
    try:
        for ev in events:
            if isinstance(ev, Done):
                done = ev
            elif isinstance(ev, Prefilled):
                prefilled = ev
    except KeyboardInterrupt:
        if done is None:  # Ctrl-C outside the loop's own handling: nothing to report
            raise
        # the loop closed the generation first (finish reason "interrupted"): report it
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
        "backend": backend(),
        "chat_template": chat_template,
        "stats": {**stats, "k_history": done.stats.k_history},
    }
    if hasattr(policy, "summary"):  # the adaptive controller: its decisions, visible
        obj["controller"] = policy.summary()
    del prefilled
    output.write_json(obj)
    return EXIT_INTERRUPTED if done.finish_reason == "interrupted" else 0
