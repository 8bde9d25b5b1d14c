"""`specgen bench`: the Typer command. Measurement lives in `specgen.bench`, the progress bar
in `specgen.ui.progress`, the tables in `specgen.ui.reports`; all three (numpy, llama.cpp)
are imported inside the command so that `specgen --help` and the other commands start fast."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from specgen.cli.options import (
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    MinPOpt,
    ModelsOpt,
    NgldOpt,
    NglOpt,
    PairOpt,
    RpcOpt,
    SwaFullOpt,
    TargetOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    TraceOpt,
    VerboseOpt,
    check_model_flags,
    check_output_path,
    check_sampling_flags,
    seed_or_random,
)
from specgen.errors import ConfigError
from specgen.events import Prefilled
from specgen.models.resolve import DRAFT_NONE, resolve_models
from specgen.ui import output

EPILOG = (
    "Examples:\n\n"
    "  specgen bench                                      # demo pair, built-in prompts\n\n"
    "  specgen bench --draft-max 4,8,auto --temp 0,0.8 --runs 3 -n 128 --markdown bench.md\n\n"
    "  specgen bench -m big.gguf -md small.gguf -ngl 99 -ngld 99 --json bench.json\n\n"
    "  specgen bench --pair qwen2.5-coder-7b --prompts my_prompts.jsonl --plot bench.png\n\n"
    "  specgen bench -m big.gguf --draft ngram --draft-max 4,8   # model-free drafter"
)


def register(app: typer.Typer) -> None:
    """Add the `bench` command to `app`."""
    app.command("bench", epilog=EPILOG)(bench)


def bench(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    models: ModelsOpt = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts", help="Your prompts: JSONL with a 'prompt' field, or one per line."
        ),
    ] = None,
    draft_max: Annotated[
        str, typer.Option("--draft-max", help="Block sizes to compare, e.g. 4,8,auto.")
    ] = "4,8,auto",
    temp: Annotated[
        str, typer.Option("--temp", help="Temperatures, e.g. 0,0.8 (0 or below = greedy).")
    ] = "0",
    runs: Annotated[int, typer.Option("--runs", help="Repetitions of each prompt.")] = 3,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", help="Tokens per generation (EOS ignored).")
    ] = 128,
    seed: Annotated[
        int, typer.Option("--seed", help="Base random seed (-1 = random, as in llama.cpp).")
    ] = 1234,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    draft_p_min: DraftPMinOpt = 0.0,
    n_gpu_layers: NglOpt = 0,
    n_gpu_layers_draft: NgldOpt = 0,
    rpc: RpcOpt = None,
    threads: ThreadsOpt = 0,
    ctx_size: CtxOpt = 4096,
    swa_full: SwaFullOpt = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write every figure and the record.")
    ] = None,
    markdown_path: Annotated[
        Path | None, typer.Option("--markdown", help="Write README-ready tables.")
    ] = None,
    plot_path: Annotated[
        Path | None,
        typer.Option("--plot", help="Write a PNG (needs matplotlib: pip install -e '.\\[plot]')."),
    ] = None,
    compare: Annotated[
        Path | None,
        typer.Option("--compare", help="An earlier --json result to compare with."),
    ] = None,
    trace: TraceOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Measure speculative against ordinary decoding: speedup, acceptance, latency."""
    run_bench_command(
        target=target, draft=draft, pair=pair, models=models, prompts=prompts,
        draft_max=draft_max, temp=temp, runs=runs, max_tokens=max_tokens, seed=seed,
        top_k=top_k, top_p=top_p, min_p=min_p, draft_p_min=draft_p_min,
        n_gpu_layers=n_gpu_layers, n_gpu_layers_draft=n_gpu_layers_draft, rpc=rpc,
        threads=threads, ctx_size=ctx_size, swa_full=swa_full, json_path=json_path,
        markdown_path=markdown_path, plot_path=plot_path, compare=compare,
        trace=trace, verbose=verbose,
    )  # fmt: skip


