"""The data of `specgen bench`: the format and mode names, one round (`Round`), one measured
generation (`RunResult`), what is measured (`BenchSettings`), progress reports (`Progress`)
and everything measured (`BenchResult`), with their JSON forms."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specgen.bench.prompts import BenchPrompt, k_label
from specgen.bench.stats import percentiles, position_counts
from specgen.events import ACCEPTANCE_HOW, Step
from specgen.sampling import SamplingParams

FORMAT = "specgen-bench/1"
ORDINARY = "ordinary"
SPECULATIVE = "speculative"
ALL_KINDS = "all"


# -- one generation -----------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One Step, reduced: chosen k, proposed m, accepted n, emitted tokens, seconds, and
    the tested proposals (`Step.n_drafted`, the acceptance rate's denominator)."""

    k: int
    m: int
    n: int
    tokens: int
    draft_s: float
    round_s: float
    n_drafted: int

    @classmethod
    def of(cls, step: Step) -> Round:
        return cls(
            step.k, step.n_proposed, step.n_accepted, len(step.spans), step.draft_s,
            step.round_s, step.n_drafted,
        )  # fmt: skip


@dataclass
class RunResult:
    """One measured generation."""

    mode: str
    temp: float
    draft_max: int | None
    prompt_id: str
    kind: str
    run: int
    seed: int
    stats: dict[str, Any]
    rounds: list[Round]
    n_generated: int
    prefill_s: float
    decode_s: float
    ttft_s: float
    peak_rss_bytes: int

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def e2e_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def steady_tokens_per_s(self) -> float:
        """Tokens/s after the first round (no prefill, no time to first token)."""
        if len(self.rounds) < 2:
            return self.tokens_per_s
        first = self.rounds[0]
        s = self.decode_s - first.round_s
        return (self.n_generated - first.tokens) / s if s > 0 else 0.0

    def token_latencies_s(self) -> list[float]:
        """Per token: its round's wall time / the tokens the round emitted."""
        out: list[float] = []
        for r in self.rounds:
            if r.tokens:
                out += [r.round_s / r.tokens] * r.tokens
        return out

    def to_dict(self) -> dict[str, Any]:
        lat = percentiles(self.token_latencies_s())
        tested, accepted = position_counts(((r.m, r.n) for r in self.rounds), _k_span(self.rounds))
        return {
            "mode": self.mode,
            "temp": self.temp,
            "draft_max": k_label(self.draft_max),
            "prompt_id": self.prompt_id,
            "kind": self.kind,
            "run": self.run,
            "seed": self.seed,
            "stats": self.stats,
            "ttft_s": round(self.ttft_s, 6),
            "tokens_per_s": round(self.tokens_per_s, 4),
            "steady_tokens_per_s": round(self.steady_tokens_per_s, 4),
            "latency_ms": {f"p{q}": _ms(v) for q, v in zip((50, 95, 99), lat, strict=True)},
            "block_sizes": [r.m for r in self.rounds],
            "accepted": [r.n for r in self.rounds],
            "position_tested": tested,
            "position_accepted": accepted,
            "peak_rss_bytes": self.peak_rss_bytes,
        }


def _k_span(rounds: Sequence[Round]) -> int:
    return max((r.m for r in rounds), default=0)


def _ms(s: float) -> float | None:
    return None if s != s else round(s * 1000, 4)


# -- the benchmark --------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchSettings:
    """What `run_bench` measures.

    Attributes:
        draft_max: block sizes; None = the adaptive controller (`auto`).
        temps: sampling temperatures (0 = greedy).
        runs: repetitions of every (configuration, prompt) pair.
        n_tokens: tokens generated per generation (`-n`), end-of-generation ignored.
        seed: base seed; prompt i of run r uses seed + 1000 * r + i in both modes.
        top_k, top_p, min_p: the other sampling settings (shared by both modes).
        warmup: one discarded generation of each mode first.
        trace: Steps carry a RoundTrace (for `on_event`; costs time).
        n_boot: bootstrap resamples for the speedup interval.
        k_init: first block size of `auto` (a registry pair's recommended K, as `run`
            uses); None = the controller's default.
    """

    draft_max: tuple[int | None, ...] = (4, 8, None)
    temps: tuple[float, ...] = (0.0,)
    runs: int = 3
    n_tokens: int = 128
    seed: int = 1234
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    warmup: bool = True
    trace: bool = False
    n_boot: int = 4000
    k_init: int | None = None

    def params(self, temp: float) -> SamplingParams:
        return SamplingParams(temp=temp, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    def total_generations(self, n_prompts: int) -> int:
        main = len(self.temps) * len(self.draft_max) * self.runs * n_prompts * 2
        return main + (2 if self.warmup else 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "draft_max": [k_label(k) for k in self.draft_max],
            "temps": list(self.temps),
            "runs": self.runs,
            "n_tokens": self.n_tokens,
            "seed": self.seed,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "ignore_eos": True,
            "warmup": self.warmup,
            "k_init": self.k_init,
        }


@dataclass(frozen=True)
class Progress:
    """Reported before each generation: `done` of `total` finished so far."""

    done: int
    total: int
    description: str


@dataclass
class BenchResult:
    """Everything measured: raw runs, per-configuration summaries, the record."""

    settings: BenchSettings
    prompts: list[BenchPrompt]
    runs: list[RunResult]
    record: dict[str, Any] = field(default_factory=dict)
    configs: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    auto_vs_best: list[dict[str, Any]] = field(default_factory=list)
    compared: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        # imported here: `specgen.bench.record` imports this module (FORMAT, BenchSettings)
        from specgen.bench.record import record_fingerprint

        return {
            "format": FORMAT,
            "fingerprint": record_fingerprint(self.record) if self.record else None,
            "record": self.record,
            "settings": self.settings.to_dict(),
            "prompts": [{"id": p.id, "kind": p.kind, "prompt": p.text} for p in self.prompts],
            "acceptance_how": ACCEPTANCE_HOW,
            "configs": self.configs,
            "warnings": self.warnings,
            "auto_vs_best": self.auto_vs_best,
            "compared_to": self.compared,
            "runs": [r.to_dict() for r in self.runs],
        }
