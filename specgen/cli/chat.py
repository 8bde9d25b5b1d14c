"""`specgen chat`: an interactive multi-turn conversation with an instruct model, the live
view for every reply, and both KV caches kept across turns: a thin loop over the public API's
`specgen.Pair.chat_session`.

When stdin is not a terminal, each input line is one user turn and each reply is printed as
plain text followed by a blank line (scripts and tests drive it through a pipe).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Callable, Generator, Iterator
from typing import IO, TYPE_CHECKING, Annotated

import typer

from specgen.cli.loading import open_session, say_cut_constraint, show_messages, wants_live
from specgen.cli.options import (
    GRAMMAR,
    MODEL,
    OUTPUT,
    PROMPT,
    SAMPLING,
    ModelFlags,
    OutputFlags,
    PromptFlags,
    SamplingFlags,
    as_text,
    grouped,
    opt,
)
from specgen.errors import ChatTemplateError, ConfigError
from specgen.events import Done, Prefilled, Step
from specgen.flags import DRAFT_NONE
from specgen.generation import consume
from specgen.ui import output

if TYPE_CHECKING:
    from specgen.chat import ChatSession
    from specgen.session import Session

EXIT = ("/exit", "/quit")
_COMMAND = re.compile(r"/[a-z]+")
"""A line that is one word after a slash, lowercased: a command (a path has a second
slash)."""
RESET_DONE = "new conversation: history and session totals cleared"
HELP = (
    "commands: /exit or /quit (or Ctrl-D) leaves, /reset starts over, /help lists these,"
    " /stats shows the session totals"
)

EPILOG = (
    "Examples:\n\n"
    "  specgen chat -m instruct-f32.gguf -md instruct-q4.gguf\n\n"
    "  specgen chat --pair qwen2.5-7b-instruct --system 'Answer briefly.'\n\n"
    "  printf 'Hi\\nWhat is 2+2?\\n/stats\\n' | specgen chat -m t.gguf -md d.gguf --temp 0"
)


#: -n in chat: per reply
REPLY_TOKENS = opt("--max-tokens", "-n", default=1024, help="Tokens per reply at most.")


@grouped
def chat(
    *,
    model: Annotated[ModelFlags, MODEL],
    sampling: Annotated[SamplingFlags, SAMPLING.but(max_tokens=REPLY_TOKENS) + GRAMMAR],
    out: Annotated[OutputFlags, OUTPUT.only("no_live", "show_rejected", "verbose")],
    how: Annotated[PromptFlags, PROMPT.without("raw")],
) -> None:
    """Chat with an instruct model (its chat template applied), replies drafted and verified.

    /exit or Ctrl-D leaves, /reset starts over, /stats shows the totals; Ctrl-C stops a reply.
    """
    raise typer.Exit(chat_command(model, sampling, out, how))


def chat_command(
    model: ModelFlags, sampling: SamplingFlags, out: OutputFlags, how: PromptFlags
) -> int:
    """Load the pair, then one reply per user line until /exit or end of input, each
    through the public API (`specgen.Pair.chat_session`).

    Returns:
        The exit status: 1 when input from a pipe held a message that was not sent (too
        long for the context, refused by the template; each said in a note), else 0.
    """
    sampling.check_drafter(model.draft != DRAFT_NONE)  # before the models load
    live = wants_live(out)
    with open_session(model, out, sampling.params(), live=live) as opened:
        session = _chat_session(opened, sampling, how)
        show_messages(opened, sampling)
        tty_in = sys.stdin.isatty()
        show = (
            _live_reply(opened.target.name, opened.draft_name, out.show_rejected, echo=not tty_in)
            if live
            else None
        )
        # a constrained reply -n cut is said as run says it
        unsent = _loop(
            session, _lines(tty_in), show, lambda done: say_cut_constraint(done, sampling)
        )
    # a script reading the replies learns from the status that one is missing; at a
    # terminal the note was read and the session went on
    return 1 if unsent and not tty_in else 0


def _chat_session(opened: Session, sampling: SamplingFlags, how: PromptFlags) -> ChatSession:
    from specgen import Pair  # start-up time: the API loads numpy and llama.cpp

    if how.chat_template is None and not opened.target.chat_template():
        # the API's message names its own calls: the command's names the commands
        raise ConfigError(
            f"{opened.target.name} has no chat template (a base model): pass"
            " --chat-template FILE, or use `specgen run`, which continues a base model's"
            " text as it is"
        )
    return Pair(opened).chat_session(sampling, system=how.system, chat_template=how.chat_template)


def _lines(tty: bool) -> Iterator[str]:
    """User lines: prompted with readline editing on a terminal, else one per input line
    (UTF-8, the newline removed). Ends at EOF (Ctrl-D); Ctrl-C at the prompt leaves as
    Ctrl-C ends any command (exit 130)."""
    if tty:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401 - line editing and history for input()
        # bytes typed that are not UTF-8 (a Latin-1 terminal) become U+FFFD, as in a pipe
        if isinstance(sys.stdin, io.TextIOWrapper):
            sys.stdin.reconfigure(errors="surrogateescape")
        output.status_line(HELP)
        while True:
            try:
                yield as_text(input("> "))
            except EOFError:
                output.status_line("")
                return
            except KeyboardInterrupt:  # no reply to stop: it ends the command (exit 130)
                output.status_line("")
                raise
    for raw in sys.stdin.buffer:
        yield raw.decode("utf-8", "replace").rstrip("\r\n")


# a reply's events (`ChatSession.reply`): a generator, so that Ctrl-C can be thrown into it
Event = Prefilled | Step | Done
Events = Generator[Event, None, None]
ShowReply = Callable[["ChatSession", str, Events], "Done | None"]


def _loop(
    session: ChatSession,
    lines: Iterator[str],
    show: ShowReply | None,
    after: Callable[[Done], None] | None = None,
) -> int:
    """`_turns` (how many messages were not sent); a reader gone away ends it quietly."""
    try:
        return _turns(session, lines, show, after)
    except BrokenPipeError:  # the reader went away (`| head`): leave quietly
        output.discard_stdout()
        return 0


def _turns(
    session: ChatSession,
    lines: Iterator[str],
    show: ShowReply | None,
    after: Callable[[Done], None] | None = None,
) -> int:
    """One reply per line (`show`: the live view, or plain text when None), then `after`
    with its Done; the commands, and the turns that cannot be sent, said in a note.
    Returns how many messages were not sent."""
    unsent = 0
    for line in lines:
        command = line.strip().lower()
        if not command:
            continue
        if command in EXIT:
            return unsent
        if command == "/reset":
            session.reset()
            output.status_line(RESET_DONE)
            continue
        if command in ("/stats", "/help"):
            # stderr: through a pipe, stdout holds the replies alone
            output.status_line(session.totals.describe() if command == "/stats" else HELP)
            continue
        if _COMMAND.fullmatch(command):  # a typo of one (/stat), not a message to send
            _note(f"unknown command {line.strip()}; {HELP}")
            continue
        events = _sent(session, line)
        if events is None:
            unsent += 1
            continue
        done = show(session, line, events) if show is not None else _plain_reply(events)
        if done is not None and after is not None:
            after(done)
        if done is not None and session.context_full(done):
            _note("the context is full: type /reset to start over (or restart with a larger -c)")
    return unsent


def _sent(session: ChatSession, line: str) -> Events | None:
    """The reply's events, or None where the message cannot be sent (said in a note)."""
    from specgen.chat import ContextFullError  # start-up time: specgen.chat loads numpy

    try:
        return session.reply(line)
    except ContextFullError as e:
        # /reset cannot help a message that does not fit alone
        then = "type /reset to start over" if session.conversation.turns else "send less"
        _note(f"{e.how}: {then} (or restart with a larger -c)")
    except ChatTemplateError as e:  # on this turn only (a template may refuse a turn)
        _note(f"{e}: the message was not sent; type /reset to start over")
    return None


