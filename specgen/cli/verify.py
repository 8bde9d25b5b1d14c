"""`specgen verify` and `specgen trace summarize`: thin commands over verify/ and trace/,
rendered by `specgen.ui.reports`. The report goes to stdout, progress to stderr. The model side
(numpy, llama.cpp) is imported inside the commands so that `specgen --help` starts fast."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

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
    grouped,
    opt,
)
from specgen.flags import at_least
from specgen.ui import output
from specgen.verify.options import VerifyFlags

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


#: verify's own options (`specgen.verify.options.VerifyFlags`, also `Pair.verify`'s)
VERIFY = Group(
    VerifyFlags,
    samples=opt("--samples", help="Speculative samples per sampling prompt."),
    positions=opt("--positions", help="Generated positions tested per sample (at least 2)."),
    draft_max=opt(
        "--draft-max",
        metavar="K",
        help="Block size K of the sampling check (at most --positions - 1).",
    ),
    alpha=opt("--alpha", help="Significance level after Holm correction."),
    check=opt("--check", help="Which checks: all, greedy or sampling."),
    prompts=opt(
        "--prompt",
        kind=list[str] | None,
        default=None,
        help="Prompt to use instead of the built-in ones (repeatable).",
    ),
)
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

    Exit code 0 = pass, 1 = fail or not verified (nothing of speculation tested).
    """
    raise typer.Exit(verify_command(model, sampling, v, out))


def summarize(
    file: Annotated[Path, typer.Argument(help="A trace written by --trace.")],
    top: Annotated[int, typer.Option("--top", help="Rows in the top-N tables.")] = 10,
    json_out: JsonOpt = False,
) -> None:
    """Acceptance by block position, most rejected tokens, time split, lost rounds."""
    from specgen.trace import summarize as summarize_trace  # start-up time: numpy

    at_least("--top", top, 0)  # a negative N had cut the tables' last rows
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

    config_of(sampling, v)  # a usage error before the models load
    with open_session(model, out, sampling.params()) as opened:
        drafter_factory(opened.drafter)  # no draft: refused before the models' messages
        show_messages(opened)
        with stage_status(output.err_console(), "verifying") as say:
            report = Pair(opened).verify(sampling, progress=say, **dataclasses.asdict(v))
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
