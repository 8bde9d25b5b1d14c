"""The outputs of `specgen bench --url`: the side-by-side ratios, the JSON result with its
reproducibility record, README-ready Markdown, the optional plot, and `--compare` with an
earlier `--json` file."""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from specgen.bench.load.results import LevelRun, LoadResult
from specgen.bench.loadstats import Dist, LevelSummary, Ratio, paired_ratio
from specgen.bench.record import host_record, read_result, specgen_version
from specgen.fileio import atomic_write

FORMAT = "specgen-bench-load/1"

DEFINITIONS = (
    "TTFT: first chunk with text − request sent. TPOT = (E2EL − TTFT) / (output tokens − 1),"
    " vLLM's definition (GuideLLM's divides E2EL by all output tokens). ITL: between streamed"
    " chunks (a speculative server streams a round's tokens in one chunk: see tok/chunk)."
    " E2EL: request sent → end of stream. SLO goodput: requests/s meeting every --slo bound"
    " (vLLM's goodput), not the tokens/s goodput a speculation controller maximizes."
    " Retried: sent into a kept-alive connection the server had closed, unanswered, and resent"
    " once on a new one (not a failure). Accept: accepted / proposed draft tokens as each"
    " server reports them (specgen's draft_acceptance_rate, llama-server's draft_n_accepted /"
    " draft_n), not the accepted / tested of `specgen run` and `specgen bench` alone."
)

# -- side by side -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SideBySide:
    """One run with its ratio against the first server at the same level (None for the
    first server itself)."""

    run: LevelRun
    base_label: str | None
    ratio: Ratio | None


def side_by_side(result: LoadResult) -> list[SideBySide]:
    """Every run in order, each with its `Ratio` against the first server's run of its level."""
    out: list[SideBySide] = []
    base: dict[Any, LevelRun] = {}
    first = result.servers[0].server.label if result.servers else None
    for run in result.runs:
        if run.label == first:
            base[run.level] = run
            out.append(SideBySide(run, None, None))
            continue
        b = base.get(run.level)
        ratio = None
        if b is not None:
            ratio = paired_ratio(
                b.records, b.summary, run.records, run.summary, result.settings.seed
            )
        out.append(SideBySide(run, first if b is not None else None, ratio))
    return out


# -- JSON ---------------------------------------------------------------------------------------


def _version_of(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def build_record(result: LoadResult) -> dict[str, Any]:
    """What makes the figures reproducible: the client, the machine it ran on (bench's own
    `host_record`), the settings, the prompt set, and what each server said about itself
    (`/v1/models`, `/props`)."""
    prompts = json.dumps(list(result.prompt_ids))
    return {
        "date": result.date,
        "client": {
            "specgen": specgen_version(),
            "httpcore": _version_of("httpcore"),
            "python": platform.python_version(),
        },
        "machine": host_record(),
        "settings": result.settings.to_dict() | {"endpoint": result.endpoint},
        "prompt_ids": list(result.prompt_ids),
        "prompt_ids_sha256": hashlib.sha256(prompts.encode()).hexdigest(),
        "servers": [
            {
                "url": i.server.url,
                "label": i.server.label,
                "model_id": i.model_id,
                "models": i.models,
                "props": i.props,
            }  # fmt: skip
            for i in result.servers
        ],
    }


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_round(v) for v in x]
    return x


def to_dict(result: LoadResult) -> dict[str, Any]:
    """The JSON form: record, one entry per run (summary, ratio, every request)."""
    runs = []
    for sb in side_by_side(result):
        r = sb.run
        t0 = min((q.start_s for q in r.records), default=0.0)
        runs.append({
            "label": r.label,
            "level": asdict(r.level) | {"name": r.level.name},
            "summary": asdict(r.summary) | {"n_failed": r.summary.n_failed},
            "client_cpu_percent": None if r.client_cpu is None else 100 * r.client_cpu,
            "vs": sb.base_label,
            "ratio": None if sb.ratio is None else asdict(sb.ratio),
            "requests": [
                asdict(q) | {"start_s": q.start_s - t0, "end_s": q.end_s - t0,
                             "chunk_s": [c - t0 for c in q.chunk_s]}  # fmt: skip
                for q in r.records
            ],
        })  # fmt: skip
    return _round({"format": FORMAT, "record": build_record(result), "runs": runs})


def write_json(result: LoadResult, path: Path) -> None:
    atomic_write(path, (json.dumps(to_dict(result), indent=1, ensure_ascii=False) + "\n").encode())


# -- Markdown -----------------------------------------------------------------------------------


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def pair_text(d: Dist, a: str = "p50", b: str = "p99", fmt: str = ".0f") -> str:
    return f"{_f(getattr(d, a), fmt)} / {_f(getattr(d, b), fmt)}"


