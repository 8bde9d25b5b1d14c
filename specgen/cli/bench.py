"""`specgen bench`: the Typer command. Measurement lives in `specgen.bench`, the progress bar
in `specgen.ui.progress`, the tables in `specgen.ui.reports`; all three (numpy, llama.cpp)
are imported inside the command so that `specgen --help` and the other commands start fast."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from specgen.cli.loading import open_session, show_messages
from specgen.cli.options import (
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    FrequencyPenaltyOpt,
    GrammarFileOpt,
    GrammarOpt,
    JsonSchemaFileOpt,
    JsonSchemaOpt,
    LogitBiasOpt,
    LookupOpt,
    MinPOpt,
    ModelFlags,
    ModelsOpt,
    NgldOpt,
    NglOpt,
    OutputFlags,
    PairOpt,
    PresencePenaltyOpt,
    RepeatLastNOpt,
    RepeatPenaltyOpt,
    RpcOpt,
    SwaFullOpt,
    TargetOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    TraceOpt,
    VerboseOpt,
    VerifyOpt,
    check_output_path,
    pick,
    seed_or_random,
)
from specgen.errors import ConfigError
from specgen.events import Prefilled
from specgen.flags import SamplingFlags, check_verify
from specgen.ui import output

if TYPE_CHECKING:
    from specgen.session import Session

EPILOG = (
    "Examples:\n\n"
    "  specgen bench                                      # demo pair, built-in prompts\n\n"
    "  specgen bench --draft-max 4,8,auto --temp 0,0.8 --runs 3 -n 128 --markdown bench.md\n\n"
    "  specgen bench -m big.gguf -md small.gguf -ngl 99 -ngld 99 --json bench.json\n\n"
    "  specgen bench --pair qwen2.5-coder-7b --prompts my_prompts.jsonl --plot bench.png\n\n"
    "  specgen bench -m big.gguf --draft ngram --draft-max 4,8   # model-free drafter\n\n"
    "  specgen bench --url http://127.0.0.1:8080 --concurrency 1,2,4,8   # a server under load\n\n"
    "  specgen bench --url http://127.0.0.1:8080 --label specgen --url http://127.0.0.1:8081"
    " --label llama-server --temp 0,0.8 --slo ttft=500,tpot=50 --markdown load.md"
)

#: `bench --url` (a server under load): these options only apply there
UrlOpt = Annotated[
    list[str] | None,
    typer.Option("--url", help="Measure an OpenAI-compatible server (repeat for side by side)."),
]
LabelOpt = Annotated[
    list[str] | None, typer.Option("--label", help="A name for each --url in the tables.")
]
ConcurrencyOpt = Annotated[
    str | None,
    typer.Option(
        "--concurrency", help="--url: requests in flight, a sweep like 1,2,4,8 (the default)."
    ),
]
RateOpt = Annotated[
    str | None,
    typer.Option(
        "--request-rate", help="--url: open-loop arrivals per second, e.g. 0.5,1,inf (Poisson)."
    ),
]
BurstOpt = Annotated[
    float,
    typer.Option("--burstiness", help="--url: gamma shape of arrivals (1 Poisson, <1 burstier)."),
]
NumPromptsOpt = Annotated[
    int, typer.Option("--num-prompts", help="--url: requests per level and server.")
]
WarmupOpt = Annotated[
    int, typer.Option("--warmup", help="--url: requests per server before measuring.")
]
EndpointOpt = Annotated[
    str | None,
    typer.Option("--endpoint", help="--url: chat or completions (default: chat for messages)."),
]
SloOpt = Annotated[
    str | None,
    typer.Option("--slo", help="--url: SLO goodput bounds in ms, e.g. ttft=500,tpot=50."),
]
KindOpt = Annotated[
    str | None, typer.Option("--kind", help="--url: only prompts of these kinds, e.g. code,chat.")
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="--url: seconds per request.")]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar="SPECGEN_API_KEY", help="--url: the servers' API key."),
]


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
    logit_bias: LogitBiasOpt = None,
    repeat_penalty: RepeatPenaltyOpt = 1.0,
    repeat_last_n: RepeatLastNOpt = 64,
    presence_penalty: PresencePenaltyOpt = 0.0,
    frequency_penalty: FrequencyPenaltyOpt = 0.0,
    grammar: GrammarOpt = None,
    grammar_file: GrammarFileOpt = None,
    json_schema: JsonSchemaOpt = None,
    json_schema_file: JsonSchemaFileOpt = None,
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
    url: UrlOpt = None,
    label: LabelOpt = None,
    concurrency: ConcurrencyOpt = None,
    request_rate: RateOpt = None,
    burstiness: BurstOpt = 1.0,
    num_prompts: NumPromptsOpt = 16,
    warmup: WarmupOpt = 1,
    endpoint: EndpointOpt = None,
    slo: SloOpt = None,
    kind: KindOpt = None,
    timeout: TimeoutOpt = 600.0,
    api_key: ApiKeyOpt = None,
    verify: VerifyOpt = None,
    lookup: LookupOpt = None,
) -> None:
    """Measure speculative against ordinary decoding: speedup, acceptance, latency; or, with
    --url, OpenAI-compatible servers under load: TTFT, TPOT, ITL, throughput."""
    given = locals()
    if url:
        # start-up time: the load client brings httpx and asyncio
        from specgen.cli.bench_load import run_load_command

        run_load_command(given)
        return
    bench_command(ModelFlags.pick(given), BenchFlags.pick(given), OutputFlags.pick(given))


@dataclass(frozen=True)
class BenchFlags:
    """bench's own options: what to measure, how often, and where to write it.

    Raises:
        ConfigError: naming the flag: --runs below 1, -n below 2, an output path that cannot
            be written (checked now: a wrong one must not cost a benchmark of minutes).
    """

    prompts: Path | None = None
    draft_max: str = "4,8,auto"
    temp: str = "0"
    runs: int = 3
    max_tokens: int = 128
    seed: int = 1234
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    logit_bias: list[str] | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    grammar: str | None = None
    grammar_file: Path | None = None
    json_schema: str | None = None
    json_schema_file: Path | None = None
    json_path: Path | None = None
    markdown_path: Path | None = None
    plot_path: Path | None = None
    compare: Path | None = None
    verify: str | None = None

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ConfigError(f"--runs must be at least 1, got {self.runs}")
        if self.max_tokens < 2:
            raise ConfigError(f"-n must be at least 2, got {self.max_tokens}")
        check_verify(self.verify)
        for flag, path in (("--json", self.json_path), ("--markdown", self.markdown_path),
                           ("--plot", self.plot_path)):  # fmt: skip
            if path is not None:
                check_output_path(flag, path)

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> BenchFlags:
        """From the command's ``locals()`` (see `specgen.flags.pick`)."""
        return pick(cls, values)


