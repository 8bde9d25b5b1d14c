"""`specgen verify` and `specgen trace summarize`: thin commands over verify.py and trace.py,
rendered with Rich. The report goes to stdout, progress to stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from specgen.cli.options import (
    CtxOpt,
    DraftOpt,
    JsonOpt,
    ModelsOpt,
    NgldOpt,
    NglOpt,
    PairOpt,
    TargetOpt,
    ThreadsOpt,
    VerboseOpt,
)

VERIFY_EPILOG = (
    "Examples:\n\n"
    "  specgen verify                                   # the embedded demo pair\n\n"
    "  specgen verify -m big.gguf -md small.gguf --samples 800\n\n"
    "  specgen verify --pair qwen2.5-coder-7b --check greedy --json"
)
SUMMARIZE_EPILOG = (
    "Examples:\n\n"
    "  specgen run --trace run.jsonl -n 200 'Once upon a time'\n\n"
    "  specgen trace summarize run.jsonl\n\n"
    "  specgen trace summarize run.jsonl --json | jq .by_position"
)


def register(app: typer.Typer) -> None:
    """Add `verify` and the `trace` group (`trace summarize`) to `app`."""
    app.command("verify", epilog=VERIFY_EPILOG)(verify)
    trace_app = typer.Typer(
        help="Read --trace files.", no_args_is_help=True, rich_markup_mode="rich"
    )
    trace_app.command("summarize", epilog=SUMMARIZE_EPILOG)(summarize)
    app.add_typer(trace_app, name="trace")


def verify(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    models: ModelsOpt = None,
    samples: Annotated[
        int, typer.Option("--samples", help="Speculative samples per sampling prompt.")
    ] = 400,
    positions: Annotated[
        int, typer.Option("--positions", help="Generated positions tested per sample.")
    ] = 3,
    draft_max: Annotated[
        int, typer.Option("--draft-max", help="Block size K of the sampling check.")
    ] = 3,
    temp: Annotated[float, typer.Option("--temp", help="Sampling check temperature.")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Top-k (0 = off).")] = 40,
    top_p: Annotated[float, typer.Option("--top-p", help="Top-p (1 = off).")] = 1.0,
    min_p: Annotated[float, typer.Option("--min-p", help="Min-p (0 = off).")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    alpha: Annotated[
        float, typer.Option("--alpha", help="Significance level after Holm correction.")
    ] = 1e-3,
    check: Annotated[
        str, typer.Option("--check", help="Which checks: all, greedy or sampling.")
    ] = "all",
    prompt: Annotated[
        list[str] | None,
        typer.Option("--prompt", help="Prompt to use instead of the built-in ones (repeatable)."),
    ] = None,
    json_out: JsonOpt = False,
    n_gpu_layers: NglOpt = 0,
    n_gpu_layers_draft: NgldOpt = 0,
    threads: ThreadsOpt = 0,
    ctx_size: CtxOpt = 1024,
    verbose: VerboseOpt = False,
) -> None:
    """Check that speculation leaves the target's output unchanged on your pair.

    Greedy: speculative output must equal ordinary output; near-ties flipped by
    batched arithmetic are reported as numeric noise.

    Sampling: the tokens at the first positions must follow the target's own
    distribution (chi-square per position, Holm-corrected).

    Exit code 0 = pass, 1 = fail.
    """
    code = _verify(
        target, draft, pair, models, samples, positions, draft_max, temp, top_k, top_p,
        min_p, seed, alpha, check, prompt, json_out, n_gpu_layers, n_gpu_layers_draft,
        threads, ctx_size, verbose,
    )  # fmt: skip
    raise typer.Exit(code)


def summarize(
    file: Annotated[Path, typer.Argument(help="A trace written by --trace.")],
    top: Annotated[int, typer.Option("--top", help="Rows in the top-N tables.")] = 10,
    json_out: JsonOpt = False,
) -> None:
    """Acceptance by block position, most rejected tokens, time split, lost rounds."""
    from specgen.trace import summarize as summarize_trace

    s = summarize_trace(file, top=top)
    if json_out:
        sys.stdout.write(json.dumps(s.to_dict(), ensure_ascii=False) + "\n")
        return
    from rich.console import Console

    console = Console()
    for renderable in render_summary(s):
        console.print(renderable)


def _verify(
    target, draft, pair, models, samples, positions, draft_max, temp, top_k, top_p, min_p,
    seed, alpha, check, prompts, json_out, ngl, ngld, threads, ctx_size, verbose,
) -> int:  # fmt: skip
    from rich.console import Console

    from specgen.errors import ConfigError
    from specgen.llamacpp import set_verbose
    from specgen.models.resolve import resolve_models
    from specgen.sampling import SamplingParams
    from specgen.session import ModelSpec, load
    from specgen.verify import VerifyConfig, drafter_factory, verify

    if check not in ("all", "greedy", "sampling"):
        raise ConfigError(f"--check must be all, greedy or sampling, got {check!r}")
    set_verbose(verbose)
    params = SamplingParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p)
    extra = {}
    if prompts:
        encoded = tuple(p.encode("utf-8", "surrogateescape") for p in prompts)
        extra = {"greedy_prompts": encoded, "sampling_prompts": encoded}
    config = VerifyConfig(
        samples=samples, positions=positions, k=draft_max, params=params, seed=seed,
        alpha=alpha, greedy=check in ("all", "greedy"), sampling=check in ("all", "sampling"),
        **extra,
    )  # fmt: skip
    err = Console(stderr=True)
    with err.status("preparing models") as spinner:
        t_path, d_path, _k = resolve_models(target, draft, pair, models, spinner.update)
        spec = ModelSpec.from_flags(t_path, d_path, ctx_size, ngl, ngld, threads)
        loaded = load(spec, params, status=spinner.update)
    try:
        make = drafter_factory(loaded.drafter)
        with err.status("verifying") as spinner:
            report = verify(loaded.target, make, config, loaded.draft_name, spinner.update)
    finally:
        loaded.close()
    if json_out:
        sys.stdout.write(json.dumps(report.to_dict(), ensure_ascii=False) + "\n")
    else:
        console = Console()
        for renderable in render_report(report):
            console.print(renderable)
    return 0 if report.passed else 1


# -- rendering (pure: data in, renderables out) -------------------------------------------


def _short(text: str, n: int = 28) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= n else text[: n - 1] + "…"


def _p(x: float) -> str:
    return f"{x:.3g}" if x >= 1e-300 else "<1e-300"


def render_report(report) -> list:
    """Rich renderables for a VerifyReport: greedy table, sampling table, verdict."""
    from rich.table import Table
    from rich.text import Text

    out: list = [Text(f"target {report.target}   draft {report.draft}", style="bold")]
    if report.greedy:
        t = Table(title="greedy: speculative vs ordinary output", title_justify="left")
        for col in ("prompt", "K", "tokens", "result", "position", "gap", "threshold"):
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
                f"acceptance rate {s.acceptance_rate:.1%}; smallest Holm-adjusted p"
                f" {_p(s.min_p_adjusted)} (fail below {s.alpha:g}); {s.seconds:.1f} s",
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
    else:
        why = []
        if not report.greedy_passed:
            why.append("greedy output differs from ordinary decoding")
        if s is not None and not s.passed:
            why.append("sampled tokens do not follow the target's distribution")
        out.append(Text("FAIL: " + "; ".join(why), style="bold red"))
    return out


def render_summary(s) -> list:
    """Rich renderables for a TraceSummary."""
    from rich.table import Table
    from rich.text import Text

    h = s.header
    smp = h.get("sampling", {})
    out: list = [
        Text(
            f"{h.get('command', '?')}: target {h.get('target')}  draft {h.get('draft')}  "
            f"temp {smp.get('temp')}  seed {h.get('seed')}",
            style="bold",
        ),
        Text(
            (f"{s.n_generations} generations, " if s.n_generations > 1 else "")
            + f"{s.n_rounds} rounds, {s.n_generated} tokens, {s.n_drafted} drafted,"
            f" {s.n_accepted} accepted (alpha {s.acceptance_rate:.1%}),"
            f" finish: {s.finish_reason or 'incomplete'}"
        ),
    ]
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
                f" ({s.ordinary_token_s * 1000:.3g} ms/token, {s.baseline_source}):"
                f" {s.lost_s:.3f} s lost"
            )
        )
        if s.lost:
            t = Table(title="rounds that lost time (worst first)", title_justify="left")
            for col in ("round", "position", "K", "accepted", "emitted", "round ms",
                        "ordinary ms", "lost ms"):  # fmt: skip
                t.add_column(col, justify="right")
            for r in s.lost:
                t.add_row(
                    str(r.round), str(r.position), str(r.k), str(r.n_accepted),
                    str(r.n_emitted), f"{r.round_s * 1000:.3g}", f"{r.ordinary_s * 1000:.3g}",
                    f"{r.lost_s * 1000:.3g}",
                )  # fmt: skip
            out.append(t)
    for note in s.notes:
        out.append(Text(note, style="yellow"))
    return out
