"""`specgen run`: the Typer command, and below it what the command does: resolve the models,
load them, drive the loop, and write plain text, JSON or the live view.

The model-side modules (numpy, llama.cpp) and the live view are imported inside the functions
so that `specgen --help` and the other commands start without loading them.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from specgen.cli.loading import open_session, say_cut_constraint, show_messages, wants_live
from specgen.cli.options import (
    GRAMMAR,
    LOGPROBS,
    MODEL,
    OUTPUT,
    PROMPT,
    SAMPLING,
    ModelFlags,
    OutputFlags,
    PromptFlags,
    SamplingFlags,
    check_not_overwriting,
    grouped,
)
from specgen.errors import ConfigError, PromptError
from specgen.events import Done, Prefilled, Step
from specgen.flags import DRAFT_NONE
from specgen.generation import consume, relay
from specgen.ui import output

if TYPE_CHECKING:
    from specgen.session import Session

EXIT_INTERRUPTED = 130


EPILOG = (
    "Examples:\n\n"
    "  specgen run 'Once upon a time'                 # embedded demo pair\n\n"
    "  specgen run -m big.gguf -md small.gguf -n 128 --temp 0 'def fib(n):'\n\n"
    "  echo 'Summarize: ...' | specgen run --pair qwen2.5-coder-7b --json\n\n"
    "  specgen run -m big.gguf --draft none 'Hello'    # ordinary decoding (baseline)\n\n"
    "  specgen run -m instruct.gguf -md small.gguf --system 'Be brief.' 'Write a haiku.'\n\n"
    "  specgen run -m instruct.gguf -md small.gguf --raw 'Once upon a time'  # no template"
)


def _read_prompt(prompt: str | None) -> bytes:
    if prompt is None or prompt == "-":
        if sys.stdin.isatty():  # otherwise the command seems to hang
            output.notice(
                "reading the prompt from stdin: type it, then Ctrl-D on a new line to end"
            )
        # byte for byte: a trailing newline is part of the prompt
        return sys.stdin.buffer.read()
    if "\n" not in prompt and len(prompt) < 4096 and _is_file(prompt):
        output.notice(
            f"the prompt is the text {prompt!r}, not the file's contents:"
            f" to generate from the file, run `specgen run ... < {prompt}`"
        )
    return prompt.encode("utf-8", "surrogateescape")


def _is_file(name: str) -> bool:
    try:
        return Path(name).expanduser().is_file()
    except (OSError, ValueError):  # a name too long or with a NUL is not a file
        return False


@grouped
def run(
    prompt: Annotated[
        str | None, typer.Argument(help="Prompt text; omit or '-' to read stdin.")
    ] = None,
    *,
    model: Annotated[ModelFlags, MODEL],
    sampling: Annotated[SamplingFlags, SAMPLING + GRAMMAR + LOGPROBS],
    out: Annotated[OutputFlags, OUTPUT],
    how: Annotated[PromptFlags, PROMPT],
) -> None:
    """Generate text with a draft and a target model (or the target alone).

    When the target carries a chat template (instruct models), the prompt is sent as one
    user message in it, as llama-cli and Ollama do; --raw sends the text as it is.
    """
    # every flag is checked (when its shape is built) before the prompt is read: stdin may
    # wait for the user
    sampling.params()  # checks --top-p and --min-p
    sampling.check_drafter(model.draft != DRAFT_NONE)
    check_not_overwriting("--trace", out.trace, ("-m", model.target), ("-md", model.draft))
    if sampling.logprobs is not None and not out.json_out:
        raise ConfigError("--logprobs is shown in --json's output only: add --json")
    raise typer.Exit(run_command(_read_prompt(prompt), model, sampling, out, how))


def run_command(
    prompt: bytes, model: ModelFlags, sampling: SamplingFlags, out: OutputFlags, how: PromptFlags
) -> int:
    """Run one generation through the public API (`specgen.Pair.stream`); returns the exit
    code (0, or 130 after Ctrl-C)."""
    if not prompt:
        raise PromptError("the prompt is empty")
    live = wants_live(out)
    stack = contextlib.ExitStack()
    try:
        # closed in reverse: the events first (the loop restores the caches while the
        # engines exist; a pipe closed by the reader leaves the generator suspended), then
        # the trace, then the models
        opened = stack.enter_context(open_session(model, out, sampling.params(), live=live))
        ids, template = _prompt_ids(opened, prompt, sampling, how)
        events, gen = _events(opened, ids, sampling, out, stack)
        if out.json_out:
            info = template.to_dict() if template is not None else None
            return _run_json(
                events, opened.target.name, opened.draft_name, gen, info,
            )  # fmt: skip
        if live:
            # echoed dimmed above the reply: the raw text it continues, or the user's message
            shown = prompt.decode("utf-8", "replace")
            if template is not None:
                shown = shown.rstrip("\n") + "\n"
            return _run_live(
                events, opened.target.name, opened.draft_name, out.show_rejected, shown
            )
        return _run_plain(events)
    finally:
        stack.close()


def _prompt_ids(opened: Session, prompt: bytes, sampling: SamplingFlags, how: PromptFlags):
    """The prompt's token ids (through the chat template unless --raw) and the template,
    checked against the context; then the notes about the seed and the fit."""
    # start-up time: the chat and loop modules load numpy, which `specgen --help` must not load
    from specgen.apiengine import fit_note
    from specgen.chat import build_prompt
    from specgen.generate import check_prompt

    ids, template = build_prompt(
        opened.target, prompt, raw=how.raw, system=how.system, template_file=how.chat_template
    )
    check_prompt(ids, opened.target.n_ctx)  # an error is said alone, before the messages
    show_messages(opened, sampling)
    if (note := fit_note(len(ids), sampling.max_tokens, opened.target.n_ctx)) is not None:
        output.notice(note)
    return ids, template


def _events(
    opened: Session,
    ids: list[int],
    sampling: SamplingFlags,
    out: OutputFlags,
    stack: contextlib.ExitStack,
):
    """The generation (`specgen.Pair.stream`), its events passed through the slow-draft
    check and the --trace writer (each closed by `stack`)."""
    from specgen import Pair  # start-up time: the API loads numpy and llama.cpp

    gen = Pair(opened).stream(ids, sampling, trace=out.trace is not None)
    events: Any = gen
    # each wrapper closes the one inside it, and one never started holds nothing: so
    # closing the outermost restores the caches
    if not opened.warnings:  # one warning about the pair at most
        events = _warn_slow_draft(events)
    if _constrained(sampling):
        events = _warn_cut_constraint(events, sampling)
    if out.trace is not None:  # --trace: one JSON line per round, written as it goes
        from specgen.trace import TraceWriter, tee, token_text_of  # start-up time: numpy

        writer = TraceWriter(
            out.trace,
            target=opened.target.name,
            draft=opened.draft_name,
            params=sampling.params(),
            seed=gen.seed,
            max_tokens=sampling.max_tokens,
            token_text=token_text_of(opened.target),
        )
        stack.callback(writer.close)
        events = tee(events, writer)
    stack.callback(events.close)
    return events, gen


def _warn_slow_draft(events):
    """Pass the events through; warn when the draft's pass, timed at the start (after the
    prompt, or after the first token: `Step.timed_draft_s`), is slower than the target's.
    Closing this generator closes `events`."""
    from specgen.session import slow_draft_warning  # start-up time: session loads llama.cpp

    def warn(ev) -> None:
        w = None
        if isinstance(ev, Prefilled):
            w = slow_draft_warning(ev.ordinary_token_s, ev.draft_token_s)
        elif isinstance(ev, Step) and ev.timed_draft_s is not None:
            w = slow_draft_warning(ev.timed_ordinary_s, ev.timed_draft_s)
        if w is not None:
            output.warning(w)

    return relay(events, warn)


def _constrained(sampling: SamplingFlags) -> bool:
    return any(
        v is not None
        for v in (sampling.grammar, sampling.grammar_file, sampling.json_schema,
                  sampling.json_schema_file)
    )  # fmt: skip


def _warn_cut_constraint(events, sampling: SamplingFlags):
    """Pass the events through; once they end, say so where -n or the context cut a
    constrained output (`say_cut_constraint`). After the last event, so the warning follows
    the text. Closing this generator closes `events`."""
    done: list[Done] = []

    def warn() -> None:
        if done:
            say_cut_constraint(done[0], sampling)

    # relay's own generator, not one of this function: a Ctrl-C in such a frame had ended
    # the generation without its Done
    return relay(events, lambda ev: done.append(ev) if isinstance(ev, Done) else None, warn)


def _run_live(
    events, target_name: str, draft_name: str, show_rejected: bool, prompt: str = ""
) -> int:
    # start-up time: llama.cpp and the live view (rich.live), which `specgen --help` must not load
    from specgen.llamacpp import backend
    from specgen.ui.live import LiveView
    from specgen.ui.state import ViewState

    state = ViewState(
        target_name,
        None if draft_name == DRAFT_NONE else draft_name,
        show_rejected=show_rejected,
        backend=backend(),
        prompt=prompt,
    )
    try:
        with LiveView(output.console(), state) as live:
            for ev in events:
                live.update(ev)
    except KeyboardInterrupt:
        events.close()
        return EXIT_INTERRUPTED  # the view has kept the text and printed the summary
    return EXIT_INTERRUPTED if state.finish_reason == "interrupted" else 0


def _run_plain(events) -> int:
    # UTF-8 bytes whatever the console encoding; flushed per round so pipes stream.
    done: Done | None = None
    written = 0
    last = ""
    # a terminal gets a final newline so the prompt after it starts on its own line;
    # a pipe or file gets the text byte for byte
    end_line = output.stdout_is_terminal()
    try:
        for ev in events:
            text = ev.text if isinstance(ev, Step) else ""
            if isinstance(ev, Done):
                done = ev
                text = ev.text[written:]  # text released only at the end (held bytes)
            if text:
                output.write_text(text)
                written += len(text)
                last = text[-1]
    except KeyboardInterrupt:
        events.close()
        if end_line and last != "\n":
            output.write_text("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`| head`): stop generating and exit quietly
        events.close()
        output.discard_stdout()
        return 0
    if end_line and written and last != "\n":
        output.write_text("\n")
    return EXIT_INTERRUPTED if done and done.finish_reason == "interrupted" else 0


def _run_json(
    events, target_name: str, draft_name: str, gen, chat_template: dict[str, str] | None = None
) -> int:
    from specgen.llamacpp import backend  # start-up time: llama.cpp

    logprobs: list[dict[str, Any]] = []

    def fold(ev) -> None:
        if isinstance(ev, Step):
            logprobs.extend(s.logprob.to_dict() for s in ev.spans if s.logprob is not None)

    # Ctrl-C anywhere in the chain (the trace writer, this loop) is handed to the loop,
    # whose Done (finish reason "interrupted") is then reported
    done = consume(events, fold)
    if done is None:  # Ctrl-C before the generation began: nothing to report
        raise KeyboardInterrupt
    obj: dict[str, Any] = {
        "text": done.text,
        "tokens": list(done.tokens),
        "finish_reason": done.finish_reason,
        "target": target_name,
        "draft": draft_name,
        "seed": gen.seed,
        "backend": backend(),
        "chat_template": chat_template,
        "stats": done.stats.to_dict(),
    }
    if gen.settings.logprobs is not None:
        obj["logprobs"] = logprobs
    summary = gen.controller  # the adaptive controller: its decisions, visible
    if summary is not None:
        obj["controller"] = summary
    output.write_json(obj)
    return EXIT_INTERRUPTED if done.finish_reason == "interrupted" else 0