def ratio_text(r: Ratio | None) -> str:
    """'1.31× (speed 1.28× [1.20, 1.35])' or '–'."""
    if r is None or r.throughput is None:
        return "–"
    lo, hi = r.speed_ci95
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None and r.n_pairs > 1 else ""
    speed = f" (per request {r.speed:.2f}×{ci})" if r.speed is not None else ""
    return f"{r.throughput:.2f}×{speed}"


def failures_text(s: LevelSummary) -> str:
    """'1 http 500, 2 disconnect' or '0', and the requests resent: '0 (1 retried)'."""
    text = ", ".join(f"{n} {kind}" for kind, n in s.failures) or "0"
    return text + (f" ({s.n_retried} retried)" if s.n_retried else "")


def accept_text(s: LevelSummary) -> str:
    return "–" if s.acceptance_rate is None else f"{s.acceptance_rate:.0%}"


def client_cpu_text(result: LoadResult) -> str | None:
    """'load client: at most 1.9% of one core in a level (median 1.1%)', or None when no
    level measured it."""
    cpu = sorted(r.client_cpu for r in result.runs if r.client_cpu is not None)
    if not cpu:
        return None
    return (
        f"load client: at most {100 * cpu[-1]:.1f}% of one core in a level"
        f" (median {100 * statistics.median(cpu):.1f}%)"
    )


def render_markdown(result: LoadResult) -> str:
    """One README-ready table of every run, the definitions, and the record in a sentence."""
    slo = result.settings.slo
    lines = [
        "| temp | load | server | req/s | out tok/s | vs first [95% CI] | TTFT p50/p99 ms"
        " | TPOT p50/p99 ms | ITL p50/p99 ms | E2EL p50/p99 ms | tok/chunk | accept"
        + (" | SLO goodput req/s" if slo else "")
        + " | failed |",
        "|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"
        + ("---:|" if slo else "")
        + "---|",
    ]
    for sb in side_by_side(result):
        s, lv = sb.run.summary, sb.run.level
        lines.append(
            f"| {lv.temp:g} | {lv.name} | {sb.run.label} | {s.request_throughput:.2f}"
            f" | {s.output_throughput:.1f} | {ratio_text(sb.ratio)} | {pair_text(s.ttft)}"
            f" | {pair_text(s.tpot, fmt='.1f')} | {pair_text(s.itl, fmt='.1f')}"
            f" | {pair_text(s.e2el)}"
            f" | {_f(s.tokens_per_chunk, '.2f')} | {accept_text(s)}"
            + (f" | {_f(s.slo_goodput, '.2f')}" if slo else "")
            + f" | {failures_text(s)} |"
        )
    lines += ["", DEFINITIONS]
    if slo:
        lines.append(f"SLO: {slo.text()}.")
    if (cpu := client_cpu_text(result)) is not None:
        lines.append(cpu[0].upper() + cpu[1:] + ".")
    lines += ["", describe_record(build_record(result))]
    return "\n".join(lines) + "\n"


def describe_record(rec: dict[str, Any]) -> str:
    st = rec["settings"]
    servers = "; ".join(
        f"{s['label']} = {s['url']} (model {s['model_id'] or '?'})" for s in rec["servers"]
    )
    samp = ", ".join(f"{k} {st[k]}" for k in ("top_k", "top_p", "min_p") if st[k] is not None)
    return (
        f"Client: specgen {rec['client']['specgen']} on {rec['machine']['cpu']},"
        f" {rec['machine']['os']}, {rec['date'][:10]}. Servers: {servers}."
        f" {st['num_prompts']} requests per level from {len(rec['prompt_ids'])} prompts,"
        f" {st['max_tokens']} output tokens each (ignore_eos {st['ignore_eos']}),"
        f" endpoint {st['endpoint'] or 'auto'}, seed {st['seed']}, burstiness {st['burstiness']},"
        f" warm-up {st['warmup']}{', ' + samp if samp else ''}."
    )


def write_markdown(result: LoadResult, path: Path) -> None:
    atomic_write(path, render_markdown(result).encode("utf-8"))


# -- plot ---------------------------------------------------------------------------------------


