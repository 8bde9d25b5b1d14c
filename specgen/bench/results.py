"""The data of `specgen bench`: the format and mode names, one round (`Round`), one measured
generation (`RunResult`), what is measured (`BenchSettings`), progress reports (`Progress`),
the summaries (`PairSummary` per group of paired runs, `ConfigSummary` per configuration,
`AutoVsBest`), the comparison with an earlier file (`Comparison`), the record's fingerprint,
and everything measured (`BenchResult`), with their JSON forms (`to_dict`; the summaries'
field names are their JSON keys, in order)."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from specgen.acceptance_stats import position_counts
from specgen.bench.prompts import BenchPrompt, k_label
from specgen.bench.stats import percentiles
from specgen.events import ACCEPTANCE_HOW, Stats, Step
from specgen.flags import SamplingFlags
from specgen.sampling import SamplingParams

if TYPE_CHECKING:
    from specgen.grammarspec import GrammarSpec

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
    stats: Stats
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
            "stats": self.stats.to_dict(),
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
        sampling: the other sampling settings, shared by both modes (--top-k, --top-p,
            --min-p, -l and the penalties, --verify: block, token, or None for auto, each
            temperature's own); its temperature, -n and seed are set per generation
            (`flags`).
        warmup: one discarded generation of each mode first.
        trace: Steps carry a RoundTrace (for `on_event`; costs time).
        n_boot: bootstrap resamples for the speedup interval.
        k_init: first block size of `auto` (a registry pair's recommended K, as `run`
            uses); None = the controller's default.
        lookup: `--lookup` (on, off, or None/auto: `session.resolve_lookup`).

    Properties:
        grammar: what every generation's output must match, in both modes: `sampling`'s
            --grammar, --json-schema... (`specgen.genconfig.grammar_spec`, which is also
            what each generation reads); None for free text.
    """

    draft_max: tuple[int | None, ...] = (4, 8, None)
    temps: tuple[float, ...] = (0.0,)
    runs: int = 3
    n_tokens: int = 128
    seed: int = 1234
    sampling: SamplingFlags = field(default_factory=SamplingFlags)
    warmup: bool = True
    trace: bool = False
    n_boot: int = 4000
    k_init: int | None = None
    lookup: str | None = None

    @functools.cached_property
    def grammar(self) -> GrammarSpec | None:
        # derived, not a field: a second copy beside `sampling` could say one grammar in
        # the record while the generations ran under another
        from specgen.genconfig import grammar_spec  # start-up time: llguidance, if given

        return grammar_spec(self.sampling)

    def flags(self, temp: float, seed: int | None = None) -> SamplingFlags:
        """One generation's settings: `sampling` at temperature `temp` and -n `n_tokens`,
        end-of-generation ignored (every generation the same length)."""
        return replace(
            self.sampling, temp=temp, max_tokens=self.n_tokens, ignore_eos=True, seed=seed
        )

    def params(self, temp: float) -> SamplingParams:
        """The warpers and constraints at temperature `temp`."""
        return self.flags(temp).params()

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
            "top_k": self.sampling.top_k,
            "top_p": self.sampling.top_p,
            "min_p": self.sampling.min_p,
            "ignore_eos": True,
            "warmup": self.warmup,
            "k_init": self.k_init,
            "verify": self.sampling.verify or "auto",
            "lookup": self.lookup or "auto",
            "logit_bias": [list(pair) for pair in self.sampling.logit_bias],
            "repeat_penalty": self.sampling.repeat_penalty,
            "repeat_last_n": self.sampling.repeat_last_n,
            "presence_penalty": self.sampling.presence_penalty,
            "frequency_penalty": self.sampling.frequency_penalty,
            "grammar": (
                None
                if self.grammar is None
                else {"kind": self.grammar.kind, "source": self.grammar.source}
            ),
        }


@dataclass(frozen=True)
class Progress:
    """Reported before each generation: `done` of `total` finished so far."""

    done: int
    total: int
    description: str


# -- summaries ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """Per-token latency percentiles, milliseconds (None when nothing was measured)."""

    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True)
class ModeSummary:
    """One mode (ordinary or speculative) over a group of runs.

    Attributes:
        ttft_s: median time to first token, seconds.
        tokens_per_s: generated tokens over decode seconds, pooled (None without time).
        steady_tokens_per_s: median tokens/s after the first round.
        latency_ms: per-token latency percentiles.
    """

    ttft_s: float
    tokens_per_s: float | None
    steady_tokens_per_s: float
    latency_ms: Latency


@dataclass(frozen=True)
class TimeSplit:
    """Seconds of the speculative runs' decode time by stage (summed over runs)."""

    draft: float | None
    verify: float | None
    sampling: float | None
    other: float | None
    decode: float | None
    host: float | None = None
    """Of decode, the part outside llama_decode in either model (overlaps the others)."""