def bench_command(model: ModelFlags, b: BenchFlags, out: OutputFlags) -> None:
    """Validate everything cheap first, load, measure with a progress bar, then write the
    outputs and print the table."""
    # start-up time: the bench package loads numpy, which `specgen --help` must not
    from specgen import bench

    bench.check_draft(model.draft)
    if b.plot_path is not None:
        bench.check_plot_available()
    earlier = bench.load_earlier(b.compare) if b.compare is not None else None
    settings = _settings(bench, b, model.lookup)
    prompts = bench.load_prompts(b.prompts)
    with open_session(model, out, settings.params(settings.temps[0])) as opened:
        show_messages(opened)  # before measuring: a run of minutes at CPU speed
        settings = dataclasses.replace(settings, k_init=opened.k_init)  # auto starts as run's
        result = _measure_traced(bench, opened, prompts, settings, out.trace)
    if b.compare is not None:
        result.compared = bench.compare_with(result, b.compare, earlier)
    if b.json_path is not None:
        bench.write_json(result, b.json_path)
    if b.markdown_path is not None:
        bench.write_markdown(result, b.markdown_path)
    if b.plot_path is not None:
        bench.write_plot(result, b.plot_path)
    _show(result)


def _settings(bench, b: BenchFlags, lookup: str | None):
    # start-up time: the grammar's spec loads llguidance only when a grammar flag is given
    from specgen.stages import grammar_spec

    sampling = SamplingFlags(
        top_k=b.top_k, top_p=b.top_p, min_p=b.min_p, verify=b.verify,
        logit_bias=b.logit_bias, repeat_penalty=b.repeat_penalty,
        repeat_last_n=b.repeat_last_n, presence_penalty=b.presence_penalty,
        frequency_penalty=b.frequency_penalty, grammar=b.grammar, grammar_file=b.grammar_file,
        json_schema=b.json_schema, json_schema_file=b.json_schema_file,
    )  # fmt: skip
    settings = bench.BenchSettings(
        draft_max=bench.parse_draft_max_list(b.draft_max),
        temps=bench.parse_temp_list(b.temp),
        runs=b.runs,
        n_tokens=b.max_tokens,
        seed=seed_or_random(b.seed),
        sampling=sampling,
        lookup=lookup,
        grammar=grammar_spec(sampling),
    )  # fmt: skip
    settings.params(settings.temps[0])  # validates top-p / min-p now
    return settings


def _show(result, incomplete: str | None = None) -> None:
    # start-up time: the reports load rich's tables and the bench package
    from specgen.ui import reports

    tables, notes = reports.render_bench(result, incomplete=incomplete)
    output.show(*tables)  # a file or pipe: unwrapped, room for the whole table
    output.note(*notes)


def _measure_traced(bench, opened: Session, prompts, settings, trace: Path | None):
    """`_measure` with a --trace writer (one trace generation per measured run). Ctrl-C:
    the tables of what was finished, marked incomplete; no file is written (--json,
    --markdown and --plot hold complete results only), then exit 130."""
    writer = None
    if trace is not None:
        # start-up time: the trace writer loads numpy
        from specgen.trace import TraceWriter, token_text_of

        settings = dataclasses.replace(settings, trace=True)
        writer = TraceWriter(
            trace, target=opened.spec.target.name, draft=opened.draft_name,
            params=settings.params(settings.temps[0]), seed=settings.seed,
            max_tokens=settings.n_tokens, command="bench",
            token_text=token_text_of(opened.target),
        )  # fmt: skip
    try:
        return _measure(bench, opened, prompts, settings, writer)
    except bench.BenchInterrupted as e:
        if e.result.configs:
            _show(e.result, incomplete="interrupted (Ctrl-C); no file written")
        raise KeyboardInterrupt from None
    finally:
        if writer is not None:
            writer.close()


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


def _measure(bench, opened: Session, prompts, settings, writer=None):
    # start-up time: the progress bar loads rich's progress
    from specgen.ui.progress import bench_progress

    err = output.err_console()
    with bench_progress(err) as (on_progress, on_status):
        result = bench.bench(
            opened, prompts, settings, progress=on_progress, status=on_status,
            on_event=_trace_hook(writer, settings),
        )  # fmt: skip
    if not err.is_terminal:
        n = len(result.runs)
        output.status_line(f"measured {n} generations")
    return result
