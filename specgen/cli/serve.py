"""`specgen serve`: the Typer command. The flags are checked here; everything else lives
in `specgen.server` (imported only when the command runs, so a missing ``serve`` extra is
one line and the other commands never load the HTTP libraries)."""

from __future__ import annotations

from typing import Annotated

import typer

from specgen.cli.options import (
    ChatTemplateOpt,
    CtxOpt,
    DraftMaxOpt,
    DraftOpt,
    DraftPMinOpt,
    MinPOpt,
    ModelsOpt,
    NgldOpt,
    NglOpt,
    PairOpt,
    RpcOpt,
    SeedOpt,
    SwaFullOpt,
    TargetOpt,
    TempOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    VerboseOpt,
)
from specgen.errors import ConfigError
from specgen.flags import check_model_flags, check_sampling_flags, parse_draft_max
from specgen.ui import output

EXTRA = "specgen serve needs the HTTP libraries: pip install 'specgen[serve]'"
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
    "  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json'"
    ' -d \'{"messages": [{"role": "user", "content": "Hi"}]}\''
)


def register(app: typer.Typer) -> None:
    """Add the `serve` command to `app`."""
    app.command("serve", epilog=EPILOG)(serve)


def serve(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    models: ModelsOpt = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port (0 = any free port).")] = 8080,
    parallel: Annotated[
        int,
        typer.Option("--parallel", "-np", help="Requests served at once (slots of -c each)."),
    ] = 4,
    queue: Annotated[
        int, typer.Option("--queue", help="Requests that may wait for a slot (then 503).")
    ] = 64,
    alias: Annotated[
        str | None,
        typer.Option("--alias", help="Model id in /v1/models (default: the target's file name)."),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="SPECGEN_API_KEY",
            show_envvar=True,
            help="Require 'Authorization: Bearer KEY' on every route but /health.",
        ),
    ] = None,
    cors: Annotated[
        list[str] | None,
        typer.Option("--cors", help="Allow browser requests from ORIGIN (repeatable)."),
    ] = None,
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens", "-n", help="Default max_tokens (-1 = until the slot's context)."
        ),
    ] = -1,
    temp: TempOpt = 0.8,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    draft_max: DraftMaxOpt = "auto",
    draft_p_min: DraftPMinOpt = 0.0,
    n_gpu_layers: NglOpt = 0,
    n_gpu_layers_draft: NgldOpt = 0,
    rpc: RpcOpt = None,
    threads: ThreadsOpt = 0,
    ctx_size: CtxOpt = 4096,
    swa_full: SwaFullOpt = False,
    chat_template: ChatTemplateOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Serve the models over an OpenAI-compatible HTTP API (chat, completions, streaming).

    Concurrent requests share one target decode per step; omitted request fields take
    these flags' values. Prints the URL once the models are ready; one line per request
    on stderr. Ctrl-C (or SIGTERM) ends the requests in flight and exits.
    """
    check_model_flags(
        target=target,
        draft=draft,
        ctx_size=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
    )
    check_sampling_flags(temp=temp)
    if not 0.0 <= draft_p_min <= 1.0:
        raise ConfigError(f"--draft-p-min must be in [0, 1] (a probability), got {draft_p_min}")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    if parallel < 1:
        raise ConfigError(f"-np/--parallel must be at least 1, got {parallel}")
    if queue < 0:
        raise ConfigError(f"--queue must be 0 or more, got {queue}")
    if max_tokens == 0 or max_tokens < -1:
        raise ConfigError(f"-n must be -1 (until the context) or at least 1, got {max_tokens}")
    if seed is not None and seed < -1:
        raise ConfigError(f"--seed must be -1 (random) or 0 or more, got {seed}")
    if api_key is not None and not api_key.strip():
        raise ConfigError("--api-key (or SPECGEN_API_KEY) is empty")
    from specgen.sampling import SamplingParams

    params = SamplingParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p)
    parse_draft_max(draft_max)
    try:
        from specgen.server import runner
        from specgen.server.app import Settings
        from specgen.server.backend import ServeArgs, open_backend
        from specgen.server.shapes import Defaults
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in _EXTRA_MODULES:
            raise ConfigError(EXTRA) from None
        raise
    from specgen.llamacpp import set_verbose

    set_verbose(verbose, output.log)
    defaults = Defaults(
        params=params, seed=None if seed in (None, -1) else seed, max_tokens=max_tokens
    )
    args = ServeArgs(
        target=target,
        draft=draft,
        pair=pair,
        models=models,
        ctx_size=ctx_size,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        threads=threads,
        rpc=rpc,
        swa_full=swa_full,
        draft_max=draft_max,
        draft_p_min=draft_p_min,
        chat_template=chat_template,
        parallel=parallel,
        queue=queue,
        alias=alias,
        defaults=defaults,
    )
    settings = Settings(defaults=defaults, api_key=api_key, cors=tuple(cors or ()))
    warning = runner.open_warning(host, api_key)
    if warning is not None:
        output.warning(warning)
    sock = runner.bind(host, port)
    output.notice(f"loading the models; {runner.url_of(sock)}/health answers 503 until ready")
    code = runner.serve(
        sock,
        settings,
        lambda state: open_backend(args, state.metrics, output.notice),
        lambda url, b: output.write_line(
            f"specgen: serving {b.model_id} at {url}/v1 ({parallel} slots of"
            f" {b.scheduler.n_ctx_slot} tokens)"
        ),
        _log,
    )
    raise typer.Exit(code)


def _log(line: str) -> None:
    output.log(f"specgen: {line}\n")
