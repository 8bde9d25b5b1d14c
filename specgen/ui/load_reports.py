"""The report of `specgen bench --url`, built from its result (pure: data in, Rich renderables
out); `specgen.ui.output` prints them."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from specgen.bench.load.report import (
    DEFINITIONS,
    LoadComparison,
    accept_text,
    client_cpu_text,
    failures_text,
    pair_text,
    ratio_text,
    side_by_side,
)
from specgen.bench.load.results import LoadResult


def _fmt(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def render_throughput(result: LoadResult) -> Table:
    """Per level and server: throughput, the ratio against the first server, acceptance,
    SLO goodput, failures."""
    slo = result.settings.slo
    t = Table(
        title="servers under load: throughput",
        title_justify="left",
        caption="vs first: output tok/s ratio (per request: median of paired tok/s ratios, 95% CI)",
        caption_justify="left",
    )
    cols = ["temp", "load", "server", "req/s", "out tok/s", "vs first", "tok/chunk", "accept"]
    cols += ["SLO req/s"] if slo else []
    cols += ["failed"]
    for c in cols:
        t.add_column(
            c, justify="left" if c in ("load", "server", "vs first", "failed") else "right"
        )
    for sb in side_by_side(result):
        s, lv = sb.run.summary, sb.run.level
        ratio = ratio_text(sb.ratio)
        if sb.ratio is not None and sb.ratio.throughput is not None:
            ratio = f"[{'red' if sb.ratio.throughput < 1 else 'green'}]{ratio}[/]"
        row = [f"{lv.temp:g}", lv.name, sb.run.label, f"{s.request_throughput:.2f}",
               f"{s.output_throughput:.1f}", ratio, _fmt(s.tokens_per_chunk, ".2f"),
               accept_text(s)]  # fmt: skip
        row += [_fmt(s.slo_goodput, ".2f")] if slo else []
        fails = failures_text(s)
        row += [fails if fails == "0" else f"[red]{fails}[/]"]
        t.add_row(*row)
    return t


def render_latency(result: LoadResult) -> Table:
    """Per level and server: TTFT, TPOT, ITL and E2EL percentiles in milliseconds."""
    t = Table(title="latency (ms)", title_justify="left")
    for c in ("temp", "load", "server", "TTFT p50/p99", "TPOT p50/p90/p99", "ITL p50/p99",
              "E2EL p50/p99"):  # fmt: skip
        t.add_column(c, justify="left" if c in ("load", "server") else "right")
    for sb in side_by_side(result):
        s, lv = sb.run.summary, sb.run.level
        tpot = " / ".join(_fmt(x, ".1f") for x in (s.tpot.p50, s.tpot.p90, s.tpot.p99))
        t.add_row(f"{lv.temp:g}", lv.name, sb.run.label, pair_text(s.ttft), tpot,
                  pair_text(s.itl, fmt=".1f"), pair_text(s.e2el))  # fmt: skip
    return t


def render_load(
    result: LoadResult, incomplete: str | None = None, compared: LoadComparison | None = None
) -> tuple[list[RenderableType], list[RenderableType]]:
    """The tables for stdout (headed by `incomplete` when partial), then the definitions,
    the comparison and the servers for stderr."""
    out: list[RenderableType] = (
        []
        if incomplete is None
        else [Text.from_markup(f"[bold yellow]incomplete:[/] {incomplete}")]
    )
    out += [render_throughput(result), render_latency(result)]
    err: list[RenderableType] = [Text(DEFINITIONS, style="dim")]
    if result.settings.slo is not None:
        err.append(Text(f"SLO: {result.settings.slo.text()}", style="dim"))
    if (cpu := client_cpu_text(result)) is not None:
        err.append(Text(cpu, style="dim"))
    if compared is not None:
        head = f"compared with {compared.file}" + (
            ""
            if compared.comparable
            else " (not comparable: " + "; ".join(compared.differences) + ")"
        )
        err.append(Text(head))
        for c in compared.changes:
            ratio = f"{c.after / c.before:.2f}×" if c.before else "–"
            what = f"{c.label} t{c.temp:g} {c.level}"
            err.append(Text(f"  {what}: {c.before:.1f} → {c.after:.1f} tok/s ({ratio})"))
    for i in result.servers:
        err.append(
            Text(f"{i.server.label}: {i.server.url}, model {i.model_id or '?'}", style="dim")
        )
    return out, err