def write_plot(result: LoadResult, path: Path) -> None:
    """PNG: output tokens/s, TTFT, TPOT and E2EL (p50 solid, p99 dashed) against the load
    levels, one line per server and temperature.

    Raises:
        ConfigError: matplotlib is not installed.
    """
    from specgen.bench.report import pyplot, save_png

    plt = pyplot()

    names = list(dict.fromkeys(r.level.name for r in result.runs))
    series = list(dict.fromkeys((r.label, r.level.temp) for r in result.runs))
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    panels = [
        ("output tokens/s", None),
        ("TTFT ms", "ttft"),
        ("TPOT ms", "tpot"),
        ("E2EL ms", "e2el"),
    ]
    for ax, (title, metric) in zip(axes, panels, strict=True):
        for label, temp in series:
            runs = {
                r.level.name: r.summary
                for r in result.runs
                if (r.label, r.level.temp) == (label, temp)
            }
            xs = [i for i, n in enumerate(names) if n in runs]
            name = f"{label}, t {temp:g}"
            if metric is None:
                ax.plot(xs, [runs[names[i]].output_throughput for i in xs], marker="o", label=name)
                continue
            for q, style in (("p50", "-"), ("p99", "--")):
                ys = [getattr(getattr(runs[names[i]], metric), q) for i in xs]
                ax.plot(xs, [float("nan") if y is None else y for y in ys], style, marker="o",
                        label=f"{name} {q}")  # fmt: skip
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set_title(title)
        ax.set_xlabel("load")
        ax.legend(fontsize=7)
    save_png(fig, path, dpi=110)


# -- --compare ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputChange:
    """One (server label, temperature, level) found in both files: output tokens/s then
    and now."""

    label: str
    temp: float
    level: str
    before: float
    after: float


@dataclass(frozen=True)
class LoadComparison:
    """This result against an earlier `--json` file: the settings that differ (not
    comparable when any do), servers whose self-description changed, and the throughputs."""

    file: str
    differences: tuple[str, ...]
    changes: tuple[ThroughputChange, ...]

    @property
    def comparable(self) -> bool:
        return not self.differences


def load_earlier(path: Path) -> dict[str, Any]:
    """An earlier `bench --url --json` file, read and checked before measuring.

    Raises:
        ConfigError: unreadable, or not a `bench --url` result.
    """
    return read_result(path, FORMAT, "a specgen bench --url JSON file")


def compare_with(result: LoadResult, path: Path, old: dict[str, Any]) -> LoadComparison:
    """`result` against `old` (as `load_earlier` read it from `path`)."""
    now = to_dict(result)
    diffs = []
    a, b = old["record"], now["record"]
    for key in ("num_prompts", "max_tokens", "seed", "burstiness", "endpoint", "top_k", "top_p",
                "min_p", "ignore_eos"):  # fmt: skip
        if a["settings"].get(key) != b["settings"].get(key):
            diffs.append(f"settings.{key}: {a['settings'].get(key)} → {b['settings'].get(key)}")
    if a.get("prompt_ids_sha256") != b.get("prompt_ids_sha256"):
        diffs.append("the prompt set differs")
    old_models = {s["label"]: s["models"] for s in a["servers"]}
    for s in b["servers"]:
        if s["label"] in old_models and old_models[s["label"]] != s["models"]:
            diffs.append(f"server {s['label']}: /v1/models differs (another model or build)")
    before = {
        (r["label"], r["level"]["temp"], r["level"]["name"]): r["summary"]["output_throughput"]
        for r in old["runs"]
    }
    changes = tuple(
        ThroughputChange(
            r.label, r.level.temp, r.level.name, before[k], r.summary.output_throughput
        )
        for r in result.runs
        if (k := (r.label, r.level.temp, r.level.name)) in before
    )
    return LoadComparison(str(path), tuple(diffs), changes)


# -- scripts/bench_serve.sh's summary ------------------------------------------------------------


#: the summary figures `median_of_runs` takes the median of: (key, sub-key or None)
_MEDIAN_FIELDS = (
    ("output_throughput", None),
    ("request_throughput", None),
    ("slo_goodput", None),
    ("ttft", "p50"),
    ("ttft", "p99"),
    ("tpot", "p50"),
    ("tpot", "p99"),
)


