"""`specgen bench`: the Typer command, a Rich progress bar over generations, and the
result table. Measurement lives in `specgen.bench`."""

from __future__ import annotations

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
    TargetOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    TraceOpt,
    VerboseOpt,
)

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
    temp: Annotated[str, typer.Option("--temp", help="Temperatures, e.g. 0,0.8.")] = "0",
    runs: Annotated[int, typer.Option("--runs", help="Repetitions of each prompt.")] = 3,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", help="Tokens per generation (EOS ignored).")
    ] = 128,
    seed: Annotated[int, typer.Option("--seed", help="Base random seed.")] = 1234,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    draft_p_min: DraftPMinOpt = 0.0,
    n_gpu_layers: NglOpt = 0,
    n_gpu_layers_draft: NgldOpt = 0,
    threads: ThreadsOpt = 0,
    ctx_size: CtxOpt = 4096,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write every figure and the record.")
    ] = None,
    markdown_path: Annotated[
        Path | None, typer.Option("--markdown", help="Write README-ready tables.")
    ] = None,
    plot_path: Annotated[
        Path | None,
        typer.Option("--plot", help="Write a PNG (needs: pip install 'specgen\\[plot]')."),
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
        n_gpu_layers=n_gpu_layers, n_gpu_layers_draft=n_gpu_layers_draft,
        threads=threads, ctx_size=ctx_size, json_path=json_path,
        markdown_path=markdown_path, plot_path=plot_path, compare=compare,
        trace=trace, verbose=verbose,
    )  # fmt: skip


def run_bench_command(**a: Any) -> None:
    """Validate everything cheap first, load and measure with a progress bar, then
    write the outputs and print the table."""
    import dataclasses

    from rich.console import Console

    from specgen import bench
    from specgen.errors import ConfigError
    from specgen.llamacpp import set_verbose
    from specgen.models.resolve import resolve_models
    from specgen.session import DRAFT_NONE, ModelSpec

    set_verbose(a["verbose"])
    if a["draft"] == DRAFT_NONE:
        raise ConfigError(
            "bench compares ordinary with speculative decoding: give a draft model or"
            " 'ngram', not 'none'"
        )
    if a["runs"] < 1:
        raise ConfigError(f"--runs must be at least 1, got {a['runs']}")
    if a["max_tokens"] < 2:
        raise ConfigError(f"-n must be at least 2, got {a['max_tokens']}")
    if a["plot_path"] is not None:
        bench.check_plot_available()
    for opt in ("json_path", "markdown_path", "plot_path"):
        p = a[opt]
        if p is not None and not Path(p).parent.resolve().is_dir():
            raise ConfigError(f"--{opt.split('_')[0]}: no such directory: {Path(p).parent}")
    settings = bench.BenchSettings(
        draft_max=bench.parse_draft_max_list(a["draft_max"]),
        temps=bench.parse_temp_list(a["temp"]),
        runs=a["runs"],
        n_tokens=a["max_tokens"],
        seed=a["seed"],
        top_k=a["top_k"],
        top_p=a["top_p"],
        min_p=a["min_p"],
        trace=a["trace"] is not None,
    )
    settings.params(settings.temps[0])  # validates top-p / min-p now
    prompts = bench.load_prompts(a["prompts"])

    err = Console(stderr=True)
    with err.status("preparing models") as spinner:
        target, draft, pair_k = resolve_models(
            a["target"], a["draft"], a["pair"], a["models"], lambda m: spinner.update(m)
        )
    settings = dataclasses.replace(settings, k_init=pair_k)  # auto starts as `run` would
    spec = ModelSpec.from_flags(
        target, draft, a["ctx_size"], a["n_gpu_layers"], a["n_gpu_layers_draft"], a["threads"]
    )
    writer = None
    if a["trace"] is not None:
        from specgen.trace import TraceWriter

        writer = TraceWriter(
            a["trace"], target=spec.target.name, draft=Path(str(spec.draft)).name,
            params=settings.params(settings.temps[0]), seed=settings.seed,
            max_tokens=settings.n_tokens, command="bench",
        )  # fmt: skip
    try:
        result = _measure(err, bench, spec, prompts, settings, a["draft_p_min"], writer)
    finally:
        if writer is not None:
            writer.close()
    if a["compare"] is not None:
        result.compared = bench.compare_with(result, a["compare"])
    if a["json_path"] is not None:
        bench.write_json(result, a["json_path"])
    if a["markdown_path"] is not None:
        bench.write_markdown(result, a["markdown_path"])
    if a["plot_path"] is not None:
        bench.write_plot(result, a["plot_path"])
    out = Console()
    if not out.is_terminal:  # a file or pipe: room for the whole table
        out = Console(width=130)
    out.print(render_table(result))
    out.print(render_costs(result))
    out.print(render_kinds(result))
    for a in result.auto_vs_best:
        out.print(bench.auto_vs_best_text(a), highlight=False)
    for w in result.warnings:
        err.print(f"[yellow]note:[/] {w}", highlight=False)
    if result.compared is not None:
        c = result.compared
        if c["comparable"]:
            err.print(f"same record as {c['file']}: the runs are comparable", highlight=False)
        else:
            err.print(
                f"[yellow]not comparable with {c['file']}:[/] the record differs in "
                + "; ".join(c["differences"][:8])
                + (" …" if len(c["differences"]) > 8 else ""),
                highlight=False,
            )
        for row in c["speedups"]:
            err.print(
                f"  temp {row['temp']:g} K {row['draft_max']}: speedup {row['before']:.2f}×"
                f" -> {row['now']:.2f}×",
                highlight=False,
            )
    err.print(bench.describe_record(result.record), style="dim", highlight=False)