def _note(message: str) -> None:
    output.notice(message)


def _plain_reply(events: Events) -> Done | None:
    """Stream the reply's text to stdout, then a blank line; Ctrl-C ends the reply only."""
    written = 0

    def fold(ev: Event) -> None:
        nonlocal written
        text = ev.text if isinstance(ev, Step) else ""
        if isinstance(ev, Done):
            text = ev.text[written:]  # text released only at the end (held bytes)
        if text:
            output.write_text(text)
            written += len(text)

    try:
        done = consume(events, fold)
    except BrokenPipeError:
        events.close()
        raise
    output.write_text("\n\n")
    return done


def _live_reply(target_name: str, draft_name: str, show_rejected: bool, echo: bool) -> ShowReply:
    """The live view for each reply (the user's message echoed dimmed when it was not typed
    on this terminal), then one dim line with the reply's figures."""
    # start-up time: the live view loads rich.live
    from specgen.ui.live import LiveView
    from specgen.ui.state import ViewState
    from specgen.ui.text import turn_text

    console = output.console()

    def show(session: ChatSession, line: str, events: Events) -> Done | None:
        state = ViewState(
            target_name,
            None if draft_name == DRAFT_NONE else draft_name,
            show_rejected=show_rejected,
            prompt=line + "\n" if echo else "",
        )
        with (
            typing_hidden(None if echo else sys.stdin),
            LiveView(console, state, summary=False) as lv,
        ):
            done = consume(events, lv.update)
        output.show(turn_text(state), "", highlight=False)
        return done

    return show


@contextlib.contextmanager
def typing_hidden(stdin: IO[str] | None) -> Iterator[None]:
    """Keys typed on the terminal `stdin` while a reply is drawn are not echoed: echoed,
    they were drawn into the live view, which then miscounted its lines and left part of a
    line on the final screen. They still wait for the next prompt, where readline shows
    them, taken as they come (not in the terminal's line mode, where a Ctrl-D was an
    end-of-file that readline's own mode dropped: now it ends the session after the
    reply). Nothing is done where `stdin` is None or not a terminal."""
    fd, before = None, None
    with contextlib.suppress(ImportError, OSError, ValueError):
        import termios  # POSIX only: elsewhere typing stays echoed

        if stdin is not None and stdin.isatty():
            fd = stdin.fileno()
            before = termios.tcgetattr(fd)
    if fd is None or before is None:
        yield
        return
    quiet = list(before)
    quiet[3] &= ~(termios.ECHO | termios.ICANON)  # lflags
    termios.tcsetattr(fd, termios.TCSANOW, quiet)  # not TCSAFLUSH: what is typed is kept
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, before)
