"""`specgen serve`: the Typer command. It builds `run`'s two flag shapes (`ModelFlags`,
`SamplingFlags`: the models, and the server's sampling defaults) and its own (`ServerFlags`),
each checked when built; everything else lives in `specgen.server` (imported only when the
command runs, so a missing ``serve`` extra is one line and the other commands never load
the HTTP libraries)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specgen.cli.loading import show_messages
from specgen.cli.options import (
    MODEL,
    OUTPUT,
    PROMPT,
    SAMPLING,
    Group,
    ModelFlags,
    SamplingFlags,
    grouped,
    opt,
)
from specgen.errors import ConfigError
from specgen.fileio import read_chat_template
from specgen.flags import DRAFT_NONE, at_least
from specgen.ui import output

if TYPE_CHECKING:
    from specgen.server.app import Backend, State
    from specgen.server.backend import ServeArgs

EXTRA = (
    "specgen serve needs the HTTP libraries: pip install -e '.[serve]' in a clone (or make dev),"
    " pip install 'specgen[serve]' from a package index"
)
_EXTRA_MODULES = {
    "fastapi",
    "starlette",
    "uvicorn",
    "sse_starlette",
    "pydantic",
    "prometheus_client",
}

EPILOG = (
    "Examples:\n\n"
    "  specgen serve                                   # demo pair on http://127.0.0.1:8080\n\n"
    "  specgen serve -m instruct.gguf -md small.gguf -np 8 --alias local\n\n"
    "  SPECGEN_API_KEY=secret specgen serve --host 0.0.0.0 --cors https://app.example\n\n"
    "  curl http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json'"
    ' -d \'{"prompt": "Once upon a time", "max_tokens": 32}\'   # raw text: any model\n\n'
    "  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json'"
    ' -d \'{"messages": [{"role": "user", "content": "Hi"}]}\'   # a model with a chat template'
)


@dataclass(frozen=True)
class ServerFlags:
    """What only `serve` has: where it listens, its slots and queue, who may use it, its
    -n default and chat template, its latency targets (--host, --port, -np, --queue,
    --alias, --api-key, --cors, -n, --chat-template, --verbose, --slo-ttft, --slo-tpot:
    milliseconds, None = no target), its prompt cache (--cache-ram MiB: -1 = no limit,
    0 = none).

    Raises:
        ConfigError: naming the flag: --port outside 0-65535, -np below 1, --queue below 0,
            -n 0 or below -1, an empty --api-key, a latency target of 0 or less,
            --cache-ram below -1, a --chat-template file that cannot be read.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int = 4
    queue: int = 64
    alias: str | None = None
    api_key: str | None = None
    cors: tuple[str, ...] = ()
    max_tokens: int = -1
    chat_template: Path | None = None
    verbose: bool = False
    slo_ttft: float | None = None
    slo_tpot: float | None = None
    cache_ram: int = 8192

    def __post_init__(self) -> None:
        # Typer: a list or None; browsers send the scheme and host in lower case
        object.__setattr__(self, "cors", tuple(_origin(o) for o in self.cors or ()))
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be between 0 and 65535, got {self.port}")
        at_least("-np/--parallel", self.parallel, 1)
        at_least("--queue", self.queue, 0)
        if self.max_tokens == 0 or self.max_tokens < -1:
            raise ConfigError(
                f"-n must be -1 (until the context) or at least 1, got {self.max_tokens}"
            )
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key (or SPECGEN_API_KEY) is empty")
        if self.slo_ttft is not None and not self.slo_ttft > 0:
            raise ConfigError(f"--slo-ttft must be more than 0 milliseconds, got {self.slo_ttft:g}")
        if self.slo_tpot is not None and not self.slo_tpot >= 0:
            raise ConfigError(
                f"--slo-tpot must be 0 (ordinary decoding's) or more milliseconds,"
                f" got {self.slo_tpot:g}"
            )
        at_least("--cache-ram", self.cache_ram, -1)
        if self.chat_template is not None:  # before the port is bound and the models load
            read_chat_template(self.chat_template)


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s]+")


def _origin(value: str) -> str:
    """A --cors value as browsers send it in Origin (``*``: every origin)."""
    origin = value.strip().lower()
    if origin != "*" and not _ORIGIN.fullmatch(origin):
        raise ConfigError(
            f"--cors {value!r} is not an origin: give scheme://host[:port] with no path"
            " (as https://app.example), or * for every origin"
        )
    return origin


