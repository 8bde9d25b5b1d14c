"""`specgen bench`: the Typer command. Measurement lives in `specgen.bench`, the progress bar
in `specgen.ui.progress`, the tables in `specgen.ui.reports`; all three (numpy, llama.cpp)
are imported inside the command so that `specgen --help` and the other commands start fast."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from specgen.cli.loading import open_session, show_messages
from specgen.cli.options import (
    GRAMMAR,
    MODEL,
    OUTPUT,
    SAMPLING,
    Group,
    ModelFlags,
    OutputFlags,
    SamplingFlags,
    check_not_overwriting,
    check_output_path,
    flag,
    grouped,
    seed_or_random,
)
from specgen.errors import ConfigError
from specgen.events import Prefilled
from specgen.flags import at_least
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


@dataclass(frozen=True)
class LoadFlags:
    """`bench --url` (a server under load): these options only apply there; checked by
    `specgen.cli.bench_load` when --url is given."""

    url: list[str] | None = flag(
        "--url", default=None, help="Measure an OpenAI-compatible server (repeat for side by side)."
    )
    label: list[str] | None = flag(
        "--label", default=None, help="A name for each --url in the tables."
    )
    concurrency: str | None = flag(
        "--concurrency",
        default=None,
        help="--url: requests in flight, a sweep like 1,2,4,8 (the default).",
    )
    request_rate: str | None = flag(
        "--request-rate",
        default=None,
        help="--url: open-loop arrivals per second, e.g. 0.5,1,inf (Poisson).",
    )
    burstiness: float = flag(
        "--burstiness", default=1.0, help="--url: gamma shape of arrivals (1 Poisson, <1 burstier)."
    )
    num_prompts: int = flag(
        "--num-prompts", default=16, help="--url: requests per level and server."
    )
    warmup: int = flag("--warmup", default=1, help="--url: requests per server before measuring.")
    endpoint: str | None = flag(
        "--endpoint", default=None, help="--url: chat or completions (default: chat for messages)."
    )
    slo: str | None = flag(
        "--slo", default=None, help="--url: SLO goodput bounds in ms, e.g. ttft=500,tpot=50."
    )
    kind: str | None = flag(
        "--kind", default=None, help="--url: only prompts of these kinds, e.g. code,chat."
    )
    timeout: float = flag("--timeout", default=600.0, help="--url: seconds per request.")
    api_key: str | None = flag(
        "--api-key", default=None, envvar="SPECGEN_API_KEY", help="--url: the servers' API key."
    )


LOAD = Group.of(LoadFlags)


@dataclass(frozen=True)
class BenchFlags:
    """bench's own options: what to measure, how often, and where to write it.

    Raises:
        ConfigError: naming the flag: --runs below 1, an output path that cannot be written
            (checked now: a wrong one must not cost a benchmark of minutes).
    """

    prompts: Path | None = flag(
        "--prompts",
        default=None,
        help="Your prompts: JSONL with a 'prompt' field, or one per line.",
    )
    draft_max: str = flag(
        "--draft-max",
        default="4,8,auto",
        metavar="K[,K...]",
        help="Block sizes to compare, e.g. 4,8,auto.",
    )
    temp: str = flag(
        "--temp",
        default="0",
        metavar="T[,T...]",
        help="Temperatures, e.g. 0,0.8 (0 or below = greedy).",
    )
    runs: int = flag("--runs", default=3, help="Repetitions of each prompt.")
    max_tokens: int = flag(
        "--max-tokens", "-n", default=128, help="Tokens per generation (EOS ignored)."
    )
    seed: int = flag(
        "--seed", default=1234, help="Base random seed (-1 = random, as in llama.cpp)."
    )
    json_path: Path | None = flag("--json", default=None, help="Write every figure and the record.")
    markdown_path: Path | None = flag("--markdown", default=None, help="Write README-ready tables.")
    plot_path: Path | None = flag(
        "--plot", default=None, help="Write a PNG (needs matplotlib: pip install -e '.\\[plot]')."
    )
    compare: Path | None = flag(
        "--compare", default=None, help="An earlier --json result to compare with."
    )

    def __post_init__(self) -> None:
        at_least("--runs", self.runs, 1)
        given: dict[Path, str] = {}
        for name, path in self.outputs:
            if path is not None:
                check_output_path(name, path)
                same = given.setdefault(path.resolve(), name)
                if same != name:  # the second would overwrite the first's
                    raise ConfigError(f"{same} and {name} name the same file: {path}")
        if self.compare is not None and self.compare.resolve() in given:
            raise ConfigError(
                f"--compare and {given[self.compare.resolve()]} name the same file:"
                f" {self.compare} (the run would overwrite the result it compares with)"
            )

    @property
    def outputs(self) -> tuple[tuple[str, Path | None], ...]:
        """Each file flag and its path (None: not asked for)."""
        return (("--json", self.json_path), ("--markdown", self.markdown_path),
                ("--plot", self.plot_path))  # fmt: skip

    def write(self, report: Any, result: Any) -> None:
        """Write `result` to the files asked for (--json, --markdown, --plot) with the
        `report` module's writers (`specgen.bench`'s, or the load client's for --url).

        Raises:
            ConfigError: a file could not be written (naming its flag and path; the
                tables were shown before, and the other files are written, so the
                measurements are not lost).
        """
        failed = []
        for name, path, write in (("--json", self.json_path, report.write_json),
                                  ("--markdown", self.markdown_path, report.write_markdown),
                                  ("--plot", self.plot_path, report.write_plot)):  # fmt: skip
            if path is not None:
                try:
                    write(result, path)
                except OSError as e:
                    failed.append(f"{name}: cannot write {path}: {e.strerror or e}")
        if failed:
            raise ConfigError("; ".join(failed))


BENCH = Group.of(BenchFlags)


@grouped
def bench(
    *,
    model: Annotated[ModelFlags, MODEL],
    b: Annotated[BenchFlags, BENCH],
    # --temp, --draft-max, -n and --seed are bench's own (lists to sweep, a base seed)
    sampling: Annotated[
        SamplingFlags,
        SAMPLING.without("max_tokens", "temp", "seed", "draft_max", "stop", "ignore_eos") + GRAMMAR,
    ],
    out: Annotated[OutputFlags, OUTPUT.only("trace", "verbose")],
    load: Annotated[LoadFlags, LOAD],
) -> None:
    """Measure speculative against ordinary decoding: speedup, acceptance, latency; or, with
    --url, OpenAI-compatible servers under load: TTFT, TPOT, ITL, throughput."""
    if load.url:
        # start-up time: the load client brings httpx and asyncio
        from specgen.cli.bench_load import run_load_command

        run_load_command(model, sampling, b, out, load)
        return
    for f in dataclasses.fields(LoadFlags):  # --url's own: silently unused without it
        if f.name != "api_key" and getattr(load, f.name) != f.default:
            raise ConfigError(f"--{f.name.replace('_', '-')} applies to bench --url only")
    at_least("-n", b.max_tokens, 2)
    bench_command(model, sampling, b, out)


def bench_command(
    model: ModelFlags, sampling: SamplingFlags, b: BenchFlags, out: OutputFlags
) -> None:
    """Validate everything cheap first, load, measure with a progress bar, then write the
    outputs and print the table."""
    # start-up time: the bench package loads numpy, which `specgen --help` must not
    from specgen import bench

    bench.check_draft(model.draft)
    check_not_overwriting("--trace", out.trace, ("-m", model.target), ("-md", model.draft))
    for name, path in b.outputs:  # BenchFlags compares its own files; --trace is OUTPUT's
        if out.trace is not None and path is not None and out.trace.resolve() == path.resolve():
            raise ConfigError(f"--trace and {name} name the same file: {path}")
    if b.plot_path is not None:
        bench.check_plot_available()
    earlier = bench.load_earlier(b.compare) if b.compare is not None else None
    settings = _settings(bench, sampling, b, model.lookup)
    prompts = bench.load_prompts(b.prompts)
    with open_session(model, out, settings.params(settings.temps[0])) as opened:
        show_messages(opened)  # before measuring: a run of minutes at CPU speed
        settings = dataclasses.replace(settings, k_init=opened.k_init)  # auto starts as run's
        result = _measure_traced(bench, opened, prompts, settings, out.trace)
    if b.compare is not None:
        result.compared = bench.compare_with(result, b.compare, earlier)
    _show(result)  # first: a file that cannot be written loses no measurement
    b.write(bench, result)


def _settings(bench, sampling: SamplingFlags, b: BenchFlags, lookup: str | None):
    settings = bench.BenchSettings(
        draft_max=bench.parse_draft_max_list(b.draft_max),
        temps=bench.parse_temp_list(b.temp),
        runs=b.runs,
        n_tokens=b.max_tokens,
        seed=seed_or_random(b.seed),
        sampling=sampling,
        lookup=lookup,
    )  # fmt: skip
    settings.params(settings.temps[0])  # validates top-p / min-p now
    # and the grammar (an unreadable file, a schema that is not JSON), before any load;
    # llguidance is loaded only when a grammar flag is given
    _ = settings.grammar
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
            # the sweep: `sampling` is the first temperature's (each generation says its own)
            extra={"temps": list(settings.temps)},
        )  # fmt: skip
    try:
        return _measure(bench, opened, prompts, settings, writer)
    except bench.BenchInterrupted as e:
        if e.result.configs:
            _show(e.result, incomplete="interrupted (Ctrl-C); no file written")
        else:  # silence had left it unclear whether anything was measured or written
            output.notice(
                "interrupted (Ctrl-C) before a measured generation ended; no file written"
            )
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
