"""`specgen verify` and `specgen trace summarize`: thin commands over verify.py and trace/,
rendered by `specgen.ui.reports`. The report goes to stdout, progress to stderr. The model side
(numpy, llama.cpp) is imported inside the commands so that `specgen --help` starts fast."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from specgen.cli.loading import open_session, show_messages
from specgen.cli.options import (
    CtxOpt,
    DraftOpt,
    FrequencyPenaltyOpt,
    GrammarFileOpt,
    GrammarOpt,
    JsonOpt,
    JsonSchemaFileOpt,
    JsonSchemaOpt,
    LogitBiasOpt,
    LookupOpt,
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
    SamplingFlags,
    TargetOpt,
    ThreadsOpt,
    VerboseOpt,
    VerifyOpt,
    pick,
    seed_or_random,
)
from specgen.errors import ConfigError
from specgen.ui import output

VERIFY_EPILOG = (
    "Examples:\n\n"
    "  specgen verify                                   # the embedded demo pair\n\n"
    "  specgen verify -m big.gguf -md small.gguf --samples 800\n\n"
    "  specgen verify --pair qwen2.5-coder-7b --check greedy --json\n\n"
    "  specgen verify -j '{\"type\": \"object\"}' --prompt 'A person as JSON:'"
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
    logit_bias: LogitBiasOpt = None,
    repeat_penalty: RepeatPenaltyOpt = 1.0,
    repeat_last_n: RepeatLastNOpt = 64,
    presence_penalty: PresencePenaltyOpt = 0.0,
    frequency_penalty: FrequencyPenaltyOpt = 0.0,
    grammar: GrammarOpt = None,
    grammar_file: GrammarFileOpt = None,
    json_schema: JsonSchemaOpt = None,
    json_schema_file: JsonSchemaFileOpt = None,
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

    With --grammar or --json-schema both checks run under it: the output must equal
    ordinary constrained decoding, and follow the target's constrained distribution.

    Exit code 0 = pass, 1 = fail.
    """
    given = locals()
    # --verify's parameter is named verify_rule: `verify` is this command
    sampling = SamplingFlags.pick(given, draft_max=str(draft_max), verify=verify_rule)
    model, out = ModelFlags.pick(given), OutputFlags.pick(given)
    raise typer.Exit(verify_command(model, sampling, VerifyFlags.pick(given), out))


@dataclass(frozen=True)
class VerifyFlags:
    """verify's own options (--samples, --positions, --alpha, --check, --prompt).

    Raises:
        ConfigError: --check not all, greedy or sampling.
    """

    samples: int = 400
    positions: int = 3
    alpha: float = 1e-3
    check: str = "all"
    prompt: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.check not in ("all", "greedy", "sampling"):
            raise ConfigError(f"--check must be all, greedy or sampling, got {self.check!r}")
        object.__setattr__(self, "prompt", tuple(self.prompt or ()))  # Typer: a list or None

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> VerifyFlags:
        """From the command's ``locals()`` (see `specgen.flags.pick`)."""
        return pick(cls, values)


def summarize(
    file: Annotated[Path, typer.Argument(help="A trace written by --trace.")],
    top: Annotated[int, typer.Option("--top", help="Rows in the top-N tables.")] = 10,
    json_out: JsonOpt = False,
) -> None:
    """Acceptance by block position, most rejected tokens, time split, lost rounds."""
    from specgen.trace import summarize as summarize_trace  # start-up time: numpy

    s = summarize_trace(file, top=top)
    if json_out:
        output.write_json(s.to_dict())
        return
    from specgen.ui import reports  # start-up time: the reports load rich's tables, numpy

    output.show(*reports.render_trace_summary(s))


def verify_command(
    model: ModelFlags, sampling: SamplingFlags, v: VerifyFlags, out: OutputFlags
) -> int:
    """Load the pair, run the checks, print the report; returns 0 (pass) or 1 (fail)."""
    # start-up time: verify and the reports load numpy and rich's tables
    from specgen.ui import reports
    from specgen.ui.progress import stage_status
    from specgen.verify import drafter_factory, verify

    config = _config(sampling, v)
    with open_session(model, out, config.params) as opened:
        make = drafter_factory(opened.drafter)
        show_messages(opened)
        with stage_status(output.err_console(), "verifying") as say:
            report = verify(opened.target, make, config, opened.draft_name, say)
    if out.json_out:
        output.write_json(report.to_dict())
    else:
        output.show(*reports.render_verify_report(report))
    return 0 if report.passed else 1


def _config(sampling: SamplingFlags, v: VerifyFlags):
    from specgen.stages import grammar_spec  # start-up time: llguidance, when a grammar is given
    from specgen.verify import VerifyConfig  # start-up time: verify loads numpy

    extra: dict[str, Any] = {}
    if v.prompt:
        encoded = tuple(p.encode("utf-8", "surrogateescape") for p in v.prompt)
        extra = {"greedy_prompts": encoded, "sampling_prompts": encoded}
    k = sampling.k
    assert k is not None  # verify's --draft-max is a number
    return VerifyConfig(
        samples=v.samples, positions=v.positions, k=k, params=sampling.params(),
        seed=seed_or_random(sampling.seed), alpha=v.alpha, greedy=v.check in ("all", "greedy"),
        sampling=v.check in ("all", "sampling"),
        verify_rule=sampling.verify_rule,  # type: ignore[arg-type]
        grammar=grammar_spec(sampling), **extra,
    )  # fmt: skip