def median_of_runs(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several `--json` documents of the same servers and levels (the alternations of
    `scripts/bench_serve.sh`, REPEAT > 1) as one: each (level, server)'s summary figures
    are the medians over the documents that have it (throughputs, SLO goodput, TTFT p50 /
    p99, TPOT p50 / p99), its request counts the sums; the first document's record, and
    the highest load-client CPU. A figure missing in every document stays None.

    Raises:
        ValueError: no documents.
    """
    if not docs:
        raise ValueError("no documents to take the median of")
    groups: dict[tuple[float, str, str], list[dict[str, Any]]] = {}
    for doc in docs:
        for r in doc["runs"]:
            groups.setdefault((r["level"]["temp"], r["level"]["name"], r["label"]), []).append(r)
    runs = []
    for rs in groups.values():
        summary = json.loads(json.dumps(rs[0]["summary"]))  # a deep copy
        for key, sub in _MEDIAN_FIELDS:
            vals = [
                (r["summary"].get(key) if sub is None else (r["summary"].get(key) or {}).get(sub))
                for r in rs
            ]
            got = [v for v in vals if v is not None]
            med = statistics.median(got) if got else None
            if sub is None:
                summary[key] = med
            elif summary.get(key) is not None:
                summary[key][sub] = med
        for key in ("n_requests", "n_completed"):
            summary[key] = sum(r["summary"][key] for r in rs)
        cpus = [r["client_cpu_percent"] for r in rs if r.get("client_cpu_percent") is not None]
        runs.append(
            {
                "label": rs[0]["label"],
                "level": rs[0]["level"],
                "summary": summary,
                "client_cpu_percent": max(cpus) if cpus else None,
            }
        )
    return {"format": docs[0].get("format"), "record": docs[0].get("record"), "runs": runs}


def serve_summary_markdown(doc: dict[str, Any], labels: list[str]) -> str:
    """The side-by-side summary of `scripts/bench_serve.sh` from a `--json` file's contents.

    Two tables, a row per level (temperature, load) and a column per label in `labels`:
    output tokens/s (TTFT p50 / TPOT p99 ms) with specgen's ratios to the best llama-server
    ("llama*" labels) and to "specgen-nodraft"; then the tails and SLO goodput (TTFT p50 /
    p99 ms, TPOT p99 ms, requests/s meeting the run's `--slo`, read from the record) with
    specgen's goodput over the best llama-server's. Missing runs and figures show "–".

    Args:
        doc: the parsed JSON of `specgen bench --url ... --json` (`to_dict`'s form).
        labels: the servers' labels, in the order of the columns.
    """
    runs: dict[tuple[float, str, str], dict[str, Any]] = {}
    cpu: list[tuple[float, str, float, str]] = []
    for r in doc["runs"]:
        level, label = r["level"], r["label"]
        runs[(level["temp"], level["name"], label)] = r["summary"]
        if r.get("client_cpu_percent") is not None:
            cpu.append((r["client_cpu_percent"], label, level["temp"], level["name"]))
    levels = list(dict.fromkeys((t, n) for t, n, _ in runs))
    slo = (doc.get("record") or {}).get("settings", {}).get("slo")
    llamas = [lab for lab in labels if lab.startswith("llama")]

    def ms(x: float | None) -> str:
        return _f(x, ".0f")

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}×" if a is not None and b else "–"

    def best(got: dict[str, Any], key: str) -> float | None:
        return max((got[lab][key] for lab in llamas if got[lab] and got[lab][key] is not None),
                   default=None)  # fmt: skip

    def cell(s: dict[str, Any] | None) -> str:
        if s is None:
            return "–"
        failed = s["n_requests"] - s["n_completed"]
        fail = f", {failed} failed" if failed else ""
        return (
            f"{s['output_throughput']:.1f} ({ms(s['ttft']['p50'])} / {ms(s['tpot']['p99'])}{fail})"
        )

    def tail(s: dict[str, Any] | None) -> str:
        if s is None:
            return "–"
        good = "–" if s.get("slo_goodput") is None else f"{s['slo_goodput']:.2f}"
        return f"{ms(s['ttft']['p50'])} / {ms(s['ttft']['p99'])} · {ms(s['tpot']['p99'])} · {good}"

    cols = " | ".join(labels)
    out = ["Output tokens/s over all streams (TTFT p50 ms / TPOT p99 ms).", ""]
    out.append(
        f"| temp | load | {cols} | specgen / best llama-server | specgen / specgen --draft none |"
    )
    out.append("|---:|---|" + "---:|" * (len(labels) + 2))
    rows2 = []
    for t, n in levels:
        got = {lab: runs.get((t, n, lab)) for lab in labels}
        spec, nod = got.get("specgen"), got.get("specgen-nodraft")
        r1 = ratio(spec["output_throughput"] if spec else None, best(got, "output_throughput"))
        r2 = ratio(
            spec["output_throughput"] if spec else None, nod["output_throughput"] if nod else None
        )
        cells = " | ".join(cell(got[lab]) for lab in labels)
        out.append(f"| {t:g} | {n} | {cells} | {r1} | {r2} |")
        g = ratio(spec.get("slo_goodput") if spec else None, best(got, "slo_goodput"))
        tails = " | ".join(tail(got[lab]) for lab in labels)
        rows2.append(f"| {t:g} | {n} | {tails} | {g} |")
    bounds = (
        ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.items() if v)
        if slo
        else None
    )
    out += [
        "",
        "TTFT p50 / p99 ms · TPOT p99 ms · SLO goodput (requests/s meeting "
        + (bounds or "no --slo: –")
        + ").",
        "",
        f"| temp | load | {cols} | specgen goodput / best llama-server |",
        "|---:|---|" + "---:|" * (len(labels) + 1),
        *rows2,
    ]
    if cpu:
        top = max(cpu)
        out += [
            "",
            f"The load client's own CPU: at most {top[0]:.1f}% of one core in a level"
            f" ({top[1]}, temp {top[2]:g}, {top[3]}).",
        ]
    return "\n".join(out) + "\n"
