"""The outputs of `specgen bench`: atomic writes of the JSON result, README-ready Markdown
tables with a paragraph describing the record, and the optional matplotlib plot."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from specgen.bench.results import ALL_KINDS, BenchResult, PairSummary, record_fingerprint
from specgen.bench.summary import auto_vs_best_text, pct
from specgen.errors import ConfigError
from specgen.events import ACCEPTANCE_HOW
from specgen.fileio import atomic_write

# -- outputs ------------------------------------------------------------------------------------


def write_json(result: BenchResult, path: Path) -> None:
    text = json.dumps(result.to_dict(), indent=1, ensure_ascii=False) + "\n"
    atomic_write(path, text.encode("utf-8"))


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def speedup_text(s: PairSummary) -> str:
    """'1.62× [1.55, 1.70]' (or '–')."""
    if s.speedup is None:
        return "–"
    lo, hi = s.speedup_ci95
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None and s.n_pairs > 1 else ""
    return f"{s.speedup:.2f}×{ci}"


def render_markdown(result: BenchResult) -> str:
    """Two README-ready tables (per configuration; speedup by prompt kind) and the record."""
    rec = result.record
    lines = [
        "| temp | K | ordinary tok/s | speculative tok/s | speedup [95% CI] | acceptance"
        " | tokens/pass | TTFT ord / spec (ms) | latency p50/p95/p99 (ms) | bound | achieved"
        " | host ms/round |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in result.configs:
        o = c.overall
        lat = o.speculative.latency_ms
        sp = speedup_text(o)
        if o.speedup is not None and o.speedup < 1:
            sp += " (slower)"
        lines.append(
            f"| {c.temp:g} | {c.draft_max} | {_f(o.ordinary.tokens_per_s, '.1f')}"
            f" | {_f(o.speculative.tokens_per_s, '.1f')} | {sp}"
            f" | {pct(o.acceptance_rate)} | {_f(o.tokens_per_pass, '.2f')}"
            f" | {_f(_x1000(o.ordinary.ttft_s), '.0f')} /"
            f" {_f(_x1000(o.speculative.ttft_s), '.0f')}"
            f" | {_f(lat.p50, '.1f')} / {_f(lat.p95, '.1f')} / {_f(lat.p99, '.1f')}"
            f" | {_f(o.theoretical_speedup, '.2f')}×"
            f" | {pct(o.achieved_fraction)}"
            f" | {_f(_x1000(o.host_s_per_round), '.2f')} |"
        )
    lines += ["", f"Acceptance: accepted / drafted, where {ACCEPTANCE_HOW}."]
    kinds = list(dict.fromkeys(k for c in result.configs for k in c.by_kind))
    if kinds:
        lines += ["", "Speedup by prompt kind (acceptance in parentheses):", ""]
        heads = [f"temp {c.temp:g}, K {c.draft_max}" for c in result.configs]
        lines.append("| kind | " + " | ".join(heads) + " |")
        lines.append("|---|" + "---:|" * len(heads))
        for kind in kinds:
            cells = []
            for c in result.configs:
                s = c.by_kind.get(kind)
                cells.append(
                    "–" if s is None or s.speedup is None
                    else f"{s.speedup:.2f}× ({pct(s.acceptance_rate)})"
                )  # fmt: skip
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    if result.auto_vs_best:
        lines.append("")
        lines += [f"- {auto_vs_best_text(a)}" for a in result.auto_vs_best]
    if result.warnings:  # the notes the terminal shows, slower configurations first
        lines.append("")
        lines += [f"- Note: {w}" for w in result.warnings]
    if rec:
        lines += ["", describe_record(rec)]
    return "\n".join(lines) + "\n"


def _x1000(x: float | None) -> float | None:
    return None if x is None else x * 1000


def describe_record(rec: dict[str, Any]) -> str:
    """One paragraph naming the machine, software, models and settings."""
    m, sw, t, d = rec["machine"], rec["software"], rec["target"], rec["draft"]
    gpu = ", ".join(f"{g['name']} ({g['memory_bytes'] / 2**30:.0f} GiB)" for g in m["gpus"])
    mem = f", {m['memory_bytes'] / 2**30:.0f} GiB RAM" if m.get("memory_bytes") else ""

    def model(x: dict[str, Any]) -> str:
        if x.get("sha256") is None:
            return x["file"]
        q = f" {x['quantization']}" if x.get("quantization") else ""
        return f"{x['file']}{q} (sha256 {x['sha256'][:12]}…, -ngl {x['n_gpu_layers']})"

    return (
        f"Machine: {m['cpu']}, {m['cpus_usable']} of {m['cpu_count']} CPUs usable{mem}"
        f"{', GPU ' + gpu if gpu else ''}; {m['os']}. "
        f"llama.cpp {sw['llama_cpp']} via llama-cpp-python {sw['llama_cpp_python']}"
        f" ({sw['backend']} backend), specgen {sw['specgen']}"
        f"{' at ' + sw['commit'] if sw.get('commit') else ''}, {rec['threads']} threads,"
        f" context {rec['n_ctx']}. "
        f"Target {model(t)}; draft {model(d)}. "
        f"{_rpc_sentence(rec)}"
        f"{rec['n_prompts']} prompts (set {rec['prompt_set_sha256'][:12]}…), -n {rec['n_tokens']},"
        f" {rec['runs']} run(s), seed {rec['seed']}, top-k {rec['sampling']['top_k']},"
        f" top-p {rec['sampling']['top_p']}, min-p {rec['sampling']['min_p']}."
        f" Record fingerprint {record_fingerprint(rec)}, {rec['date'][:10]}."
    )


def _rpc_sentence(rec: dict[str, Any]) -> str:
    if not rec.get("rpc"):
        return ""
    t, d = rec["target"].get("devices", []), rec["draft"].get("devices", [])
    return (
        f"RPC server(s) {', '.join(rec['rpc'])}; target on {' + '.join(t)},"
        f" draft on {' + '.join(d) or 'none'}. "
    )


def write_markdown(result: BenchResult, path: Path) -> None:
    atomic_write(path, render_markdown(result).encode("utf-8"))


# `specgen[plot]` on PyPI is an unrelated project: name the checkout's extra, or matplotlib
PLOT_MISSING = (
    "--plot needs matplotlib: .venv/bin/pip install -e '.[plot]' in the specgen checkout"
    " (or pip install matplotlib)"
)


def check_plot_available() -> None:
    """Raises ConfigError (one line) when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(PLOT_MISSING)


