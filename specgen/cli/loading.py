"""How every command loads its models and says what the user should know about them: a
spinner while `specgen.session.open` resolves and loads (`open_session`), then the session's
warnings and notes, one line each on stderr (`show_messages`), the same way for run, chat,
bench and verify. A command shows them once its own checks of the loaded pair have passed
(run's prompt must fit the context), so that an error is said alone. And the notes run and
chat share about a generation: a seed that cannot reproduce (`note_seed`), a constrained
output that -n or the context cut (`say_cut_constraint`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specgen.cli.options import ModelFlags, OutputFlags, SamplingFlags
from specgen.events import Done
from specgen.ui import output

if TYPE_CHECKING:
    from specgen.sampling import SamplingParams
    from specgen.session import Session


def open_session(
    model: ModelFlags,
    out: OutputFlags,
    params: SamplingParams | None = None,
    *,
    live: bool = False,
) -> Session:
    """Load the pair `model` names, with a spinner on stderr (the live view's, with the time
    it took, when `live`). The caller shows its messages (`show_messages`).

    Raises:
        as `specgen.session.open`.
    """
    # start-up time: session loads numpy and llama.cpp, which `specgen --help` must not
    from specgen import session
    from specgen.llamacpp import set_verbose

    set_verbose(out.verbose, output.log)
    if live:
        from specgen.ui import live as view  # start-up time: the live view loads rich.live

        with view.loading_status(output.err_console(), "preparing models", "models ready") as s:
            return session.open(model, params, s.update)
    with output.spinner("preparing models") as s:
        return session.open(model, params, s.update)


# why a seeded `auto` run is not reproducible (issue 15): K follows measured timings, and
# each block size draws a different number of random numbers
SEED_NOTE = (
    "with --draft-max auto the block sizes follow measured timings, so at --temp > 0 the"
    " text can differ between runs with the same --seed; a fixed --draft-max reproduces it"
)


def show_messages(opened: Session, sampling: SamplingFlags | None = None) -> None:
    """The session's warnings ("specgen: warning: ...") then its notes ("specgen: note:
    ..."), one line each on stderr; with the command's `sampling` (run and chat), then
    `SEED_NOTE` where a seed is given that cannot reproduce the text: sampled, drafted,
    under --draft-max auto."""
    for w in opened.warnings:
        output.warning(w)
    for n in opened.notes:
        output.notice(n)
    s = sampling
    if s is not None and s.seed_given and s.k is None and s.temp > 0 and opened.drafter:
        output.notice(SEED_NOTE)


def say_cut_constraint(done: Done, sampling: SamplingFlags) -> None:
    """After a constrained output that -n or the context ended: a warning where the text is
    not complete under the grammar (a sampled number or string can run on until the limit,
    and plain output says no finish reason), with a schema's advice where a JSON schema
    gave it; a note where it is complete but was cut where it could go on; nothing for an
    output that ended by itself or without a grammar (`Done.grammar_complete` None)."""
    if done.grammar_complete is None or done.finish_reason not in ("length", "context"):
        return
    limit = f"-n {sampling.max_tokens}" if done.finish_reason == "length" else "the context (-c)"
    if done.grammar_complete:
        output.notice(
            f"{limit} ended the output where the grammar allows an end: the text is complete"
            " under it, though the model had not ended it"
        )
        return
    schema = sampling.json_schema is not None or sampling.json_schema_file is not None
    bound = ", or bound the schema's strings and numbers: maxLength, maximum" if schema else ""
    output.warning(
        f"{limit} ended the output before the grammar's end: the text does not complete it"
        f" (raise the limit{bound})"
    )


def wants_live(out: OutputFlags) -> bool:
    """Whether to show the live view: stdout is a terminal that redraws (not TERM=dumb),
    and neither --no-live nor --json."""
    return not (out.no_live or out.json_out) and output.stdout_redraws()
