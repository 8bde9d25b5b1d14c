"""The pure statistics of `specgen bench --url` (the load client): per-request latencies
from recorded timestamps, per-level figures, SLO goodput, the arrival schedule and the
side-by-side ratios. No I/O, no clock: `specgen.bench.load` records the timestamps.

Definitions (vLLM's `vllm bench serve`, whose names these are):

- TTFT: first streamed chunk with text − request sent.
- E2EL: end of the stream (`data: [DONE]`) − request sent.
- TPOT = (E2EL − TTFT) / (output tokens − 1): the mean time per token after the first.
  GuideLLM's "time per output token" divides E2EL (TTFT included) by all output tokens, so
  its figures are not comparable with these.
- ITL: the gap between consecutive streamed chunks with text. A speculative server streams
  a round's tokens in one chunk, so ITLs are per chunk, not per token; tokens per chunk
  (output tokens / chunks) says how many tokens each gap carried.
- SLO goodput: completed requests per second that meet every given `--slo` bound (vLLM's
  `--goodput`); not the tokens-per-second goodput that specgen's controller maximizes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specgen.acceptance_stats import acceptance_rate
from specgen.bench.stats import bootstrap_median_ci, percentiles
from specgen.errors import ConfigError

QUANTILES = (50, 90, 95, 99)

# -- one request --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecStats:
    """A server's own speculative counts for one request: specgen's `speculative` object
    (`num_draft_tokens`, `num_accepted_draft_tokens`) or llama-server's `timings`
    (`draft_n`, `draft_n_accepted`); `source` names which."""

    num_draft_tokens: int
    num_accepted_draft_tokens: int
    source: str


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it. Times are seconds on the client's clock.

    `index` is the request's place in the level's schedule: the same index carries the same
    prompt and seed on every server, which pairs requests across servers. `failure` is None
    for a completed request, else its kind: `http NNN`, `timeout`, `disconnect` (the stream
    or connection ended early), `connect`, `stream error` (an error event in the stream).
    `retried`: the first send found its kept-alive connection closed by the server, before
    any byte of a response, and the request went again on a fresh connection (times start at
    the first send). `text`: the output as streamed (None when not kept); `speculative`:
    specgen's per-request `speculative` object verbatim, when the server sent one.
    """

    index: int
    prompt_id: str
    kind: str
    start_s: float
    chunk_s: tuple[float, ...]
    end_s: float
    output_tokens: int
    tokens_from_usage: bool
    spec: SpecStats | None = None
    failure: str | None = None
    finish_reason: str | None = None
    retried: bool = False
    text: str | None = None
    speculative: Mapping[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def ttft_s(r: RequestRecord) -> float | None:
    """First chunk with text − sent; None without one."""
    return r.chunk_s[0] - r.start_s if r.chunk_s else None


def e2el_s(r: RequestRecord) -> float:
    return r.end_s - r.start_s


def tpot_s(r: RequestRecord) -> float | None:
    """(E2EL − TTFT) / (output tokens − 1), vLLM's TPOT; None for fewer than 2 tokens."""
    first = ttft_s(r)
    if first is None or r.output_tokens < 2:
        return None
    return (e2el_s(r) - first) / (r.output_tokens - 1)


def itls_s(r: RequestRecord) -> list[float]:
    """Gaps between consecutive chunks with text (len = chunks − 1)."""
    c = r.chunk_s
    return [b - a for a, b in zip(c, c[1:], strict=False)]


# -- one level ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    """Mean and p50/p90/p95/p99 in milliseconds (numpy's linear interpolation); None when
    there were no values."""

    n: int
    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None


def dist_ms(values_s: Sequence[float]) -> Dist:
    if not values_s:
        return Dist(0, None, None, None, None, None)
    ms = [v * 1000 for v in values_s]
    p = percentiles(ms, QUANTILES)
    return Dist(len(ms), float(np.mean(ms)), p[0], p[1], p[2], p[3])


@dataclass(frozen=True)
class Slo:
    """`--slo ttft=MS,tpot=MS,e2el=MS`: a request meets it when every given bound holds
    (a request with one output token has no TPOT and meets a TPOT bound, as in vLLM)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        if not r.ok:
            return False
        t, p = ttft_s(r), tpot_s(r)
        return (
            (self.ttft_ms is None or (t is not None and t * 1000 <= self.ttft_ms))
            and (self.tpot_ms is None or p is None or p * 1000 <= self.tpot_ms)
            and (self.e2el_ms is None or e2el_s(r) * 1000 <= self.e2el_ms)
        )

    def text(self) -> str:
        parts = [
            f"{name}≤{v:g} ms"
            for name, v in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("E2EL", self.e2el_ms))
            if v is not None
        ]
        return ", ".join(parts)


