"""The data of `specgen bench --url`: the servers, the settings, progress, and the result
(each level run by each server, with every request)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from specgen.bench.loadstats import LevelSummary, LoadLevel, RequestRecord, Slo
from specgen.errors import ConfigError


@dataclass(frozen=True)
class Server:
    """A server to measure: its base URL (without /v1) and the label of its column."""

    url: str
    label: str


def parse_servers(urls: Sequence[str], labels: Sequence[str]) -> tuple[Server, ...]:
    """`--url` (repeatable) and `--label` (as many, or none: the host:port).

    Raises:
        ConfigError: not http(s), a label count that differs, a repeated label.
    """
    if labels and len(labels) != len(urls):
        raise ConfigError(
            f"--label given {len(labels)} times for {len(urls)} --url: give one per --url"
        )
    out = []
    for i, u in enumerate(urls):
        url = u.strip().rstrip("/")
        url = url.removesuffix("/v1")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--url needs http://HOST:PORT (the server's base URL), got {u!r}")
        out.append(Server(url, labels[i] if labels else parts.netloc))
    if len({s.label for s in out}) != len(out):
        raise ConfigError("--label: each server needs its own label")
    return tuple(out)


@dataclass(frozen=True)
class LoadSettings:
    """What is measured. `endpoint` None: chat for prompts with messages, completions for
    raw prompts. Sampling fields None are left to the server's defaults. `api_key` is sent
    as a bearer token and never written to a result."""

    levels: tuple[LoadLevel, ...]
    num_prompts: int
    max_tokens: int
    seed: int
    burstiness: float = 1.0
    warmup: int = 1
    endpoint: str | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    ignore_eos: bool = True
    timeout_s: float = 600.0
    slo: Slo | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "levels": [asdict(lv) | {"name": lv.name} for lv in self.levels],
            "num_prompts": self.num_prompts, "max_tokens": self.max_tokens, "seed": self.seed,
            "burstiness": self.burstiness, "warmup": self.warmup, "endpoint": self.endpoint,
            "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
            "ignore_eos": self.ignore_eos, "timeout_s": self.timeout_s,
            "slo": None if self.slo is None else asdict(self.slo), "model": self.model,
        }  # fmt: skip


@dataclass(frozen=True)
class ServerInfo:
    """What a server says about itself: `/v1/models` (verbatim JSON; for specgen serve it
    holds the models' SHA-256 and the build) and llama-server's `/props` when it has one."""

    server: Server
    model_id: str | None
    models: Any
    props: Any


@dataclass(frozen=True)
class LevelRun:
    """One server at one level: every request and the figures.

    `client_cpu` is the load client's own CPU over the level, as a fraction of one core:
    this process's CPU seconds (`time.process_time`: every thread, the progress display
    included) over the level's wall seconds; None when not measured. On a machine the
    server shares, it is what the measurement took from the server measured."""

    label: str
    level: LoadLevel
    records: tuple[RequestRecord, ...]
    summary: LevelSummary
    client_cpu: float | None = None


@dataclass(frozen=True)
class LoadProgress:
    """Progress over the whole sweep: requests `done` of `total` (warm-up excluded),
    `in_flight` now, `failed` so far; `description` names the server and level."""

    description: str
    done: int
    total: int
    in_flight: int
    failed: int


@dataclass(frozen=True)
class LoadResult:
    """Everything measured: settings, servers, and each (level, server) run in the order
    run (levels outer, servers inner). `prompt_ids` lists the prompt set in order."""

    settings: LoadSettings
    servers: tuple[ServerInfo, ...]
    runs: tuple[LevelRun, ...]
    prompt_ids: tuple[str, ...]
    date: str = ""
    endpoint: str = ""  # the route used: chat or completions


class LoadInterrupted(Exception):
    """Ctrl-C during `run_load`: `result` holds the (level, server) runs finished."""

    def __init__(self, result: LoadResult) -> None:
        super().__init__("interrupted")
        self.result = result