@dataclass(frozen=True)
class PairSummary:
    """Everything the report shows for one group of (ordinary, speculative) pairs.

    Attributes:
        n_pairs: pairs in the group.
        speedup: median of the paired tokens/s ratios (speculative / ordinary);
            speedup_ci95: its 95% percentile-bootstrap interval; speedup_e2e: the median
            ratio of end-to-end times (prefill included).
        ordinary, speculative: each mode's figures.
        acceptance_rate: accepted / drafted over every speculative round (`Round.n_drafted`,
            see `specgen.events.Stats.acceptance_rate`).
        tokens_per_pass: tokens per target pass; mean_block: mean proposals per round.
        acceptance_by_position: accepted / tested at block positions 1, 2, ... (None where
            nothing was tested); position_tested: the tested counts.
        time_split_s: the speculative decode time by stage.
        ordinary_token_s, draft_token_s: seconds per ordinary token and per proposal.
        verify_s_by_block: mean seconds of the rest of a round, by proposals m (str keys).
        theoretical_speedup: Leviathan et al.'s bound from the measured terms;
            achieved_fraction: speedup / bound.
        peak_rss_bytes: the largest peak RSS of the group's runs, bytes.
        host_s_per_round: host seconds (outside llama_decode, both models) per
            speculative round; host_s_per_row: the target side's host seconds per row it
            scored; ordinary_host_s_per_token: host seconds per ordinary-decoding token.
    """

    n_pairs: int
    speedup: float | None
    speedup_ci95: list[float | None]
    speedup_e2e: float | None
    ordinary: ModeSummary
    speculative: ModeSummary
    acceptance_rate: float | None
    tokens_per_pass: float | None
    mean_block: float | None
    acceptance_by_position: list[float | None]
    position_tested: list[int]
    time_split_s: TimeSplit
    ordinary_token_s: float | None
    draft_token_s: float | None
    verify_s_by_block: dict[str, float | None]
    theoretical_speedup: float | None
    achieved_fraction: float | None
    peak_rss_bytes: int
    host_s_per_round: float | None = None
    host_s_per_row: float | None = None
    ordinary_host_s_per_token: float | None = None


@dataclass(frozen=True)
class ConfigSummary:
    """One configuration (temperature x block size): all prompts and each prompt kind."""

    temp: float
    draft_max: str
    overall: PairSummary
    by_kind: dict[str, PairSummary]


@dataclass(frozen=True)
class AutoVsBest:
    """`auto` against the best fixed block size at one temperature (see
    `specgen.bench.summary.auto_vs_best`)."""

    temp: float
    best_k: int
    best_speedup: float | None
    auto_speedup: float | None
    ratio: float | None
    ratio_ci95: list[float | None]
    n_pairs: int


@dataclass(frozen=True)
class SpeedupChange:
    """One configuration's speedup in an earlier file and now."""

    temp: float
    draft_max: str
    before: float | None
    now: float | None


@dataclass(frozen=True)
class Comparison:
    """The comparison with an earlier `--json` file (`--compare`).

    Attributes:
        file: its path; fingerprint: its record's fingerprint.
        comparable: the records agree (`record_differences` is empty).
        differences: 'key: before -> now' lines.
        speedups: the configurations measured in both.
    """

    file: str
    fingerprint: str | None
    comparable: bool
    differences: list[str]
    speedups: list[SpeedupChange]


# -- the record's identity ------------------------------------------------------------------

# not part of comparability: when, where the files lie, how long loading took, how busy
# the machine was (a warning says so), the source's commit (comparing two is the point)
_VOLATILE = {"date", "path", "load_s", "other_cpu_load", "commit"}


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if k in _VOLATILE:
                continue
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def record_fingerprint(record: dict[str, Any]) -> str:
    """Short hash of the comparable part of a record: equal fingerprints, comparable runs."""
    canon = json.dumps(_flatten(record), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()[:16]


def record_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two records (ignoring date, paths and load times), as
    'key: a -> b' lines; empty when the runs are comparable."""
    fa, fb = _flatten(a), _flatten(b)
    out = []
    for key in sorted(fa.keys() | fb.keys()):
        if fa.get(key) != fb.get(key):
            out.append(f"{key}: {fa.get(key)!r} -> {fb.get(key)!r}")
    return out


# -- everything measured -------------------------------------------------------------------


@dataclass
class BenchResult:
    """Everything measured: raw runs, per-configuration summaries, the record."""

    settings: BenchSettings
    prompts: list[BenchPrompt]
    runs: list[RunResult]
    record: dict[str, Any] = field(default_factory=dict)
    configs: list[ConfigSummary] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    auto_vs_best: list[AutoVsBest] = field(default_factory=list)
    compared: Comparison | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "fingerprint": record_fingerprint(self.record) if self.record else None,
            "record": self.record,
            "settings": self.settings.to_dict(),
            "prompts": [{"id": p.id, "kind": p.kind, "prompt": p.text} for p in self.prompts],
            "acceptance_how": ACCEPTANCE_HOW,
            "configs": [asdict(c) for c in self.configs],
            "warnings": self.warnings,
            "auto_vs_best": [asdict(a) for a in self.auto_vs_best],
            "compared_to": None if self.compared is None else asdict(self.compared),
            "runs": [r.to_dict() for r in self.runs],
        }
