"""`specgen bench --url`: the load client for OpenAI-compatible servers (`specgen serve`,
llama-server, vLLM, ...). The one place besides `specgen.server` where an HTTP library
(httpcore, the core of httpx, on asyncio streams: `transport`) enters. Returns data, never
prints (`specgen.cli.bench` renders it).

Method (`run_load`): each server's `/v1/models` (and llama-server's `/props`) is read first,
for the reproducibility record; a server that cannot be reached fails there, in a second.
Then `warmup` requests per server, one at a time, not counted. Then for each level
(temperature x concurrency, or x request rate), each server in turn gets the same
`num_prompts` requests: the same prompts in the same order, the same per-request seeds
(`seed` + index), the same send times; servers alternate level by level, so a drifting
machine affects them alike. Every request streams (`stream_options.include_usage`), its
output length fixed by `max_tokens` and `ignore_eos`; each chunk with text is stamped on
the client's clock (injectable) when it is parsed. A failed request (HTTP status, timeout,
disconnect, an error event) is recorded by kind and never stops the run. Connections are
kept alive; a request the server refused by closing its idle connection, before any byte
of a response, is resent once on a fresh connection and counted (`retried`, `n_retried`).
The figures and their definitions (TTFT, TPOT, ITL, E2EL, SLO goodput):
`specgen.bench.loadstats`.

Modules: `prompts` (the inputs), `results` (the data), `transport` (the connection pool),
`client` (one request and its stream), `sweep` (the schedule and the levels), `report`
(JSON, Markdown, plot, --compare).
"""

from __future__ import annotations

# what the CLI, the scripts and the tests use; the rest from the modules themselves
from specgen.bench.load.client import CHAT, COMPLETIONS, StreamState, send_one
from specgen.bench.load.prompts import LoadPrompt, load_prompts
from specgen.bench.load.results import (
    LoadInterrupted,
    LoadProgress,
    LoadResult,
    LoadSettings,
    parse_servers,
)
from specgen.bench.load.sweep import endpoint_of, level_schedule, run_load

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "LoadInterrupted",
    "LoadProgress",
    "LoadPrompt",
    "LoadResult",
    "LoadSettings",
    "StreamState",
    "endpoint_of",
    "level_schedule",
    "load_prompts",
    "parse_servers",
    "run_load",
    "send_one",
]
