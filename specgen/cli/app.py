"""The `specgen` command line: composes the commands; errors become one line here."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from specgen import __version__
from specgen.cli import bench, chat, help, models, run, serve, verify
from specgen.errors import SpecgenError
from specgen.ui import output

# Usage errors (bad flag, missing value): Typer vendors Click since 0.2x and its usage errors
# derive from the public `typer.TyperException`; older Typer raises the click package's own.
if hasattr(typer, "TyperException"):
    _USAGE_ERRORS: tuple[type[Exception], ...] = (typer.TyperException,)
else:  # pragma: no cover - older Typer
    import click

    _USAGE_ERRORS = (click.ClickException,)


class _Commands(help.Group):
    """The app's group. A reader of stdout that went away (EPIPE: `| head`) ends a command
    with status 0 and nothing on stderr: what the reader read was what it wanted (`run`,
    which stops generating, handles the pipe itself). Click would exit 1, silently."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            output.discard_stdout()  # the interpreter's last flush has nowhere to complain
            raise typer.Exit(0) from None


app = typer.Typer(
    name="specgen",
    cls=_Commands,
    help="Fast local text generation with exact speculative decoding on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if not value:
        return
    # start-up time: importlib.metadata costs ~15 ms, for --version only
    from importlib.metadata import PackageNotFoundError, version

    try:  # the bindings' version without loading llama.cpp
        bindings = f" (llama-cpp-python {version('llama_cpp_python')})"
    except PackageNotFoundError:
        bindings = ""
    # where it was imported from, as pip says: two checkouts side by side (an A/B run)
    # can then tell which one a command runs
    here = Path(__file__).resolve().parent.parent
    output.write_line(f"specgen {__version__} from {here}{bindings}")
    raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Show the version and exit.",
            is_eager=True,
            callback=_version,
        ),
    ] = False,
) -> None:
    """Fast local text generation with exact speculative decoding on llama.cpp."""


# Each command lives in its own module (each imports its heavy parts lazily), with its
# examples (the epilog under its --help); the order here is the order of `specgen --help`.
for _name, _command, _examples in (
    ("run", run.run, run.EPILOG),
    ("chat", chat.chat, chat.EPILOG),
    ("serve", serve.serve, serve.EPILOG),
    ("download", models.download, models.DOWNLOAD_EPILOG),
    ("models", models.models, models.MODELS_EPILOG),
    ("bench", bench.bench, bench.EPILOG),
    ("verify", verify.verify, verify.VERIFY_EPILOG),
):
    app.command(_name, epilog=_examples)(_command)
_trace = typer.Typer(
    cls=help.Group, help="Read --trace files.", no_args_is_help=True, rich_markup_mode="rich"
)
_trace.command("summarize", epilog=verify.SUMMARIZE_EPILOG)(verify.summarize)
app.add_typer(_trace, name="trace")
help.name_values(app)  # `-m GGUF|NAME`, `--temp T` in --help, not Python types


def _run_app(argv: list[str] | None, debug: bool) -> Any:
    try:
        return app(args=argv, standalone_mode=False)
    except SpecgenError as e:
        return _fail(str(e), e.exit_code, debug)
    except (KeyboardInterrupt, typer.Abort):
        # Ctrl-C anywhere (Click turns KeyboardInterrupt into Abort): 128 + SIGINT, as a
        # shell reports it, and no message; the command has shown what it finished.
        if debug:
            output.debug_traceback()
        return run.EXIT_INTERRUPTED
    except _USAGE_ERRORS as e:
        return _show_usage_error(e)
    except OSError as e:
        return _fail(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), 1, debug)
    except Exception as e:  # noqa: BLE001 - the one place that turns bugs into a line
        return _fail(
            f"unexpected {type(e).__name__}: {e} (set SPECGEN_DEBUG=1 for the traceback)",
            1,
            debug,
        )


@contextlib.contextmanager
def _terminating() -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`) unwinds the command as an exit (128 + 15), where it had
    killed it: the live view shows the cursor it hid (the shell's prompt had stayed
    without one), files are closed (a file written whole at the end is not left half
    written), the models close. Only where nothing else handles it (`serve` installs its
    own, a drain) and on the main thread (signals are delivered there)."""
    mine = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    if mine:
        signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        if mine:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _fail(message: str, code: int, debug: bool = False) -> int:
    if debug:
        output.debug_traceback()
    output.error(message)
    return code


def _show_usage_error(e: Exception) -> int:
    show = getattr(e, "show", None)
    if callable(show):
        show()  # Click's exceptions print the usage line, then the message
    else:  # pragma: no cover - a Typer error that is not Click's
        _fail(str(e), 2)
    return int(getattr(e, "exit_code", 2))


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, map known errors to one stderr line.

    Exit codes: 0 ok, 1 error, 2 usage, 130 interrupted, 143 terminated (SIGTERM).
    SPECGEN_DEBUG=1 shows tracebacks.
    """
    debug = os.environ.get("SPECGEN_DEBUG", "") not in ("", "0")
    with _terminating():
        code = _run_app(argv, debug)
    sys.exit(code if isinstance(code, int) else 0)