def _give_vocab(writer):
    from specgen.trace import token_text_of

    return lambda loaded: writer.set_token_text(token_text_of(loaded.target))


def _trace_hook(writer, settings):
    """bench's on_event seam -> one trace generation per measured run."""
    if writer is None:
        return None
    from specgen.events import Prefilled

    def on_event(info, event) -> None:
        if isinstance(event, Prefilled):
            writer.begin(
                params=settings.params(info["temp"]), seed=info["seed"], k=info["draft_max"],
                mode=info["mode"], prompt=info["prompt_id"], run=info["run"],
            )  # fmt: skip
        writer.write(event)

    return on_event


def _measure(err, bench, spec, prompts, settings, draft_p_min, writer=None):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("loading models", total=None)

        last = [""]

        def on_progress(p) -> None:
            bar.update(task, completed=p.done, total=p.total, description=p.description)
            stage = p.description.split(" · ")[0]
            if not err.is_terminal and stage != last[0]:  # a log line per configuration
                last[0] = stage
                err.print(f"[{p.done}/{p.total}] {stage}", highlight=False, markup=False)

        def on_status(msg: str) -> None:
            bar.update(task, description=msg)

        result = bench.bench(
            spec, prompts, settings, draft_p_min, progress=on_progress, status=on_status,
            on_event=_trace_hook(writer, settings),
            on_loaded=None if writer is None else _give_vocab(writer),
        )  # fmt: skip
    if not err.is_terminal:
        n = len(result.runs)
        err.print(f"measured {n} generations", highlight=False)
    return result


def _fmt(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _slow(x: float | None) -> bool:
    return x is not None and x < 1


def render_table(result):
    """Speed per configuration: throughput, speedup with its interval, acceptance, bound."""
    from rich.table import Table

    from specgen import bench

    t = Table(title="speculative vs ordinary decoding", title_justify="left")
    for name in ("temp", "K", "ord tok/s", "spec tok/s", "speedup [95% CI]", "accept",
                 "tok/pass", "bound", "achieved"):  # fmt: skip
        t.add_column(name, justify="left" if name.startswith("speedup") else "right")
    for c in result.configs:
        o = c["overall"]
        sp = bench.speedup_text(o)
        t.add_row(
            f"{c['temp']:g}",
            c["draft_max"],
            _fmt(o["ordinary"]["tokens_per_s"], ".1f"),
            _fmt(o["speculative"]["tokens_per_s"], ".1f"),
            f"[red]{sp} slower[/]" if _slow(o["speedup"]) else f"[green]{sp}[/]",
            bench.pct(o["acceptance_rate"]),
            _fmt(o["tokens_per_pass"], ".2f"),
            _fmt(o["theoretical_speedup"], ".2f") + "×",
            bench.pct(o["achieved_fraction"]),
        )
    return t


def render_costs(result):
    """Latency and cost per configuration: TTFT, per-token percentiles, time split, memory."""
    from rich.table import Table

    t = Table(title="latency and time split", title_justify="left")
    for name in ("temp", "K", "TTFT ms ord/spec", "ord p50/p95/p99 ms", "spec p50/p95/p99 ms",
                 "draft/verify/sample/other", "peak RSS"):  # fmt: skip
        t.add_column(name, justify="right")
    for c in result.configs:
        o = c["overall"]
        ts = o["time_split_s"]
        dec = ts["decode"] or 0
        split = (
            " / ".join(
                f"{(ts[k] or 0) / dec:.0%}" for k in ("draft", "verify", "sampling", "other")
            )
            if dec
            else "–"
        )
        t.add_row(
            f"{c['temp']:g}",
            c["draft_max"],
            f"{o['ordinary']['ttft_s'] * 1000:.0f} / {o['speculative']['ttft_s'] * 1000:.0f}",
            _lat(o["ordinary"]["latency_ms"]),
            _lat(o["speculative"]["latency_ms"]),
            split,
            f"{o['peak_rss_bytes'] / 2**20:.0f} MiB",
        )
    return t


def _lat(lat) -> str:
    return " / ".join(_fmt(lat[q], ".1f") for q in ("p50", "p95", "p99"))


def render_kinds(result):
    """Speedup (acceptance) by prompt kind, one column per configuration."""
    from rich.table import Table

    from specgen import bench

    t = Table(title="speedup by prompt kind (acceptance)", title_justify="left")
    t.add_column("kind")
    for c in result.configs:
        t.add_column(f"t{c['temp']:g} K{c['draft_max']}", justify="right")
    kinds = list(dict.fromkeys(k for c in result.configs for k in c["by_kind"]))
    for kind in kinds:
        cells = []
        for c in result.configs:
            s = c["by_kind"].get(kind)
            if s is None or s["speedup"] is None:
                cells.append("–")
                continue
            color = "red" if _slow(s["speedup"]) else "green"
            cells.append(f"[{color}]{s['speedup']:.2f}×[/] ({bench.pct(s['acceptance_rate'])})")
        t.add_row(kind, *cells)
    return t
