"""Every report, built from results (pure: data in, Rich renderables out); `specgen.ui.output`
prints them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from specgen import bench
from specgen.bench.results import BenchResult, Latency, PairSummary
from specgen.events import ACCEPTANCE_HOW

if TYPE_CHECKING:
    from specgen.constraints import Constraints
    from specgen.trace import TraceSummary
    from specgen.verify.report import VerifyReport

# -- specgen bench ---------------------------------------------------------------------------


def _fmt(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _slow(x: float | None) -> bool:
    return x is not None and x < 1


def render_bench_table(result: BenchResult) -> Table:
    """Speed per configuration: throughput, speedup with its interval, acceptance, bound."""
    t = Table(
        title="speculative vs ordinary decoding",
        title_justify="left",
        caption=f"accept: accepted / drafted, where {ACCEPTANCE_HOW}",
        caption_justify="left",
    )
    for name in ("temp", "K", "ord tok/s", "spec tok/s", "speedup [95% CI]", "accept",
                 "tok/pass", "bound", "achieved"):  # fmt: skip
        t.add_column(name, justify="left" if name.startswith("speedup") else "right")
    for c in result.configs:
        o = c.overall
        sp = bench.speedup_text(o)
        t.add_row(
            f"{c.temp:g}",
            c.draft_max,
            _fmt(o.ordinary.tokens_per_s, ".1f"),
            _fmt(o.speculative.tokens_per_s, ".1f"),
            f"[red]{sp} slower[/]" if _slow(o.speedup) else f"[green]{sp}[/]",
            bench.pct(o.acceptance_rate),
            _fmt(o.tokens_per_pass, ".2f"),
            _fmt(o.theoretical_speedup, ".2f") + "×",
            bench.pct(o.achieved_fraction),
        )
    return t


def render_bench_costs(result: BenchResult) -> Table:
    """Latency and cost per configuration: TTFT, per-token percentiles, time split, memory."""
    t = Table(title="latency and time split", title_justify="left")
    for name in ("temp", "K", "TTFT ms ord/spec", "ord p50/p95/p99 ms", "spec p50/p95/p99 ms",
                 "draft/verify/sample/other", "host ms/round", "peak RSS"):  # fmt: skip
        t.add_column(name, justify="right")
    for c in result.configs:
        o = c.overall
        ts = o.time_split_s
        dec = ts.decode or 0
        split = (
            " / ".join(
                f"{(x or 0) / dec:.0%}" for x in (ts.draft, ts.verify, ts.sampling, ts.other)
            )
            if dec
            else "–"
        )
        t.add_row(
            f"{c.temp:g}",
            c.draft_max,
            f"{o.ordinary.ttft_s * 1000:.0f} / {o.speculative.ttft_s * 1000:.0f}",
            _lat(o.ordinary.latency_ms),
            _lat(o.speculative.latency_ms),
            split,
            _host(o),
            f"{o.peak_rss_bytes / 2**20:.0f} MiB",
        )
    return t


def _host(o: PairSummary) -> str:
    """Host time (outside llama_decode) per round, with its share of decoding time."""
    per_round, dec = o.host_s_per_round, o.time_split_s.decode
    if per_round is None or not dec:
        return "–"
    return f"{per_round * 1000:.2f} ({(o.time_split_s.host or 0) / dec:.0%})"


def _lat(lat: Latency) -> str:
    return " / ".join(_fmt(x, ".1f") for x in (lat.p50, lat.p95, lat.p99))


def render_bench_kinds(result: BenchResult) -> Table:
    """Speedup (acceptance) by prompt kind, one column per configuration."""
    t = Table(title="speedup by prompt kind (acceptance)", title_justify="left")
    t.add_column("kind")
    for c in result.configs:
        t.add_column(f"t{c.temp:g} K{c.draft_max}", justify="right")
    kinds = list(dict.fromkeys(k for c in result.configs for k in c.by_kind))
    for kind in kinds:
        cells = []
        for c in result.configs:
            s = c.by_kind.get(kind)
            if s is None or s.speedup is None:
                cells.append("–")
                continue
            color = "red" if _slow(s.speedup) else "green"
            cells.append(f"[{color}]{s.speedup:.2f}×[/] ({bench.pct(s.acceptance_rate)})")
        t.add_row(kind, *cells)
    return t


def render_bench(
    result: BenchResult, incomplete: str | None = None
) -> tuple[list[RenderableType], list[RenderableType]]:
    """`specgen bench`'s report (pure): the tables and the auto-against-best lines for
    stdout, then the notes, the comparison and the record for stderr. `incomplete` (why
    the figures are partial) heads the tables."""
    out: list[RenderableType] = (
        []
        if incomplete is None
        else [Text.from_markup(f"[bold yellow]incomplete:[/] {incomplete}")]
    )
    g = result.settings.grammar
    if g is not None:  # both modes generated under it
        out.append(Text(f"every generation under {g.source} ({g.kind})", style="bold"))
    out += [
        render_bench_table(result),
        render_bench_costs(result),
        render_bench_kinds(result),
    ]
    out += [Text(bench.auto_vs_best_text(a)) for a in result.auto_vs_best]
    err: list[RenderableType] = [Text.from_markup(f"[yellow]note:[/] {w}") for w in result.warnings]
    if result.compared is not None:
        c = result.compared
        if c.comparable:
            err.append(Text(f"same record as {c.file}: the runs are comparable"))
        else:
            err.append(
                Text.from_markup(
                    f"[yellow]not comparable with {c.file}:[/] the record differs in "
                    + "; ".join(c.differences[:8])
                    + (" …" if len(c.differences) > 8 else "")
                )
            )
        for row in c.speedups:
            err.append(
                Text(
                    f"  temp {row.temp:g} K {row.draft_max}: speedup {_fmt(row.before, '.2f')}×"
                    f" -> {_fmt(row.now, '.2f')}×"
                )
            )
    err.append(Text(bench.describe_record(result.record), style="dim"))
    return out, err


# -- specgen verify and specgen trace summarize ----------------------------------------------


def _short(text: str, n: int = 28) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= n else text[: n - 1] + "…"


def _p(x: float) -> str:
    return f"{x:.3g}" if x >= 1e-300 else "<1e-300"


def render_verify_report(report: VerifyReport) -> list[RenderableType]:
    """Rich renderables for a VerifyReport: greedy table, sampling table, verdict."""
    head = f"target {report.target}   draft {report.draft}   rule {report.verify_rule}"
    if report.grammar is not None:
        head += f"   under {report.grammar}"
    out: list[RenderableType] = [Text(head, style="bold")]
    if report.greedy:
        t = Table(title="greedy: speculative vs ordinary output", title_justify="left")
        for col in (
            "prompt",
            "K",
            "tokens",
            "accepted/drafted",
            "result",
            "position",
            "gap",
            "threshold",
        ):
            t.add_column(
                col,
                justify="left" if col in ("prompt", "result") else "right",
                no_wrap=col == "prompt",
            )
        style = {"match": "green", "noise": "yellow", "fail": "bold red"}
        for c in report.greedy:
            t.add_row(
                _short(c.prompt, 24),
                str(c.k),
                str(c.n_tokens),
                f"{c.n_accepted}/{c.n_drafted}",
                Text(c.status, style=style[c.status]),
                "" if c.position is None else str(c.position),
                "" if c.gap is None else f"{c.gap:.4f}",
                "" if c.threshold is None else f"{c.threshold:.4f}",
            )
        out.append(t)
    s = report.sampling
    if s is not None:
        p = s.params
        t = Table(
            title=(
                f"sampling: {s.samples} samples per prompt, temp {p.temp}, top-k {p.top_k},"
                f"{_constraints_note(p.constraints)}"
                f" K {s.k}, seed {s.seed}; chi-square vs the target's exact distribution"
            ),
            title_justify="left",
        )
        for col in ("prompt", "position", "samples", "groups", "dof", "chi2", "p", "Holm p"):
            t.add_column(col, justify="right")
        for x in s.tests:
            bad = x.p_adjusted < s.alpha
            t.add_row(
                str(x.prompt_index + 1),
                str(x.position),
                str(x.n_samples),
                str(x.n_groups),
                str(x.dof),
                f"{x.chi2:.1f}",
                _p(x.p_value),
                Text(_p(x.p_adjusted), style="bold red" if bad else "green"),
            )
        out.append(t)
        out.append(
            Text(
                f"acceptance rate {s.acceptance_rate:.1%}; "
                + (f"smallest Holm-adjusted p {_p(s.min_p_adjusted)}" if s.tests else "no test")
                + f" (fail below {s.alpha:g}); {s.seconds:.1f} s",
                style="dim",
            )
        )
    for note in report.notes:
        out.append(Text(note, style="yellow"))
    if report.passed:
        noise = sum(c.status == "noise" for c in report.greedy)
        extra = f" ({noise} near-tie divergence(s) from batched arithmetic)" if noise else ""
        out.append(
            Text(f"PASS: the target's output is preserved{extra} [{report.seconds:.0f} s]",
                 style="bold green")
        )  # fmt: skip
    elif report.verdict == "untested":
        untested = "NOT VERIFIED: a check tested no speculation (see above)"
        out.append(Text(untested, style="bold yellow"))
    else:
        why = []
        if not report.greedy_passed:
            why.append("greedy output differs from ordinary decoding")
        if s is not None and not s.passed:
            why.append("sampled tokens do not follow the target's distribution")
        out.append(Text("FAIL: " + "; ".join(why), style="bold red"))
    return out


def render_trace_summary(s: TraceSummary) -> list[RenderableType]:
    """Rich renderables for a TraceSummary."""
    h = s.header
    # bench's sweep names its temperatures: `sampling` holds the first one's only
    smp = h.get("sampling", {})
    temps = t if isinstance(t := h.get("temps"), list) and t else [smp.get("temp")]
    temp = f"temp{'s' * (len(temps) > 1)} {', '.join(map(str, temps))}"
    out: list[RenderableType] = [
        Text(
            f"{h.get('command', '?')}: target {h.get('target')}  draft {h.get('draft')}  "
            f"{temp}  seed {h.get('seed')}",
            style="bold",
        ),
        Text(
            (f"{s.n_generations} generations, " if s.n_generations > 1 else "")
            + f"{s.n_rounds} rounds, {s.n_generated} tokens, {s.n_drafted} proposed,"
            f" {s.n_accepted} accepted ({s.acceptance_rate:.1%} of all proposals; by"
            " position below, of those tested),"
            f" finish: {s.finish_reason or 'incomplete'}"
        ),
    ]
    if len(s.by_source) > 1 or set(s.by_source) - {"draft"}:
        # who proposed what: the draft model, prompt lookup, the grammar's forced tokens
        out.append(
            Text(
                "by proposer: "
                + " · ".join(
                    f"{src} {n} proposed, {a} accepted" for src, (n, a) in s.by_source.items()
                )
            )
        )
    t = Table(title="acceptance by position in the block", title_justify="left")
    for col in ("position", "tested", "accepted", "rate", ""):
        t.add_column(col, justify="right" if col else "left")
    for p in s.by_position:
        t.add_row(str(p.position), str(p.tested), str(p.accepted), f"{p.rate:.1%}",
                  "█" * round(p.rate * 20))  # fmt: skip
    out.append(t)
    if s.rejected:
        t = Table(title="most rejected draft tokens", title_justify="left")
        for col in ("token", "text", "rejected", "emitted instead"):
            t.add_column(col, justify="right" if col in ("token", "rejected") else "left")
        for r in s.rejected:
            instead = ", ".join(f"{_short(repr(txt), 16)}×{n}" for _t, txt, n in r.preferred)
            t.add_row(str(r.token), _short(repr(r.text), 20), str(r.count), instead)
        out.append(t)
    ts = s.time_s
    total = ts["total"] or 1.0
    t = Table(title="time split", title_justify="left")
    for col in ("stage", "seconds", "share"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for k in ("draft", "verify", "sample", "other"):
        t.add_row(k, f"{ts[k]:.3f}", f"{ts[k] / total:.1%}")
    t.add_row("total", f"{ts['total']:.3f}", "")
    out.append(t)
    if s.ordinary_token_s is not None:
        out.append(
            Text(
                f"{s.n_lost} of {s.n_rounds} rounds were slower than ordinary decoding"
                f" ({s.ordinary_token_s * 1000:.3g} ms/token, {s.baseline_source}) by more"
                f" than its timing noise ({s.loss_margin:.0%}): {s.lost_s:.3f} s lost"
            )
        )
        if s.lost:
            t = Table(title="rounds that lost time (worst first)", title_justify="left")
            for col in ("round", "position", "K", "accepted", "emitted", "round ms",
                        "ordinary ms", "lost ms"):  # fmt: skip
                t.add_column(col, justify="right")
            for lr in s.lost:
                t.add_row(
                    str(lr.round), str(lr.position), str(lr.k), str(lr.n_accepted),
                    str(lr.n_emitted), f"{lr.round_s * 1000:.3g}",
                    f"{lr.ordinary_s * 1000:.3g}", f"{lr.lost_s * 1000:.3g}",
                )  # fmt: skip
            out.append(t)
    for note in s.notes:
        out.append(Text(note, style="yellow"))
    return out


# -- specgen models --------------------------------------------------------------------------


def render_model_tables(pairs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[Any]:
    """Rich tables for `specgen models` (pure)."""
    pt = Table(title="pairs", title_justify="left", box=box.SIMPLE_HEAD)
    pt.add_column("name", no_wrap=True)
    pt.add_column("target + draft", no_wrap=True)
    pt.add_column("K", justify="right")
    pt.add_column("chat")
    pt.add_column("ready")
    pt.add_column("good for", overflow="fold", min_width=12)
    for p in pairs:
        pt.add_row(
            p["name"],
            f"{p['target']}\n+ {p['draft']}",
            str(p["draft_max"]),
            "yes" if p.get("chat") else "",
            "[green]yes[/]" if p["ready"] else "no",
            p["note"],
        )
    mt = Table(
        title="models",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        caption="* not verified from a specgen developer's machine",
        caption_justify="left",
    )
    mt.add_column("name", no_wrap=True)
    mt.add_column("quant", no_wrap=True)
    mt.add_column("size", justify="right", no_wrap=True)
    mt.add_column("on disk", no_wrap=True)
    mt.add_column("path, or Hub repo/file", overflow="fold", min_width=16)
    for r in rows:
        if r["downloaded"]:
            disk, where = f"[green]{human_bytes(r['bytes_on_disk'])}[/]", r["path"]
        elif r.get("problem"):
            disk = f"[red]{r['status']}[/]"
            where = f"{r['path']}\n[red]not loaded: `specgen download {r['name']} --force`[/]"
        else:
            disk = "not built" if r["embedded"] else "[dim]-[/]"
            where = f"[dim]{r['where']}[/]"
        mt.add_row(
            r["name"] + ("" if r["verified"] else " *"),
            r["quant"],
            f"~{r['size_gb']:g} GB" if r["size_gb"] else "",
            disk,
            where,
        )
    return [pt, mt]


# -- specgen models --local ------------------------------------------------------------------


def tokenizer_text(vocab: Any) -> str:
    """A group's title: the tokenizer's kind and size, its special ids ("SentencePiece
    262,144 · BOS 2 · EOS 1"), or what a group without one holds."""
    if vocab is None:
        return "no tokenizer (projectors, unreadable headers): not usable as target or draft"
    from specgen.compat import describe
    from specgen.models.local import vocab_info

    return f"{describe(vocab_info(vocab))} · BOS {vocab.bos} · EOS {vocab.eos}"


def render_local_tables(groups: list[Any], roots: list[tuple[str, Any]]) -> list[Any]:
    """`specgen models --local` (pure): one table per tokenizer group, largest model first,
    then where it looked."""
    out: list[Any] = []
    for i, g in enumerate(groups, 1):
        # numbered: two groups can share a kind and size yet differ in their tokens
        title = tokenizer_text(g.vocab)
        if g.vocab is not None:
            title = f"tokenizer {i}: {title}"
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("name", "from", "size", "path"):
            t.add_column(col, justify="right" if col == "size" else "left", no_wrap=True)
        for m in g.models:
            t.add_row(m.name, m.source, human_bytes(m.size_bytes), str(m.path))
        out.append(t)
        if g.vocab is not None and len(g.models) > 1:
            out.append(
                Text(
                    "  same tokenizer: a smaller one can draft for a larger one"
                    " (`specgen run -m LARGER -md SMALLER`, or `-md auto`)",
                    style="dim",
                )
            )
    if not groups:
        out.append(Text("no GGUF files found"))
    looked = ", ".join(f"{tool} {path}" for tool, path in roots)
    out.append(Text(f"looked in: {looked}", style="dim"))
    return out


def local_groups_json(groups: list[Any], roots: list[tuple[str, Any]]) -> dict[str, Any]:
    """`specgen models --local --json` (pure)."""
    return {
        "groups": [
            {
                "tokenizer": None
                if g.vocab is None
                else {
                    "vocab_type": g.vocab.vocab_type,
                    "n_vocab": g.vocab.n_vocab,
                    "bos": g.vocab.bos,
                    "eos": g.vocab.eos,
                    "add_bos": g.vocab.add_bos,
                    "add_eos": g.vocab.add_eos,
                    "description": tokenizer_text(g.vocab),
                },
                "models": [
                    {
                        "name": m.name,
                        "source": m.source,
                        "size_bytes": m.size_bytes,
                        "path": str(m.path),
                        "architecture": m.vocab.architecture if m.vocab else None,
                    }
                    for m in g.models
                ],
            }
            for g in groups
        ],
        "searched": [{"source": tool, "path": str(path)} for tool, path in roots],
    }


def human_bytes(n: int | None) -> str:
    """A byte count for people: "1.23 GB", "4.00 kB", "12 B", or "size unknown"."""
    if n is None:
        return "size unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _constraints_note(c: Constraints) -> str:
    """' logit bias on N tokens, repeat-penalty R, ... ,' for a verify title ('' for none)."""
    bits = [f" logit bias on {len(c.logit_bias)} token(s)"] if c.logit_bias else []
    if c.penalizes:
        last = "all" if c.repeat_last_n < 0 else str(c.repeat_last_n)
        bits.append(
            f" repeat-penalty {c.repeat_penalty}, presence-penalty {c.presence_penalty},"
            f" frequency-penalty {c.frequency_penalty} over the last {last}"
        )
    return "".join(b + "," for b in bits)
