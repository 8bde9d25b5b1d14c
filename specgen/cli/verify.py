"""`specgen verify` and `specgen trace summarize`: thin commands over verify/ and trace/,
rendered by `specgen.ui.reports`. The report goes to stdout, progress to stderr. The model side
(numpy, llama.cpp) is imported inside the commands so that `specgen --help` starts fast."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from specgen.cli.loading import open_session, show_messages
from specgen.cli.options import (
    GRAMMAR,
    MODEL,
    OUTPUT,
    SAMPLING,
    Group,
    JsonOpt,
    ModelFlags,
    OutputFlags,
    SamplingFlags,
    flag,
    grouped,
    opt,
)
from specgen.errors import ConfigError
from specgen.flags import parse_draft_max
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


@dataclass(frozen=True)
class VerifyFlags:
    """verify's own options (--samples, --positions, --draft-max, --alpha, --check,
    --prompt).

    Raises:
        ConfigError: --check not all, greedy or sampling; --draft-max outside 1 to 64.
    """

    samples: int = flag("--samples", default=400, help="Speculative samples per sampling prompt.")
    positions: int = flag("--positions", default=3, help="Generated positions tested per sample.")
    draft_max: int = flag("--draft-max", default=3, help="Block size K of the sampling check.")
    alpha: float = flag("--alpha", default=1e-3, help="Significance level after Holm correction.")
    check: str = flag("--check", default="all", help="Which checks: all, greedy or sampling.")
    prompt: tuple[str, ...] = flag(
        "--prompt",
        default=(),
        kind=list[str] | None,
        cli_default=None,
        help="Prompt to use instead of the built-in ones (repeatable).",
    )

    def __post_init__(self) -> None:
        parse_draft_max(str(self.draft_max))
        if self.check not in ("all", "greedy", "sampling"):
            raise ConfigError(f"--check must be all, greedy or sampling, got {self.check!r}")
        object.__setattr__(self, "prompt", tuple(self.prompt or ()))  # Typer: a list or None


VERIFY = Group.of(VerifyFlags)
#: the sampling check's own defaults: the target's raw distribution at temperature 1 but
#: for top-k
SAMPLING_CHECKED = SAMPLING.without("max_tokens", "draft_max", "stop", "ignore_eos").but(
    temp=opt("--temp", default=1.0, help="Sampling check temperature."),
    top_k=opt("--top-k", help="Top-k (0 = off)."),
    top_p=1.0,
    min_p=0.0,
    seed=opt("--seed", kind=int, default=0, help="Random seed (-1 = random)."),
)


@grouped
def verify(
    *,
    model: Annotated[ModelFlags, MODEL.without("swa_full", "draft_p_min").but(ctx_size=1024)],
    v: Annotated[VerifyFlags, VERIFY],
    sampling: Annotated[SamplingFlags, SAMPLING_CHECKED + GRAMMAR],
    out: Annotated[OutputFlags, OUTPUT.only("json_out", "verbose")],
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
    raise typer.Exit(verify_command(model, sampling, v, out))


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
    """Load the pair, run the checks (`specgen.Pair.verify`), print the report; returns 0
    (pass) or 1 (fail)."""
    from specgen import Pair  # start-up time: the API loads numpy and llama.cpp

    # start-up time: the reports load rich's tables
    from specgen.ui import reports
    from specgen.ui.progress import stage_status

    # start-up time: verify loads numpy
    from specgen.verify.config import config_of, drafter_factory

    options: dict[str, Any] = dict(
        samples=v.samples, positions=v.positions, draft_max=v.draft_max, alpha=v.alpha,
        check=v.check, prompts=v.prompt,
    )  # fmt: skip
    config_of(sampling, **options)  # a usage error before the models load
    with open_session(model, out, sampling.params()) as opened:
        drafter_factory(opened.drafter)  # no draft: refused before the models' messages
        show_messages(opened)
        with stage_status(output.err_console(), "verifying") as say:
            report = Pair(opened).verify(sampling, progress=say, **options)
    code = 0 if report.passed else 1
    try:
        if out.json_out:
            output.write_json(report.to_dict())
            for note in report.notes:  # in the JSON too; said where a person reads
                output.notice(note)
        else:
            output.show(*reports.render_verify_report(report))
    except BrokenPipeError:  # `| head`: the status is still the verdict
        output.discard_stdout()
    return code