def parse_slo(value: str) -> Slo:
    """`ttft=500,tpot=50` -> Slo(500, 50, None).

    Raises:
        ConfigError: an unknown metric, a repeated one, or a bound that is not a positive
            number of milliseconds.
    """
    found: dict[str, float] = {}
    for item in value.split(","):
        name, eq, num = item.strip().partition("=")
        name = name.strip().lower()
        if not eq or name not in ("ttft", "tpot", "e2el"):
            raise ConfigError(
                f"--slo needs items like ttft=500,tpot=50 (milliseconds), got {value!r}"
            )
        if name in found:
            raise ConfigError(f"--slo gives {name} twice: {value!r}")
        try:
            ms = float(num)
        except ValueError:
            raise ConfigError(f"--slo: {num.strip()!r} is not a number of milliseconds") from None
        if not (ms > 0 and math.isfinite(ms)):
            raise ConfigError(f"--slo: {name} must be a positive number of milliseconds")
        found[name] = ms
    return Slo(found.get("ttft"), found.get("tpot"), found.get("e2el"))


@dataclass(frozen=True)
class LoadLevel:
    """One load level: a fixed number of requests in flight (`concurrency`), or open-loop
    arrivals at `request_rate` per second (inf: all at once), optionally capped at
    `max_concurrency` in flight; at sampling temperature `temp`."""

    temp: float
    concurrency: int | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None

    @property
    def name(self) -> str:
        if self.concurrency is not None:
            return f"{self.concurrency} stream{'s' if self.concurrency != 1 else ''}"
        rate = "inf" if self.request_rate == math.inf else f"{self.request_rate:g}"
        cap = f", ≤{self.max_concurrency} streams" if self.max_concurrency else ""
        return f"{rate} req/s{cap}"


@dataclass(frozen=True)
class LevelSummary:
    """The figures of one server at one level. Throughputs divide by `duration_s`, from the
    first request sent to the last stream ended."""

    n_requests: int
    n_completed: int
    failures: tuple[tuple[str, int], ...]  # (kind, count), most frequent first
    duration_s: float
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens of completed requests / s
    total_output_tokens: int
    tokens_per_chunk: float | None
    tokens_from_usage: bool  # every completed request's count came from the usage chunk
    max_in_flight: int
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2el: Dist
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    acceptance_rate: float | None  # accepted / drafted, where the server reported them
    slo_met: int | None
    slo_goodput: float | None  # requests / s meeting the SLO
    n_retried: int = 0  # requests resent once on a fresh connection (`RequestRecord.retried`)

    @property
    def n_failed(self) -> int:
        return self.n_requests - self.n_completed


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    """The most requests open at once (a start at the instant of an end counts after it)."""
    events = sorted([(r.start_s, 1) for r in records] + [(r.end_s, -1) for r in records])
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def summarize_level(
    records: Sequence[RequestRecord], duration_s: float, slo: Slo | None = None
) -> LevelSummary:
    """Per-level figures from the requests of one server at one level."""
    ok = [r for r in records if r.ok]
    fails = Counter(r.failure for r in records if r.failure is not None)
    tokens = sum(r.output_tokens for r in ok)
    chunks = sum(len(r.chunk_s) for r in ok)
    spec = [r.spec for r in ok if r.spec is not None]
    drafted = sum(s.num_draft_tokens for s in spec)
    accepted = sum(s.num_accepted_draft_tokens for s in spec)
    met = None if slo is None else sum(slo.met_by(r) for r in ok)
    per_s = 1 / duration_s if duration_s > 0 else 0.0
    return LevelSummary(
        n_requests=len(records),
        n_completed=len(ok),
        failures=tuple(sorted(fails.items(), key=lambda kv: (-kv[1], kv[0]))),
        duration_s=duration_s,
        request_throughput=len(ok) * per_s,
        output_throughput=tokens * per_s,
        total_output_tokens=tokens,
        tokens_per_chunk=tokens / chunks if chunks else None,
        tokens_from_usage=all(r.tokens_from_usage for r in ok),
        max_in_flight=max_in_flight(records),
        ttft=dist_ms([t for r in ok if (t := ttft_s(r)) is not None]),
        tpot=dist_ms([t for r in ok if (t := tpot_s(r)) is not None]),
        itl=dist_ms([g for r in ok for g in itls_s(r)]),
        e2el=dist_ms([e2el_s(r) for r in ok]),
        num_draft_tokens=drafted,
        num_accepted_draft_tokens=accepted,
        acceptance_rate=acceptance_rate(accepted, drafted) if drafted else None,
        slo_met=met,
        slo_goodput=None if met is None else met * per_s,
        n_retried=sum(r.retried for r in records),
    )