def pyplot() -> Any:
    """matplotlib's pyplot, drawing off-screen (the Agg backend: no display needed).

    Raises:
        ConfigError: matplotlib is not installed.
    """
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: Path, dpi: int) -> None:
    """Lay out `fig`, write it to `path` as a PNG of `dpi` dots per inch in one atomic
    write, and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def write_plot(result: BenchResult, path: Path) -> None:
    """PNG: speedup against block size per prompt kind (one panel per temperature), and
    acceptance by position in the block.

    Raises:
        ConfigError: matplotlib is not installed.
    """
    plt = pyplot()
    import matplotlib.ticker

    temps = list(dict.fromkeys(c.temp for c in result.configs))
    fig, axes = plt.subplots(1, len(temps) + 1, figsize=(5 * (len(temps) + 1), 4), squeeze=False)
    for ax, temp in zip(axes[0], temps, strict=False):
        cfgs = [c for c in result.configs if c.temp == temp]
        labels = [c.draft_max for c in cfgs]
        xs = range(len(cfgs))
        kinds = list(dict.fromkeys(k for c in cfgs for k in c.by_kind))
        for kind in [ALL_KINDS, *kinds]:
            groups = [c.overall if kind == ALL_KINDS else c.by_kind.get(kind) for c in cfgs]
            ys = [np.nan if g is None or g.speedup is None else g.speedup for g in groups]
            style = {"linewidth": 3, "color": "black"} if kind == ALL_KINDS else {}
            ax.plot(list(xs), ys, marker="o", label=kind, **style)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(list(xs), labels)
        ax.set_xlabel("block size K")
        ax.set_ylabel("speedup (× ordinary decoding)")
        ax.set_title(f"temperature {temp:g}")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for c in result.configs:
        acc = c.overall.acceptance_by_position
        ys = [np.nan if a is None else a for a in acc]
        if ys:
            ax.plot(range(1, len(ys) + 1), ys, marker=".", label=f"t {c.temp:g}, K {c.draft_max}")
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("position in block")
    ax.set_ylabel("acceptance (given the previous accepted)")
    ax.set_title("acceptance by position")
    ax.legend(fontsize=7)
    save_png(fig, path, dpi=120)
