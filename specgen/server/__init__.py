"""`specgen serve`: an OpenAI-compatible HTTP server over the speculative loop.

The HTTP side (`schemas`, `app`, `guard`, `metrics`, `stats`, `runner`, `backend`) is the
only place FastAPI/Starlette, uvicorn, sse-starlette, pydantic and prometheus-client enter;
the scheduler (the `sched` package) knows nothing of HTTP. Nothing here is imported by the other
commands: `specgen.cli.serve` imports it lazily, so a missing ``serve`` extra is one line.
"""