# -- the schedule -------------------------------------------------------------------------------


def arrival_offsets(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (s from the level's start) of `n` open-loop requests, shape (n,), float64.

    Gaps are Gamma(shape=burstiness, scale=1/(rate * burstiness)) (vLLM's `--burstiness`):
    mean 1/rate for every burstiness, coefficient of variation 1/sqrt(burstiness); 1 is a
    Poisson process, below 1 burstier, above 1 more regular. The first request goes at 0.
    rate = inf sends all at 0.
    """
    if rate == math.inf:
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(n - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])[:n]


def prompt_order(n_available: int, n: int, rng: np.random.Generator) -> list[int]:
    """`n` prompt indices: shuffled passes over all `n_available` prompts, so every prompt
    is used as evenly as `n` allows."""
    out: list[int] = []
    while len(out) < n:
        out += [int(i) for i in rng.permutation(n_available)]
    return out[:n]


def parse_int_list(flag: str, value: str) -> tuple[int, ...]:
    """`--concurrency 1,2,4,8` -> (1, 2, 4, 8).

    Raises:
        ConfigError: empty, repeated, or not a positive integer.
    """
    items = [s.strip() for s in value.split(",")]
    try:
        out = tuple(int(s) for s in items)
    except ValueError:
        raise ConfigError(
            f"{flag} needs a comma-separated list like 1,2,4,8, got {value!r}"
        ) from None
    if any(x < 1 for x in out):
        raise ConfigError(f"{flag} values must be at least 1, got {value!r}")
    if len(set(out)) != len(out):
        raise ConfigError(f"{flag} lists a value twice: {value!r}")
    return out


def parse_rate_list(value: str) -> tuple[float, ...]:
    """`--request-rate 0.5,1,inf` -> (0.5, 1.0, inf) requests per second.

    Raises:
        ConfigError: empty, repeated, or not a positive number (or inf).
    """
    out = []
    for s in (s.strip() for s in value.split(",")):
        try:
            r = float(s)
        except ValueError:
            raise ConfigError(f"--request-rate: {s!r} is not a number (or inf)") from None
        if not r > 0:
            raise ConfigError(f"--request-rate must be positive, got {s!r}")
        out.append(r)
    if len(set(out)) != len(out):
        raise ConfigError(f"--request-rate lists a value twice: {value!r}")
    return tuple(out)


# -- side by side -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    """One server against the first at one level. `throughput` is the ratio of output
    tokens/s; `speed` the median over paired requests (same schedule index, both completed)
    of the ratio of per-request output tokens / E2EL, with its 95% percentile-bootstrap
    interval (as `specgen bench` reports speedups); `ttft_p50` and `tpot_p99` are ratios of
    those percentiles (below 1: this server is faster)."""

    n_pairs: int
    throughput: float | None
    speed: float | None
    speed_ci95: tuple[float | None, float | None]
    ttft_p50: float | None
    tpot_p99: float | None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def paired_ratio(
    base: Sequence[RequestRecord],
    base_sum: LevelSummary,
    other: Sequence[RequestRecord],
    other_sum: LevelSummary,
    seed: int = 0,
) -> Ratio:
    """`other` against `base` at one level (see `Ratio`)."""
    by_index = {r.index: r for r in base if r.ok and e2el_s(r) > 0}
    ratios = []
    for r in other:
        b = by_index.get(r.index)
        if b is not None and r.ok and e2el_s(r) > 0 and b.output_tokens > 0:
            ratios.append((r.output_tokens / e2el_s(r)) / (b.output_tokens / e2el_s(b)))
    speed = float(np.median(ratios)) if ratios else None
    ci: tuple[float | None, float | None] = (
        bootstrap_median_ci(ratios, seed=seed) if ratios else (None, None)
    )
    return Ratio(
        n_pairs=len(ratios),
        throughput=_div(other_sum.output_throughput, base_sum.output_throughput),
        speed=speed,
        speed_ci95=ci,
        ttft_p50=_div(other_sum.ttft.p50, base_sum.ttft.p50),
        tpot_p99=_div(other_sum.tpot.p99, base_sum.tpot.p99),
    )
