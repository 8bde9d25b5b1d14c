"""The sweep of `specgen bench --url`: read each server's description, warm it up, then run
every level against every server in turn with the same schedule (`run_load`)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpcore
import numpy as np

from specgen import eventloop
from specgen.bench.load.client import CHAT, COMPLETIONS, ROUTES, request_body, send_one
from specgen.bench.load.prompts import LoadPrompt
from specgen.bench.load.results import (
    LevelRun,
    LoadInterrupted,
    LoadProgress,
    LoadResult,
    LoadSettings,
    Server,
    ServerInfo,
)
from specgen.bench.load.transport import connection_pool
from specgen.bench.loadstats import (
    LoadLevel,
    RequestRecord,
    arrival_offsets,
    prompt_order,
    summarize_level,
)
from specgen.errors import ConfigError

#: the most of a server's self-description kept in the record (a /props can be large)
_INFO_LIMIT = 64 * 1024


def _headers(s: LoadSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}


async def fetch_info(
    pool: httpcore.AsyncConnectionPool, server: Server, auth: dict[str, str] | None = None
) -> ServerInfo:
    """`GET /v1/models` (and `/props`, which llama-server has).

    Raises:
        ConfigError: the server cannot be reached or refuses the key.
    """
    limit = {"timeout": {"connect": 10.0, "read": 60.0, "write": 60.0, "pool": 60.0}}
    headers = list((auth or {}).items())
    try:
        r = await pool.request("GET", server.url + "/v1/models", headers=headers, extensions=limit)
    except httpcore.TimeoutException as e:
        raise ConfigError(f"--url {server.url}: the server did not answer ({e})") from None
    except (httpcore.NetworkError, httpcore.ProtocolError) as e:
        raise ConfigError(
            f"--url {server.url}: cannot reach the server ({type(e).__name__}: {e})"
        ) from None
    if r.status in (401, 403):
        raise ConfigError(
            f"--url {server.url}: the server refused the API key (HTTP {r.status}); give --api-key"
        )
    models = _json_or_none(r)
    model_id = None
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        first = models["data"][0]
        model_id = first.get("id") if isinstance(first, dict) else None
    props = None
    with contextlib.suppress(httpcore.TimeoutException, httpcore.NetworkError,
                             httpcore.ProtocolError):  # fmt: skip
        p = await pool.request("GET", server.url + "/props", headers=headers, extensions=limit)
        props = _json_or_none(p)
    return ServerInfo(server, model_id if isinstance(model_id, str) else None, models, props)


def _json_or_none(r: httpcore.Response) -> Any:
    if r.status != 200 or len(r.content) > _INFO_LIMIT:
        return None
    try:
        return json.loads(r.content)
    except ValueError:
        return None


def endpoint_of(settings: LoadSettings, prompts: Sequence[LoadPrompt]) -> str:
    """The route used: `--endpoint`, else chat when any prompt has messages.

    Raises:
        ConfigError: completions asked for prompts that are messages.
    """
    has_messages = any(p.messages is not None for p in prompts)
    if settings.endpoint is None:
        return CHAT if has_messages else COMPLETIONS
    if settings.endpoint == COMPLETIONS and has_messages:
        raise ConfigError(
            "--endpoint completions needs raw prompts; these prompts are chat messages"
        )
    if settings.endpoint not in ROUTES:
        raise ConfigError(f"--endpoint must be chat or completions, got {settings.endpoint!r}")
    return settings.endpoint


class _Counter:
    """Progress state shared by the requests of the sweep (one event loop: no lock)."""

    def __init__(self, total: int, hook: Callable[[LoadProgress], None] | None) -> None:
        self.total, self.hook = total, hook
        self.done = self.in_flight = self.failed = 0
        self.description = ""

    def tell(self) -> None:
        if self.hook is not None:
            self.hook(
                LoadProgress(self.description, self.done, self.total, self.in_flight, self.failed)
            )


async def _run_level(
    pool: httpcore.AsyncConnectionPool,
    info: ServerInfo,
    level: LoadLevel,
    order: Sequence[int],
    offsets: np.ndarray | None,
    prompts: Sequence[LoadPrompt],
    settings: LoadSettings,
    endpoint: str,
    clock: Callable[[], float],
    count: _Counter | None,
) -> tuple[list[RequestRecord], float, float]:
    """Every request of one level against one server: (records in index order, first sent,
    last ended)."""
    url = info.server.url + ROUTES[endpoint]
    model = settings.model or info.model_id or "default"
    records: list[RequestRecord | None] = [None] * len(order)

    async def one(i: int) -> None:
        p = prompts[order[i]]
        body = request_body(p, endpoint, model, settings, level.temp, settings.seed + i)
        if count is not None:
            count.in_flight += 1
            count.tell()
        rec = await send_one(
            pool, url, body, endpoint, i, p, clock, settings.timeout_s, _headers(settings)
        )
        records[i] = rec
        if count is not None:
            count.in_flight -= 1
            count.done += 1
            count.failed += not rec.ok
            count.tell()

    start = clock()
    if offsets is None:  # closed loop: `concurrency` workers, each sends its next as one ends
        n = len(order)
        it = iter(range(n))

        async def worker() -> None:
            for i in it:
                await one(i)

        await asyncio.gather(*(worker() for _ in range(min(level.concurrency or 1, n))))
    else:  # open loop: send at the scheduled times, whatever is in flight (up to a cap)
        cap = asyncio.Semaphore(level.max_concurrency) if level.max_concurrency else None
        t0 = time.perf_counter()  # the schedule runs on the loop's real time

        async def capped(i: int) -> None:
            if cap is None:
                await one(i)
                return
            async with cap:
                await one(i)

        tasks = []
        for i, off in enumerate(offsets):
            wait = t0 + float(off) - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.ensure_future(capped(i)))
        await asyncio.gather(*tasks)
    done = [r for r in records if r is not None]
    end = max((r.end_s for r in done), default=start)
    return done, start, end


def level_schedule(
    settings: LoadSettings, level_no: int, level: LoadLevel, n_prompts: int
) -> tuple[list[int], np.ndarray | None]:
    """The prompt order and (open loop) send times of one level, the same for every server:
    seeded by (`seed`, level number)."""
    rng = np.random.default_rng([settings.seed, level_no])
    order = prompt_order(n_prompts, settings.num_prompts, rng)
    if level.request_rate is None:
        return order, None
    return order, arrival_offsets(
        settings.num_prompts, level.request_rate, settings.burstiness, rng
    )


def run_load(
    servers: Sequence[Server],
    prompts: Sequence[LoadPrompt],
    settings: LoadSettings,
    progress: Callable[[LoadProgress], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    cpu_clock: Callable[[], float] = time.process_time,
) -> LoadResult:
    """Measure every server at every level (see the package docstring). `clock` stamps the
    requests (seconds); `cpu_clock` is this process's CPU seconds, for each level's
    `LevelRun.client_cpu`.

    Raises:
        ConfigError: a server cannot be reached; prompts that the endpoint cannot take.
        LoadInterrupted: Ctrl-C; holds the (level, server) runs finished.
    """
    endpoint = endpoint_of(settings, prompts)
    runs: list[LevelRun] = []
    infos: list[ServerInfo] = []
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

    def result() -> LoadResult:
        ids = tuple(p.id for p in prompts)
        return LoadResult(settings, tuple(infos), tuple(runs), ids, date, endpoint)

    try:
        eventloop.run(
            _sweep(servers, prompts, settings, endpoint, progress, clock, cpu_clock, runs, infos)
        )
    except KeyboardInterrupt:
        raise LoadInterrupted(result()) from None
    return result()


async def _sweep(
    servers: Sequence[Server],
    prompts: Sequence[LoadPrompt],
    settings: LoadSettings,
    endpoint: str,
    progress: Callable[[LoadProgress], None] | None,
    clock: Callable[[], float],
    cpu_clock: Callable[[], float],
    runs: list[LevelRun],
    infos: list[ServerInfo],
) -> None:
    most = max(
        lv.concurrency or lv.max_concurrency or settings.num_prompts for lv in settings.levels
    )
    async with contextlib.AsyncExitStack() as stack:
        pools = [
            await stack.enter_async_context(connection_pool(server.url, most + 4))
            for server in servers
        ]
        for pool, server in zip(pools, servers, strict=True):
            infos.append(await fetch_info(pool, server, _headers(settings)))
        count = _Counter(len(settings.levels) * len(servers) * settings.num_prompts, progress)
        for pool, info in zip(pools, infos, strict=True):  # warm-up: not counted, not recorded
            count.description = f"{info.server.label} · warm-up"
            count.tell()
            warm = [i % len(prompts) for i in range(settings.warmup)]
            level = LoadLevel(temp=settings.levels[0].temp, concurrency=1)
            await _run_level(
                pool, info, level, warm, None, prompts, settings, endpoint, clock, None
            )
        for n, level in enumerate(settings.levels):
            order, offsets = level_schedule(settings, n, level, len(prompts))
            for pool, info in zip(pools, infos, strict=True):
                count.description = f"{info.server.label} · temp {level.temp:g} · {level.name}"
                count.tell()
                cpu0, wall0 = cpu_clock(), clock()
                records, start, end = await _run_level(
                    pool, info, level, order, offsets, prompts, settings, endpoint, clock, count
                )
                wall = clock() - wall0
                cpu = (cpu_clock() - cpu0) / wall if wall > 0 else None
                summary = summarize_level(records, end - start, settings.slo)
                runs.append(LevelRun(info.server.label, level, tuple(records), summary, cpu))
