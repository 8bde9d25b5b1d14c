"""`specgen bench --url`: the options of the load client, checked before anything is sent,
then the sweep with a progress bar, the outputs and the tables. The client is
`specgen.bench.load`, the tables `specgen.ui.load_reports`."""

from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING, Any

from specgen.cli.options import ModelFlags, OutputFlags, SamplingFlags, seed_or_random
from specgen.errors import ConfigError
from specgen.flags import at_least
from specgen.ui import output

if TYPE_CHECKING:
    from specgen.bench.load import LoadResult, LoadSettings
    from specgen.bench.loadstats import LoadLevel
    from specgen.cli.bench import BenchFlags, LoadFlags

#: `bench` options that choose or load models: meaningless when measuring a server
MODEL_FLAGS = (("target", "-m"), ("draft", "-md"), ("pair", "--pair"))

#: bench's logits-processing flags (`SamplingFlags` fields): refused with --url, unless at
#: their "off" defaults, rather than silently not sent
CONSTRAINT_FLAGS = (
    ("logit_bias", "--logit-bias"),
    ("repeat_penalty", "--repeat-penalty"),
    ("repeat_last_n", "--repeat-last-n"),
    ("presence_penalty", "--presence-penalty"),
    ("frequency_penalty", "--frequency-penalty"),
    ("grammar", "--grammar"),
    ("grammar_file", "--grammar-file"),
    ("json_schema", "--json-schema"),
    ("json_schema_file", "--json-schema-file"),
)


def run_load_command(
    model: ModelFlags, sampling: SamplingFlags, b: BenchFlags, out: OutputFlags, load: LoadFlags
) -> None:
    """Validate, measure, write, show: `bench`'s flags, with --url given."""
    _check(model, sampling, b, out, load)
    # start-up time: the load client (httpcore) and the stats load only for --url
    from specgen.bench.load import load_prompts, parse_servers, report

    servers = parse_servers(load.url or [], load.label or [])
    settings = _settings(sampling, b, load)
    earlier = report.load_earlier(b.compare) if b.compare is not None else None
    kinds = [k.strip() for k in load.kind.split(",") if k.strip()] if load.kind else []
    prompts = load_prompts(b.prompts, kinds)
    result = _measure(servers, prompts, settings)
    compared = None
    if b.compare is not None and earlier is not None:
        compared = report.compare_with(result, b.compare, earlier)
    # start-up time: the Rich tables load only once there is something to show
    from specgen.ui.load_reports import render_load

    tables, notes = render_load(result, compared=compared)
    output.show(*tables)  # first: a file that cannot be written loses no measurement
    output.note(*notes)
    b.write(report, result)


def _check(
    model: ModelFlags, sampling: SamplingFlags, b: BenchFlags, out: OutputFlags, load: LoadFlags
) -> None:
    """Refuse, in one line naming the flag, what cannot be measured: model flags, a missing
    httpcore, bad numbers, an output path that cannot be written (before anything is sent)."""
    chosen = [(getattr(model, key), flag) for key, flag in MODEL_FLAGS]
    for value, flag in [*chosen, (out.trace, "--trace")]:
        if value is not None:
            raise ConfigError(
                f"{flag} chooses models for bench to load; with --url the server has them"
            )
    off = SamplingFlags()
    for key, flag in CONSTRAINT_FLAGS:
        if getattr(sampling, key) == getattr(off, key):
            continue
        if "grammar" in key or "schema" in key:  # `serve` has no grammar flag: per request
            raise ConfigError(
                f"{flag} is not sent by bench --url: give the lines of a --prompts file their"
                " own json_schema, response_format or grammar field (see `specgen bench`'s"
                " guide), so every server measured gets the same requests"
            )
        raise ConfigError(
            f"{flag} is not sent by bench --url: set it on the servers (their own"
            " start flags), so every server measured gets the same"
        )
    if importlib.util.find_spec("httpcore") is None:
        raise ConfigError("bench --url needs httpcore: pip install httpcore")
    at_least("--num-prompts", load.num_prompts, 1)
    at_least("--warmup", load.warmup, 0)
    at_least("-n", b.max_tokens, 1)
    if not (load.burstiness > 0 and math.isfinite(load.burstiness)):
        raise ConfigError(f"--burstiness must be a positive number, got {load.burstiness}")
    if not load.timeout > 0:
        raise ConfigError(f"--timeout must be positive seconds, got {load.timeout}")
    if load.endpoint not in (None, "chat", "completions"):
        raise ConfigError(f"--endpoint must be chat or completions, got {load.endpoint!r}")
    if b.plot_path is not None:
        # start-up time: the plot's check imports the bench package only when asked
        from specgen.bench.report import check_plot_available

        check_plot_available()


def _levels(b: BenchFlags, load: LoadFlags) -> list[LoadLevel]:
    """The load levels: every --temp with every --concurrency (closed loop), or with every
    --request-rate (open loop, --concurrency then one cap on requests in flight)."""
    # start-up time: the load statistics load numpy, only for --url
    from specgen.bench import loadstats
    from specgen.bench.prompts import parse_temp_list

    temps = parse_temp_list(b.temp)
    if load.request_rate is None:
        conc = loadstats.parse_int_list("--concurrency", load.concurrency or "1,2,4,8")
        return [loadstats.LoadLevel(t, concurrency=c) for t in temps for c in conc]
    cap = None
    if load.concurrency is not None:
        caps = loadstats.parse_int_list("--concurrency", load.concurrency)
        if len(caps) != 1:
            raise ConfigError("with --request-rate, --concurrency is one cap on requests in flight")
        cap = caps[0]
    rates = loadstats.parse_rate_list(load.request_rate)
    return [
        loadstats.LoadLevel(t, request_rate=r, max_concurrency=cap) for t in temps for r in rates
    ]


def _settings(sampling: SamplingFlags, b: BenchFlags, load: LoadFlags) -> LoadSettings:
    # start-up time: the load client loads httpcore, only for --url
    from specgen.bench import loadstats
    from specgen.bench.load import LoadSettings

    levels = _levels(b, load)
    return LoadSettings(
        levels=tuple(levels), num_prompts=load.num_prompts, max_tokens=b.max_tokens,
        seed=seed_or_random(b.seed), burstiness=load.burstiness, warmup=load.warmup,
        endpoint=load.endpoint, top_k=sampling.top_k, top_p=sampling.top_p,
        min_p=sampling.min_p, timeout_s=load.timeout,
        slo=loadstats.parse_slo(load.slo) if load.slo else None, api_key=load.api_key,
    )  # fmt: skip


def _measure(servers: Any, prompts: Any, settings: LoadSettings) -> LoadResult:
    """The sweep with a progress bar; on Ctrl-C, what was finished (headed incomplete, no
    file written), then KeyboardInterrupt (exit 130)."""
    # start-up time: the client, the progress bar and the tables load only for --url
    from specgen.bench.load import LoadInterrupted, run_load
    from specgen.ui.load_reports import render_load
    from specgen.ui.progress import load_progress

    try:
        with load_progress(output.err_console()) as on_progress:
            return run_load(servers, prompts, settings, progress=on_progress)
    except LoadInterrupted as e:
        if e.result.runs:
            tables, _ = render_load(e.result, incomplete="interrupted (Ctrl-C); no file written")
            output.show(*tables)
        raise KeyboardInterrupt from None