def run_bench_command(**a: Any) -> None:
    """Validate everything cheap first, load and measure with a progress bar, then
    write the outputs and print the table."""
    from specgen import bench
    from specgen.llamacpp import set_verbose
    from specgen.session import ModelSpec, load_notes
    from specgen.ui import reports

    set_verbose(a["verbose"], output.log)
    if a["draft"] == DRAFT_NONE:
        raise ConfigError(
            "bench compares ordinary with speculative decoding: give a draft model or"
            " 'ngram', not 'none'"
        )
    if a["runs"] < 1:
        raise ConfigError(f"--runs must be at least 1, got {a['runs']}")
    if a["max_tokens"] < 2:
        raise ConfigError(f"-n must be at least 2, got {a['max_tokens']}")
    check_model_flags(
        target=a["target"], draft=a["draft"], ctx_size=a["ctx_size"], threads=a["threads"],
        n_gpu_layers=a["n_gpu_layers"], n_gpu_layers_draft=a["n_gpu_layers_draft"],
    )  # fmt: skip
    check_sampling_flags(temp=0.0, draft_p_min=a["draft_p_min"])  # --temp: a list, below
    if a["plot_path"] is not None:
        bench.check_plot_available()
    # every input and output path now: a wrong one must not cost a benchmark of minutes
    for flag, key in (("--json", "json_path"), ("--markdown", "markdown_path"),
                      ("--plot", "plot_path"), ("--trace", "trace")):  # fmt: skip
        if a[key] is not None:
            check_output_path(flag, Path(a[key]))
    earlier = bench.load_earlier(a["compare"]) if a["compare"] is not None else None
    settings = bench.BenchSettings(
        draft_max=bench.parse_draft_max_list(a["draft_max"]),
        temps=bench.parse_temp_list(a["temp"]),
        runs=a["runs"],
        n_tokens=a["max_tokens"],
        seed=seed_or_random(a["seed"]),
        top_k=a["top_k"],
        top_p=a["top_p"],
        min_p=a["min_p"],
        trace=a["trace"] is not None,
    )
    settings.params(settings.temps[0])  # validates top-p / min-p now
    prompts = bench.load_prompts(a["prompts"])

    with output.spinner("preparing models") as spinner:
        target, draft, pair_k = resolve_models(
            a["target"], a["draft"], a["pair"], a["models"], lambda m: spinner.update(m)
        )
    settings = dataclasses.replace(settings, k_init=pair_k)  # auto starts as `run` would
    spec = ModelSpec.from_flags(
        target,
        draft,
        a["ctx_size"],
        a["n_gpu_layers"],
        a["n_gpu_layers_draft"],
        a["threads"],
        a["rpc"],
        swa_full=a["swa_full"],
    )
    for note in load_notes(spec):  # before measuring: a run of minutes at CPU speed
        output.notice(note)
    writer = None
    if a["trace"] is not None:
        from specgen.trace import TraceWriter

        writer = TraceWriter(
            a["trace"], target=spec.target.name, draft=Path(str(spec.draft)).name,
            params=settings.params(settings.temps[0]), seed=settings.seed,
            max_tokens=settings.n_tokens, command="bench",
        )  # fmt: skip
    try:
        result = _measure(bench, spec, prompts, settings, a["draft_p_min"], writer)
    except bench.BenchInterrupted as e:
        # Ctrl-C: the tables of what was finished, marked incomplete; no file is written
        # (--json, --markdown and --plot hold complete results only), then exit 130
        if e.result.configs:
            why = "interrupted (Ctrl-C); no file written"
            tables, notes = reports.render_bench(e.result, incomplete=why)
            output.show(*tables)
            output.note(*notes)
        raise KeyboardInterrupt from None
    finally:
        if writer is not None:
            writer.close()
    if a["compare"] is not None:
        result.compared = bench.compare_with(result, a["compare"], earlier)
    if a["json_path"] is not None:
        bench.write_json(result, a["json_path"])
    if a["markdown_path"] is not None:
        bench.write_markdown(result, a["markdown_path"])
    if a["plot_path"] is not None:
        bench.write_plot(result, a["plot_path"])
    tables, notes = reports.render_bench(result)
    output.show(*tables)  # a file or pipe: unwrapped, room for the whole table
    output.note(*notes)


def _give_vocab(writer):
    from specgen.trace import token_text_of

    return lambda loaded: writer.set_token_text(token_text_of(loaded.target))


def _trace_hook(writer, settings):
    """bench's on_event seam -> one trace generation per measured run."""
    if writer is None:
        return None

    def on_event(info, event) -> None:
        if isinstance(event, Prefilled):
            writer.begin(
                params=settings.params(info["temp"]), seed=info["seed"], k=info["draft_max"],
                mode=info["mode"], prompt=info["prompt_id"], run=info["run"],
            )  # fmt: skip
        writer.write(event)

    return on_event


def _measure(bench, spec, prompts, settings, draft_p_min, writer=None):
    from specgen.ui.progress import bench_progress

    err = output.err_console()
    with bench_progress(err) as (on_progress, on_status):
        result = bench.bench(
            spec, prompts, settings, draft_p_min, progress=on_progress, status=on_status,
            on_event=_trace_hook(writer, settings),
            on_loaded=None if writer is None else _give_vocab(writer),
        )  # fmt: skip
    if not err.is_terminal:
        n = len(result.runs)
        output.status_line(f"measured {n} generations")
    return result
