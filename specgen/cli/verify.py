"""`specgen verify` and `specgen trace summarize`: thin commands over verify.py and trace.py,
rendered by `specgen.ui.reports`. The report goes to stdout, progress to stderr. The model side
(numpy, llama.cpp) is imported inside the commands so that `specgen --help` starts fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from specgen.cli.options import (
    CtxOpt,
    DraftOpt,
    JsonOpt,
    LookupOpt,
    ModelsOpt,
    NgldOpt,
    NglOpt,
    PairOpt,
    RpcOpt,
    TargetOpt,
    ThreadsOpt,
    VerboseOpt,
    VerifyOpt,
    check_model_flags,
    check_sampling_flags,
    check_spec_flags,
    seed_or_random,
)
from specgen.errors import ConfigError
from specgen.models.resolve import resolve_models
from specgen.ui import output

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
    seed: Annotated[int, typer.Option("--seed", help="Random seed (-1 = random).")] = 0,
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
    rpc: RpcOpt = None,
    threads: ThreadsOpt = 0,
    ctx_size: CtxOpt = 1024,
    verbose: VerboseOpt = False,
    verify_rule: VerifyOpt = None,
    lookup: LookupOpt = None,
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
        threads, ctx_size, verbose, rpc, verify_rule, lookup,
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
        output.write_json(s.to_dict())
        return
    from specgen.ui import reports

    output.show(*reports.render_trace_summary(s))


def _verify(
    target, draft, pair, models, samples, positions, draft_max, temp, top_k, top_p, min_p,
    seed, alpha, check, prompts, json_out, ngl, ngld, threads, ctx_size, verbose, rpc=None,
    verify_rule=None, lookup=None,
) -> int:  # fmt: skip
    from specgen.llamacpp import set_verbose
    from specgen.sampling import SamplingParams
    from specgen.session import ModelSpec, load, load_notes, resolve_lookup, resolve_verify
    from specgen.ui import reports
    from specgen.ui.progress import stage_status
    from specgen.verify import VerifyConfig, drafter_factory, verify

    if check not in ("all", "greedy", "sampling"):
        raise ConfigError(f"--check must be all, greedy or sampling, got {check!r}")
    check_model_flags(
        target=target, draft=draft, ctx_size=ctx_size, threads=threads,
        n_gpu_layers=ngl, n_gpu_layers_draft=ngld,
    )  # fmt: skip
    check_sampling_flags(temp=temp)
    check_spec_flags(verify=verify_rule, lookup=lookup, draft=draft)
    seed = seed_or_random(seed)
    set_verbose(verbose, output.log)
    params = SamplingParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p)
    extra: dict[str, Any] = {}
    if prompts:
        encoded = tuple(p.encode("utf-8", "surrogateescape") for p in prompts)
        extra = {"greedy_prompts": encoded, "sampling_prompts": encoded}
    config = VerifyConfig(
        samples=samples, positions=positions, k=draft_max, params=params, seed=seed,
        alpha=alpha, greedy=check in ("all", "greedy"), sampling=check in ("all", "sampling"),
        verify_rule=resolve_verify(verify_rule, params), **extra,
    )  # fmt: skip
    with output.spinner("preparing models") as spinner:
        t_path, d_path, _k = resolve_models(target, draft, pair, models, spinner.update)
        spec = ModelSpec.from_flags(t_path, d_path, ctx_size, ngl, ngld, threads, rpc)
        hybrid = resolve_lookup(lookup, d_path, params)
        loaded = load(spec, params, status=spinner.update, lookup=hybrid)
    try:
        for note in load_notes(spec, loaded):
            output.notice(note)
        make = drafter_factory(loaded.drafter)
        with stage_status(output.err_console(), "verifying") as say:
            report = verify(loaded.target, make, config, loaded.draft_name, say)
    finally:
        loaded.close()
    if json_out:
        output.write_json(report.to_dict())
    else:
        output.show(*reports.render_verify_report(report))
    return 0 if report.passed else 1
