"""`specgen bench --url`: the options of the load client, checked before anything is sent,
then the sweep with a progress bar, the outputs and the tables. The client is
`specgen.bench.load`, the tables `specgen.ui.load_reports`."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.cli.options import check_output_path, seed_or_random
from specgen.errors import ConfigError
from specgen.ui import output

if TYPE_CHECKING:
    from specgen.bench.load import LoadResult, LoadSettings
    from specgen.bench.loadstats import LoadLevel

#: `bench` options that choose or load models: meaningless when measuring a server
MODEL_FLAGS = (("target", "-m"), ("draft", "-md"), ("pair", "--pair"), ("trace", "--trace"))


CONSTRAINT_FLAGS = (
    ("logit_bias", "--logit-bias", None),
    ("repeat_penalty", "--repeat-penalty", 1.0),
    ("repeat_last_n", "--repeat-last-n", 64),
    ("presence_penalty", "--presence-penalty", 0.0),
    ("frequency_penalty", "--frequency-penalty", 0.0),
    ("grammar", "--grammar", None),
    ("grammar_file", "--grammar-file", None),
    ("json_schema", "--json-schema", None),
    ("json_schema_file", "--json-schema-file", None),
)
"""bench's logits-processing flags and their "off" values: refused with --url rather than
silently not sent."""


def run_load_command(a: dict[str, Any]) -> None:
    """Validate, measure, write, show. `a` holds `bench`'s parameters by name."""
    _check(a)
    # start-up time: the load client (httpcore) and the stats load only for --url
    from specgen.bench.load import load_prompts, parse_servers, report

    servers = parse_servers(a["url"], a["label"] or [])
    settings = _settings(a)
    earlier = report.load_earlier(a["compare"]) if a["compare"] is not None else None
    kinds = [k.strip() for k in a["kind"].split(",") if k.strip()] if a["kind"] else []
    prompts = load_prompts(a["prompts"], kinds)
    result = _measure(servers, prompts, settings)
    compared = report.compare_with(result, a["compare"], earlier) if earlier is not None else None
    if a["json_path"] is not None:
        report.write_json(result, a["json_path"])
    if a["markdown_path"] is not None:
        report.write_markdown(result, a["markdown_path"])
    if a["plot_path"] is not None:
        report.write_plot(result, a["plot_path"])
    # start-up time: the Rich tables load only once there is something to show
    from specgen.ui.load_reports import render_load

    tables, notes = render_load(result, compared=compared)
    output.show(*tables)
    output.note(*notes)


def _check(a: dict[str, Any]) -> None:
    """Refuse, in one line naming the flag, what cannot be measured: model flags, a missing
    httpcore, bad numbers, an output path that cannot be written (before anything is sent)."""
    for key, flag in MODEL_FLAGS:
        if a.get(key) is not None:
            raise ConfigError(
                f"{flag} chooses models for bench to load; with --url the server has them"
            )
    for key, flag, off in CONSTRAINT_FLAGS:
        if a.get(key) not in (None, off, []):
            raise ConfigError(
                f"{flag} is not sent by bench --url: set it on the servers (their own"
                " start flags), so every server measured gets the same"
            )
    if importlib.util.find_spec("httpcore") is None:
        raise ConfigError("bench --url needs httpcore: pip install httpcore")
    if a["num_prompts"] < 1:
        raise ConfigError(f"--num-prompts must be at least 1, got {a['num_prompts']}")
    if a["warmup"] < 0:
        raise ConfigError(f"--warmup must be 0 or more, got {a['warmup']}")
    if a["max_tokens"] < 1:
        raise ConfigError(f"-n must be at least 1, got {a['max_tokens']}")
    if not (a["burstiness"] > 0 and math.isfinite(a["burstiness"])):
        raise ConfigError(f"--burstiness must be a positive number, got {a['burstiness']}")
    if not a["timeout"] > 0:
        raise ConfigError(f"--timeout must be positive seconds, got {a['timeout']}")
    if a["endpoint"] not in (None, "chat", "completions"):
        raise ConfigError(f"--endpoint must be chat or completions, got {a['endpoint']!r}")
    if a["plot_path"] is not None:
        # start-up time: the plot's check imports the bench package only when asked
        from specgen.bench.report import check_plot_available

        check_plot_available()
    for flag, key in (
        ("--json", "json_path"),
        ("--markdown", "markdown_path"),
        ("--plot", "plot_path"),
    ):
        if a[key] is not None:
            check_output_path(flag, Path(a[key]))


def _levels(a: dict[str, Any]) -> list[LoadLevel]:
    """The load levels: every --temp with every --concurrency (closed loop), or with every
    --request-rate (open loop, --concurrency then one cap on requests in flight)."""
    # start-up time: the load statistics load numpy, only for --url
    from specgen.bench import loadstats
    from specgen.bench.prompts import parse_temp_list

    temps = parse_temp_list(a["temp"])
    if a["request_rate"] is None:
        conc = loadstats.parse_int_list("--concurrency", a["concurrency"] or "1,2,4,8")
        return [loadstats.LoadLevel(t, concurrency=c) for t in temps for c in conc]
    cap = None
    if a["concurrency"] is not None:
        caps = loadstats.parse_int_list("--concurrency", a["concurrency"])
        if len(caps) != 1:
            raise ConfigError("with --request-rate, --concurrency is one cap on requests in flight")
        cap = caps[0]
    rates = loadstats.parse_rate_list(a["request_rate"])
    return [
        loadstats.LoadLevel(t, request_rate=r, max_concurrency=cap) for t in temps for r in rates
    ]


def _settings(a: dict[str, Any]) -> LoadSettings:
    # start-up time: the load client loads httpcore, only for --url
    from specgen.bench import loadstats
    from specgen.bench.load import LoadSettings

    levels = _levels(a)
    return LoadSettings(
        levels=tuple(levels), num_prompts=a["num_prompts"], max_tokens=a["max_tokens"],
        seed=seed_or_random(a["seed"]), burstiness=a["burstiness"], warmup=a["warmup"],
        endpoint=a["endpoint"], top_k=a["top_k"], top_p=a["top_p"], min_p=a["min_p"],
        timeout_s=a["timeout"], slo=loadstats.parse_slo(a["slo"]) if a["slo"] else None,
        api_key=a["api_key"],
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