SERVER = Group(
    ServerFlags,
    host=opt("--host", help="Address to listen on."),
    port=opt("--port", help="Port (0 = any free port)."),
    parallel=opt("--parallel", "-np", help="Requests served at once (slots of -c each)."),
    queue=opt("--queue", help="Requests that may wait for a slot (then 503)."),
    alias=opt(
        "--alias",
        help="Model id in /v1/models (default: the target's file name).",
    ),
    api_key=opt(
        "--api-key",
        envvar="SPECGEN_API_KEY",
        show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on every route but /health.",
    ),
    cors=opt(
        "--cors",
        kind=list[str] | None,
        default=None,
        help="Allow browser requests from ORIGIN, as https://app.example (repeatable; * any).",
    ),
    max_tokens=opt(
        "--max-tokens", "-n", help="Default max_tokens (-1 = until the slot's context)."
    ),
    chat_template=PROMPT.options["chat_template"],
    verbose=OUTPUT.options["verbose"],
    slo_ttft=opt(
        "--slo-ttft",
        metavar="MS",
        help="Time-to-first-token target: while requests wait for their first token,"
        " steps are shortened (fewer draft depths) to end within it. Needs --draft-max"
        " auto. Default: none.",
    ),
    slo_tpot=opt(
        "--slo-tpot",
        metavar="MS",
        help="Time-per-output-token target: no request's TPOT (its mean per token since"
        " its first) goes over this because others speculate (fewer draft depths)."
        " 0: ordinary decoding's own at the current load (no request streams slower than"
        " without speculation). Needs --draft-max auto. Default: none.",
    ),
    cache_ram=opt(
        "--cache-ram",
        "-cram",
        metavar="MIB",
        help="Host memory for the prompt cache: the cells of prompts that left their slot,"
        " restored for a later request sharing their prefix instead of evaluated again"
        " (as llama-server's; -1 = no limit, 0 = off).",
    ),
)


@grouped
def serve(
    *,
    model: Annotated[ModelFlags, MODEL],
    server: Annotated[ServerFlags, SERVER],
    # -n is serve's own (-1: until the slot's context, in `server`), which run's shape refuses
    sampling: Annotated[SamplingFlags, SAMPLING.without("max_tokens", "stop", "ignore_eos")],
) -> None:
    """Serve the models over an OpenAI-compatible HTTP API (chat, completions, streaming).

    Concurrent requests share one target decode per step; omitted request fields take
    these flags' values. Prints the URL once the models are ready; one line per request
    on stderr. Ctrl-C (or SIGTERM) ends the requests in flight and exits.
    """
    sampling.params()  # checks --top-p and --min-p
    raise typer.Exit(serve_command(model, sampling, server))


def _check_drafting(model: ModelFlags, sampling: SamplingFlags, server: ServerFlags) -> None:
    """Refuse what the drafting would ignore: a fixed --draft-max with --draft none, and
    the latency targets without the controller that keeps them.

    Raises:
        ConfigError: naming the flags.
    """
    sampling.check_drafter(model.draft != DRAFT_NONE)
    slo = server.slo_ttft is not None or server.slo_tpot is not None
    if slo and (sampling.k is not None or model.draft == DRAFT_NONE):
        raise ConfigError(
            "--slo-ttft and --slo-tpot shorten the steps the batch controller chooses:"
            " they need a draft and --draft-max auto"
            + (", not a fixed K" if sampling.k is not None else ", not --draft none")
        )


def serve_command(model: ModelFlags, sampling: SamplingFlags, server: ServerFlags) -> int:
    """Bind, load in the background while /health answers 503, serve until a signal;
    returns the exit code (0, or 130 after a second Ctrl-C)."""
    try:
        # start-up time, and the optional extra: the HTTP libraries load only here
        from specgen.server import backend, requestconfig, runner
        from specgen.server.app import Settings
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in _EXTRA_MODULES:
            raise ConfigError(EXTRA) from None
        raise
    # start-up time: llama.cpp, after every flag is checked
    from specgen.llamacpp import set_verbose

    set_verbose(server.verbose, output.log)
    defaults = requestconfig.Defaults.of(sampling, server.max_tokens)
    settings = Settings(
        defaults=defaults,
        api_key=server.api_key,
        cors=server.cors,
        loopback_only=runner.is_loopback(server.host),
    )
    _check_drafting(model, sampling, server)
    args = backend.ServeArgs(
        model,
        sampling,
        server.parallel,
        server.queue,
        server.alias,
        server.chat_template,
        slo_ttft_s=None if server.slo_ttft is None else server.slo_ttft / 1e3,
        slo_tpot_s=None if server.slo_tpot is None else server.slo_tpot / 1e3,
        cache_ram_mib=server.cache_ram,
    )
    warning = runner.open_warning(server.host, server.api_key)
    if warning is not None:
        output.warning(warning)
    sock = runner.bind(server.host, server.port)
    output.notice(f"loading the models; {runner.url_of(sock)}/health answers 503 until ready")
    return runner.serve(sock, settings, _opener(args), _ready(server.parallel), _log)


def _opener(args: ServeArgs) -> Callable[[State], Backend]:
    """The backend's loader, run in a thread by the server: the session's warnings and
    notes are shown as `run` shows them."""
    # start-up time: the backend loads the scheduler (numpy)
    from specgen.server.backend import open_backend

    return lambda state: open_backend(args, state.metrics, show_messages, output.notice)


def _ready(parallel: int) -> Callable[[str, Backend], None]:
    """The ready line (stdout), once the backend serves."""
    return lambda url, b: output.write_line(
        f"specgen: serving {b.model_id} at {url}/v1 ({parallel}"
        f" slot{'s' if parallel != 1 else ''} of {b.scheduler.n_ctx_slot} tokens)"
    )


def _log(line: str) -> None:
    output.log(f"specgen: {line}\n")
