"""`specgen bench`: measure ordinary against speculative decoding, honestly. Returns data,
never prints (`specgen.cli_bench` renders it).

Method (`run_bench`): both models are loaded once. A discarded warm-up generation of each
mode comes first. Then for every sampling temperature, every run, every prompt and every
block size, the prompt is generated twice with the same seed, ordinary decoding (the
target alone) then speculative decoding, each for exactly `n_tokens` tokens
(end-of-generation tokens ignored), so the two modes do the same work side by side in
time, and all block sizes see the prompt under the same conditions of a shared machine.

Figures, per configuration (temperature x block size) and per prompt kind:

- speedup: the median over (prompt, run) pairs of the ratio of decode tokens/s,
  speculative / ordinary (decode = after the prompt is evaluated, so model loading and
  prefill are excluded; `speedup_e2e` is the same ratio over prefill + decode), with a
  95% percentile-bootstrap interval over the pairs;
- time to first token (prefill + first round), steady tokens/s (decode without the first
  round), per-token latency p50/p95/p99: each round's wall time spread evenly over the
  tokens it emitted (a speculative round emits its tokens at once; spreading gives the
  cost per token, not the burstiness of the stream);
- acceptance rate, tokens per target pass, acceptance by position in the block (position
  i is tested when i-1 proposals before it were accepted; a proposal the drafter never
  made is not a rejection), the time split (draft, verify, sampling, the rest);
- the theoretical speedup of Leviathan et al. 2023 given the measured acceptance by
  position and the measured costs (`theoretical_speedup`), and the achieved fraction;
- peak resident memory of the process (both models loaded).

A reproducibility record (`build_record`) describes models, software, machine and
settings; `record_differences` lists what makes two records not comparable.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from specgen.download import sha256_file
from specgen.engine import Block, Drafter, Engine
from specgen.errors import ConfigError
from specgen.events import Done, Prefilled, Step
from specgen.generate import FixedK, GenerateConfig, KPolicy, generate
from specgen.sampling import SamplingParams

FORMAT = "specgen-bench/1"
ORDINARY = "ordinary"
SPECULATIVE = "speculative"
ALL_KINDS = "all"

# -- prompt set ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of the set: `kind` groups the report (code, chat, extractive, ...)."""

    id: str
    kind: str
    text: str


def builtin_prompts() -> list[BenchPrompt]:
    """The shipped prompt set (`specgen/data/prompts.jsonl`)."""
    text = resources.files("specgen").joinpath("data/prompts.jsonl").read_text("utf-8")
    return _parse_prompts(text, "the built-in prompt set")


def load_prompts(path: Path | None) -> list[BenchPrompt]:
    """`--prompts FILE`: JSONL with a `prompt` field (optional `kind`, `id`), or plain text
    with one prompt per line (kind `custom`). None: the built-in set.

    Raises:
        ConfigError: unreadable file, bad JSON, no prompts.
    """
    if path is None:
        return builtin_prompts()
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"--prompts: cannot read {path}: {why}") from None
    return _parse_prompts(text, str(path))


def _parse_prompts(text: str, where: str) -> list[BenchPrompt]:
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        raise ConfigError(f"--prompts: no prompts in {where}")
    jsonl = lines[0][1].lstrip().startswith("{")
    out: list[BenchPrompt] = []
    for n, line in lines:
        if not jsonl:
            out.append(BenchPrompt(f"line-{n}", "custom", line))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--prompts: {where} line {n}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise ConfigError(f"--prompts: {where} line {n}: needs a string 'prompt' field")
        if not obj["prompt"]:
            raise ConfigError(f"--prompts: {where} line {n}: the prompt is empty")
        out.append(
            BenchPrompt(
                str(obj.get("id", f"line-{n}")), str(obj.get("kind", "custom")), obj["prompt"]
            )
        )
    return out


def prompt_set_sha256(prompts: Sequence[BenchPrompt]) -> str:
    """SHA-256 of the prompt set (kinds and texts, in order): part of the record."""
    canon = json.dumps([[p.kind, p.text] for p in prompts], ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


# -- list options -------------------------------------------------------------------------


def parse_draft_max_list(value: str) -> tuple[int | None, ...]:
    """`--draft-max 4,8,auto` -> (4, 8, None); None is the adaptive controller.

    Raises:
        ConfigError: empty list, a duplicate, or a value that is not 1..64 or `auto`.
    """
    from specgen.runner import parse_draft_max

    items = [s.strip() for s in value.split(",")]
    if not value.strip() or any(not s for s in items):
        raise ConfigError(f"--draft-max needs a comma-separated list like 4,8,auto, got {value!r}")
    out = tuple(parse_draft_max(s) for s in items)
    if len(set(out)) != len(out):
        raise ConfigError(f"--draft-max lists a value twice: {value!r}")
    return out


def parse_temp_list(value: str) -> tuple[float, ...]:
    """`--temp 0,0.8` -> (0.0, 0.8).

    Raises:
        ConfigError: empty list, a duplicate, a non-number or a negative value.
    """
    items = [s.strip() for s in value.split(",")]
    if not value.strip() or any(not s for s in items):
        raise ConfigError(f"--temp needs a comma-separated list like 0,0.8, got {value!r}")
    out = []
    for s in items:
        try:
            t = float(s)
        except ValueError:
            raise ConfigError(f"--temp: {s!r} is not a number") from None
        if not np.isfinite(t) or t < 0:
            raise ConfigError(f"--temp must be >= 0, got {s}")
        out.append(t)
    if len(set(out)) != len(out):
        raise ConfigError(f"--temp lists a value twice: {value!r}")
    return tuple(out)


def k_label(draft_max: int | None) -> str:
    return "auto" if draft_max is None else str(draft_max)


# -- statistics (pure) ----------------------------------------------------------------------


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> list[float]:
    """Linear-interpolation percentiles (numpy's default); NaN for no values."""
    if len(values) == 0:
        return [float("nan")] * len(qs)
    return [float(x) for x in np.percentile(np.asarray(values, dtype=np.float64), qs)]


def bootstrap_median_ci(
    values: Sequence[float], level: float = 0.95, n_boot: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval for the median of `values`.

    Resamples the values with replacement `n_boot` times (seeded, so a result reproduces
    exactly) and returns the (1-level)/2 and (1+level)/2 quantiles of the resampled
    medians. One value: (v, v). Raises ValueError for none.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    meds = np.median(x[idx], axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def theoretical_speedup(
    alpha_by_pos: Sequence[float],
    block_sizes: Sequence[int],
    draft_token_s: float,
    verify_s: Callable[[int], float],
    ordinary_token_s: float,
) -> float:
    """Speedup over ordinary decoding that the measured acceptance and costs allow.

    Each round with block m is expected to emit E(m) = 1 + sum_{i<=m} prod_{j<=i} alpha_j
    tokens (Leviathan et al. 2023, eq. (1) for a constant alpha: (1 - alpha^(m+1)) /
    (1 - alpha); `specgen.controller.expected_tokens`) and to cost m * draft_token_s +
    verify_s(m). Over the rounds actually run (block sizes `block_sizes`, which lets an
    adaptive K count):

        bound = (sum E(m_r) / sum (m_r * draft_token_s + verify_s(m_r))) * ordinary_token_s

    For a fixed block K this is E(K) * ordinary_token_s / (K * draft_token_s + verify_s(K)).

    Args:
        alpha_by_pos: measured acceptance at positions 1, 2, ... (last value repeats).
        block_sizes: drafted tokens of each round (0 = an ordinary pass).
        draft_token_s: seconds to draft one token.
        verify_s: seconds of the rest of a round (target pass on m+1 tokens, sampling,
            bookkeeping) as a function of m.
        ordinary_token_s: seconds per token of ordinary decoding.
    """
    from specgen.controller import expected_tokens

    if not block_sizes:
        return float("nan")
    tokens = sum(expected_tokens(alpha_by_pos, m) for m in block_sizes)
    cost = sum(m * draft_token_s + verify_s(m) for m in block_sizes)
    return tokens / cost * ordinary_token_s if cost > 0 else float("nan")


def position_counts(rounds: Iterable[tuple[int, int]], k_max: int) -> tuple[list[int], list[int]]:
    """Acceptance by position from rounds of (m drafted, n accepted).

    Position i (1-based) is tested when i <= m and the i-1 before it were accepted, i.e.
    for i <= min(m, n+1); it is accepted for i <= n.

    Returns:
        (tested, accepted), each of length k_max.
    """
    tested = [0] * k_max
    accepted = [0] * k_max
    for m, n in rounds:
        for i in range(min(m, n + 1, k_max)):
            tested[i] += 1
            if i < n:
                accepted[i] += 1
    return tested, accepted


def rates(tested: Sequence[int], accepted: Sequence[int]) -> list[float | None]:
    """accepted / tested per position; None where nothing was tested."""
    return [a / t if t else None for t, a in zip(tested, accepted, strict=True)]


# -- one generation -----------------------------------------------------------------------


class _BlockRecorder:
    """Wraps a drafter and records the size of every block it proposes (an n-gram or
    confidence cut-off drafter may propose fewer than K)."""

    def __init__(self, inner: Drafter) -> None:
        self._inner = inner
        self.sizes: list[int] = []

    def draft(self, context: list[int], k: int, rng: np.random.Generator) -> Block:
        block = self._inner.draft(context, k, rng)
        self.sizes.append(int(block.tokens.size))
        return block

    def __getattr__(self, name: str) -> Any:  # prefill, rollback, engine, close
        return getattr(self._inner, name)


@dataclass
class Round:
    """One Step, reduced: chosen k, drafted m, accepted n, emitted tokens, seconds."""

    k: int
    m: int
    n: int
    tokens: int
    draft_s: float
    round_s: float


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


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, bytes (ru_maxrss: KiB on Linux,
    bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


# Called with (run info, event) for every event of every measured generation: the seam for
# `--trace` (open a writer on Prefilled, write each Step, close it on Done).
EventHook = Callable[[dict[str, Any], Prefilled | Step | Done], None]


def measure(
    target: Engine,
    drafter: Drafter | None,
    prompt: list[int],
    config: GenerateConfig,
    policy: KPolicy,
    on_event: Callable[[Prefilled | Step | Done], None] | None = None,
) -> tuple[list[Round], Done, Prefilled]:
    """Run one generation and reduce its events to rounds."""
    rec = _BlockRecorder(drafter) if drafter is not None else None
    rounds: list[Round] = []
    done: Done | None = None
    pre: Prefilled | None = None
    n_blocks = 0
    for ev in generate(target, rec, prompt, config, policy):  # type: ignore[arg-type]
        if on_event is not None:
            on_event(ev)
        if isinstance(ev, Step):
            m = 0
            if ev.k > 0 and rec is not None:
                m = rec.sizes[n_blocks]
                n_blocks += 1
            rounds.append(Round(ev.k, m, ev.n_accepted, len(ev.spans), ev.draft_s, ev.round_s))
        elif isinstance(ev, Done):
            done = ev
        elif isinstance(ev, Prefilled):
            pre = ev
    assert done is not None and pre is not None
    return rounds, done, pre


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
        return {
            "format": FORMAT,
            "fingerprint": record_fingerprint(self.record) if self.record else None,
            "record": self.record,
            "settings": self.settings.to_dict(),
            "prompts": [{"id": p.id, "kind": p.kind, "prompt": p.text} for p in self.prompts],
            "configs": self.configs,
            "warnings": self.warnings,
            "auto_vs_best": self.auto_vs_best,
            "compared_to": self.compared,
            "runs": [r.to_dict() for r in self.runs],
        }


def bench(
    spec: Any,
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    draft_p_min: float = 0.0,
    progress: Callable[[Progress], None] | None = None,
    on_event: EventHook | None = None,
    status: Callable[[str], None] | None = None,
    on_loaded: Callable[[Any], None] | None = None,
) -> BenchResult:
    """Load the models of `spec` (a `specgen.runner.ModelSpec`) once, build the record,
    run `run_bench`, close the models.

    Raises:
        ConfigError: `--draft none` (nothing to compare with).
        ModelFileError, ModelLoadError, VocabMismatchError: from loading.
    """
    from specgen.runner import DRAFT_NONE, load

    if spec.draft == DRAFT_NONE:
        raise ConfigError(
            "bench compares ordinary with speculative decoding: give a draft model or"
            " 'ngram', not 'none'"
        )
    busy0 = cpu_snapshot()
    t0 = time.perf_counter()
    loaded = load(spec, settings.params(settings.temps[0]), draft_p_min, status=status)
    load_s = time.perf_counter() - t0
    try:
        assert loaded.drafter is not None
        if on_loaded is not None:  # e.g. a trace writer that needs the vocabulary
            on_loaded(loaded)
        if status is not None:
            status("hashing model files")
        record = build_record(
            spec.target, spec.draft, spec.target_cfg, spec.draft_cfg, settings, prompts,
            n_ctx=loaded.target.n_ctx, draft_p_min=draft_p_min,
        )  # fmt: skip
        record["load_s"] = round(load_s, 3)
        result = run_bench(loaded.target, loaded.drafter, prompts, settings, progress, on_event)
    finally:
        loaded.close()
    others = other_cpu_load(busy0, cpu_snapshot())
    record["other_cpu_load"] = None if others is None else round(others, 3)
    result.record = record
    usable = record["machine"]["cpus_usable"]
    if others is not None and others > 0.1 * usable:
        result.warnings.insert(
            0,
            f"other processes kept {others:.1f} of {usable} CPUs busy during the measurement:"
            " the figures are distorted; rerun on a quiet machine",
        )
    return result


def cpu_snapshot() -> tuple[float, float, float] | None:
    """(busy CPU seconds of the whole machine, this process's CPU seconds, wall time) from
    /proc/stat; None where it does not exist."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    busy = (sum(fields[:8]) - idle) / hz
    t = os.times()
    return busy, t.user + t.system, time.monotonic()


def other_cpu_load(
    a: tuple[float, float, float] | None, b: tuple[float, float, float] | None
) -> float | None:
    """Mean number of CPUs that other processes kept busy between two snapshots."""
    if a is None or b is None or b[2] <= a[2]:
        return None
    return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / (b[2] - a[2]))


def _drafter_for(drafter: Drafter, params: SamplingParams, n_vocab: int) -> Drafter:
    """The same draft engine under another temperature (q must use the target's warpers)."""
    from specgen.drafters import ModelDrafter

    if isinstance(drafter, ModelDrafter):
        return ModelDrafter(drafter.engine, params, n_vocab, drafter.p_min)
    return drafter


def _policy(draft_max: int | None, k_init: int | None) -> KPolicy:
    from specgen.runner import make_policy

    return make_policy(draft_max, k_init=k_init)


def run_bench(
    target: Engine,
    drafter: Drafter,
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    progress: Callable[[Progress], None] | None = None,
    on_event: EventHook | None = None,
) -> BenchResult:
    """Measure every configuration on every prompt, alternating ordinary and speculative
    decoding with the same seed (see the module docstring).

    Args:
        target, drafter: open models (the drafter is re-wrapped per temperature).
        on_event: called with (run info, event) for every Prefilled, Step and Done of the
            measured generations, not the warm-up (with `settings.trace`, each Step
            carries its RoundTrace): the seam for `--trace`.

    Raises:
        ConfigError: a prompt plus `n_tokens` and the block does not fit in the context.
        PromptError, EngineError: from the loop.
    """
    ids = [target.tokenize(p.text.encode("utf-8")) for p in prompts]
    k_auto = max(16, settings.k_init or 0)  # make_policy's k_max for auto
    k_need = max((k if k is not None else k_auto) for k in settings.draft_max)
    for p, toks in zip(prompts, ids, strict=True):
        need = len(toks) + settings.n_tokens + k_need + 1
        if need > target.n_ctx:
            raise ConfigError(
                f"prompt {p.id!r} ({len(toks)} tokens) + -n {settings.n_tokens} + block"
                f" {k_need} needs a context of {need}; raise -c or lower -n"
            )
    total = settings.total_generations(len(prompts))
    done = 0

    def tick(desc: str) -> None:
        if progress is not None:
            progress(Progress(done, total, desc))

    def one(mode, temp, k, prompt_i, run, seed, warm=False) -> RunResult:
        params = settings.params(temp)
        config = GenerateConfig(
            max_tokens=min(settings.n_tokens, 16) if warm else settings.n_tokens,
            params=params,
            ignore_eos=True,
            seed=seed,
            trace=settings.trace,
            # as `specgen run` does: the baseline for the controller, timed after the prompt
            measure_ordinary=0 if mode == ORDINARY else 3,
        )
        p = prompts[prompt_i]
        info = {
            "mode": mode,
            "temp": temp,
            "draft_max": k_label(k),
            "prompt_id": p.id,
            "kind": p.kind,
            "run": run,
            "seed": seed,
            "warmup": warm,
        }
        hook = (lambda ev: on_event(info, ev)) if on_event is not None and not warm else None
        if mode == ORDINARY:
            rounds, d, pre = measure(target, None, ids[prompt_i], config, FixedK(0), hook)
        else:
            dr = _drafter_for(drafter, params, target.n_vocab)
            policy = _policy(k, settings.k_init)
            rounds, d, pre = measure(target, dr, ids[prompt_i], config, policy, hook)
        s = d.stats
        return RunResult(
            mode=mode, temp=temp, draft_max=k, prompt_id=p.id, kind=p.kind, run=run,
            seed=seed, stats=s.to_dict(), rounds=rounds, n_generated=s.n_generated,
            prefill_s=s.prefill_s, decode_s=s.decode_s, ttft_s=s.ttft_s,
            peak_rss_bytes=peak_rss_bytes(),
        )  # fmt: skip

    if settings.warmup:
        for mode in (ORDINARY, SPECULATIVE):
            tick(f"warm-up ({mode})")
            one(mode, settings.temps[0], settings.draft_max[0], 0, -1, settings.seed, warm=True)
            done += 1
    results: list[RunResult] = []
    # every configuration is measured on each prompt before the next prompt, so slow drift
    # of a shared machine affects all of them alike (comparisons across K stay fair)
    for temp in settings.temps:
        for run in range(settings.runs):
            for i, p in enumerate(prompts):
                seed = settings.seed + 1000 * run + i
                for k in settings.draft_max:
                    for mode in (ORDINARY, SPECULATIVE):
                        tick(f"temp {temp:g} K {k_label(k)} · {p.id} · {mode}")
                        results.append(one(mode, temp, k, i, run, seed))
                        done += 1
    tick("done")
    result = BenchResult(settings=settings, prompts=list(prompts), runs=results)
    summarize(result)
    return result


# -- summaries --------------------------------------------------------------------------------


def _pairs(runs: Sequence[RunResult]) -> list[tuple[RunResult, RunResult]]:
    by_key: dict[tuple, dict[str, RunResult]] = {}
    for r in runs:
        by_key.setdefault((r.temp, r.draft_max, r.prompt_id, r.run), {})[r.mode] = r
    return [(d[ORDINARY], d[SPECULATIVE]) for d in by_key.values() if len(d) == 2]


def _med(xs: Sequence[float]) -> float:
    return float(np.median(xs)) if len(xs) else float("nan")


def _mode_summary(runs: Sequence[RunResult]) -> dict[str, Any]:
    lat: list[float] = []
    for r in runs:
        lat += r.token_latencies_s()
    p50, p95, p99 = percentiles(lat)
    decode = sum(r.decode_s for r in runs)
    gen = sum(r.n_generated for r in runs)
    return {
        "ttft_s": round(_med([r.ttft_s for r in runs]), 6),
        "tokens_per_s": round(gen / decode, 4) if decode > 0 else None,
        "steady_tokens_per_s": round(_med([r.steady_tokens_per_s for r in runs]), 4),
        "latency_ms": {"p50": _ms(p50), "p95": _ms(p95), "p99": _ms(p99)},
    }


def summarize_pairs(
    pairs: Sequence[tuple[RunResult, RunResult]], n_boot: int = 4000, seed: int = 0
) -> dict[str, Any]:
    """Everything the report shows for one group of (ordinary, speculative) pairs."""
    ords = [o for o, _ in pairs]
    specs = [s for _, s in pairs]
    ratios = [s.tokens_per_s / o.tokens_per_s for o, s in pairs if o.tokens_per_s > 0]
    e2e = [o.e2e_s / s.e2e_s for o, s in pairs if s.e2e_s > 0]
    ci = bootstrap_median_ci(ratios, n_boot=n_boot, seed=seed) if ratios else (None, None)

    rounds = [r for s in specs for r in s.rounds]
    k_span = _k_span(rounds)
    tested, accepted = position_counts(((r.m, r.n) for r in rounds), k_span)
    by_pos = rates(tested, accepted)
    n_drafted = sum(r.m for r in rounds)
    n_acc = sum(r.n for r in rounds)
    gen = sum(s.n_generated for s in specs)
    decode = sum(s.decode_s for s in specs)
    draft_s = sum(s.stats["draft_s"] for s in specs)
    verify_s = sum(s.stats["verify_s"] for s in specs)
    sample_s = sum(s.stats["sample_s"] for s in specs)

    # theoretical bound from the measured terms
    ord_decode = sum(o.decode_s for o in ords)
    ord_gen = sum(o.n_generated for o in ords)
    ordinary_token_s = ord_decode / ord_gen if ord_gen else float("nan")
    draft_token_s = sum(r.draft_s for r in rounds) / n_drafted if n_drafted else 0.0
    rest: dict[int, list[float]] = {}
    for r in rounds:
        rest.setdefault(r.m, []).append(r.round_s - r.draft_s)
    rest_mean = {m: float(np.mean(v)) for m, v in rest.items()}
    alphas = [a if a is not None else 0.0 for a in by_pos]
    # positions never tested: carry the last measured rate (none tested: alpha = 0)
    for i in range(1, len(alphas)):
        if by_pos[i] is None:
            alphas[i] = alphas[i - 1]
    bound = (
        theoretical_speedup(
            alphas, [r.m for r in rounds], draft_token_s, lambda m: rest_mean[m], ordinary_token_s
        )
        if rounds and ord_gen
        else float("nan")
    )
    speedup = _med(ratios)
    return {
        "n_pairs": len(pairs),
        "speedup": _r(speedup),
        "speedup_ci95": [_r(ci[0]), _r(ci[1])],
        "speedup_e2e": _r(_med(e2e)),
        "ordinary": _mode_summary(ords),
        "speculative": _mode_summary(specs),
        "acceptance_rate": _r(n_acc / n_drafted) if n_drafted else None,
        "tokens_per_pass": _r(gen / len(rounds)) if rounds else None,
        "mean_block": _r(n_drafted / len(rounds)) if rounds else None,
        "acceptance_by_position": [_r(a) if a is not None else None for a in by_pos],
        "position_tested": tested,
        "time_split_s": {
            "draft": _r(draft_s),
            "verify": _r(verify_s),
            "sampling": _r(sample_s),
            "other": _r(max(0.0, decode - draft_s - verify_s - sample_s)),
            "decode": _r(decode),
        },
        "ordinary_token_s": _r(ordinary_token_s),
        "draft_token_s": _r(draft_token_s),
        "verify_s_by_block": {str(m): _r(v) for m, v in sorted(rest_mean.items())},
        "theoretical_speedup": _r(bound),
        "achieved_fraction": _r(speedup / bound) if bound == bound and bound > 0 else None,
        "peak_rss_bytes": max((r.peak_rss_bytes for r in (*ords, *specs)), default=0),
    }


def _r(x: float | None, nd: int = 6) -> float | None:
    if x is None or x != x:
        return None
    return round(float(x), nd)


def auto_vs_best(
    runs: Sequence[RunResult], temp: float, n_boot: int = 4000, seed: int = 0
) -> dict[str, Any] | None:
    """`auto` against the best fixed block size at one temperature, paired per prompt and run.

    The best fixed K is the one with the highest median speedup. For every (prompt, run)
    measured under both, the ratio is auto's speedup over the best K's speedup, each
    against the ordinary run measured next to it (so slow drift of the machine cancels);
    the result is the median ratio with a 95% percentile-bootstrap interval. 1.0 means
    auto matched the best fixed K chosen in hindsight.

    Returns:
        {"temp", "best_k", "best_speedup", "auto_speedup", "ratio", "ratio_ci95",
        "n_pairs"}, or None when `runs` lacks auto or every fixed K at `temp`.
    """

    def speedups(k: int | None) -> dict[tuple[str, int], float]:
        out = {}
        for o, sp in _pairs([r for r in runs if r.temp == temp and r.draft_max == k]):
            if o.tokens_per_s > 0:
                out[(o.prompt_id, o.run)] = sp.tokens_per_s / o.tokens_per_s
        return out

    fixed = sorted({r.draft_max for r in runs if r.temp == temp and r.draft_max is not None})
    auto = speedups(None)
    per_k = {k: speedups(k) for k in fixed}
    per_k = {k: v for k, v in per_k.items() if v}
    if not auto or not per_k:
        return None
    best = max(per_k, key=lambda k: _med(list(per_k[k].values())))
    keys = sorted(auto.keys() & per_k[best].keys())
    if not keys:
        return None
    ratios = [auto[key] / per_k[best][key] for key in keys]
    lo, hi = bootstrap_median_ci(ratios, n_boot=n_boot, seed=seed)
    return {
        "temp": temp,
        "best_k": best,
        "best_speedup": _r(_med(list(per_k[best].values()))),
        "auto_speedup": _r(_med(list(auto.values()))),
        "ratio": _r(_med(ratios)),
        "ratio_ci95": [_r(lo), _r(hi)],
        "n_pairs": len(keys),
    }


def auto_vs_best_text(a: dict[str, Any]) -> str:
    """One line for the table footers: 'temp 0: auto reaches 0.97× [0.93, 1.01] of K 8'."""
    lo, hi = a["ratio_ci95"]
    return (
        f"temp {a['temp']:g}: auto reaches {a['ratio']:.2f}× [{lo:.2f}, {hi:.2f}] of the best"
        f" fixed K ({a['best_k']}: {a['best_speedup']:.2f}× vs auto {a['auto_speedup']:.2f}×"
        f" over ordinary decoding; {a['n_pairs']} paired generations)"
    )


def summarize(result: BenchResult) -> None:
    """Fill `result.configs` (one entry per temperature x block size, with an `all` row
    and one per prompt kind) and `result.warnings`."""
    s = result.settings
    kinds = list(dict.fromkeys(p.kind for p in result.prompts))
    result.configs = []
    result.warnings = []
    result.auto_vs_best = [
        a for t in s.temps if (a := auto_vs_best(result.runs, t, s.n_boot, s.seed)) is not None
    ]
    for temp in s.temps:
        for k in s.draft_max:
            runs = [r for r in result.runs if r.temp == temp and r.draft_max == k]
            pairs = _pairs(runs)
            if not pairs:
                continue
            entry = {
                "temp": temp,
                "draft_max": k_label(k),
                "overall": summarize_pairs(pairs, s.n_boot, s.seed),
                "by_kind": {
                    kind: summarize_pairs(
                        [pr for pr in pairs if pr[0].kind == kind], s.n_boot, s.seed
                    )
                    for kind in kinds
                    if any(pr[0].kind == kind for pr in pairs)
                },
            }
            result.configs.append(entry)
            ov = entry["overall"]
            if ov["speedup"] is not None and ov["speedup"] < 1.0:
                result.warnings.append(
                    f"temp {temp:g}, K {k_label(k)}: speculation is slower than ordinary"
                    f" decoding (speedup {ov['speedup']:.2f}x, acceptance"
                    f" {_pct(ov['acceptance_rate'])})"
                )
            for kind, ks in entry["by_kind"].items():
                if ov["speedup"] is not None and ov["speedup"] >= 1.0 and (ks["speedup"] or 0) < 1:
                    result.warnings.append(
                        f"temp {temp:g}, K {k_label(k)}: slower than ordinary decoding on"
                        f" {kind} prompts ({ks['speedup']:.3f}x)"
                    )


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


# -- reproducibility record -----------------------------------------------------------------

# llama.cpp's `llama_ftype` (general.file_type) names
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}  # fmt: skip


def gguf_metadata(
    path: Path, keys: Sequence[str] = ("general.architecture", "general.file_type")
) -> dict[str, Any]:
    """Read scalar/string metadata `keys` from a GGUF header without loading the model
    (stops as soon as all are found). Missing keys are absent from the result.

    Raises:
        ValueError: not a GGUF file.
    """
    want = set(keys)
    out: dict[str, Any] = {}
    with open(path, "rb") as f:

        def read(fmt: str) -> Any:
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def read_str() -> bytes:
            return f.read(read("<Q"))

        def skip(vtype: int) -> None:
            if vtype == 8:
                f.seek(read("<Q"), 1)
            elif vtype == 9:
                itype, n = read("<I"), read("<Q")
                if itype in _SCALAR:
                    f.seek(n * struct.calcsize(_SCALAR[itype]), 1)
                else:
                    for _ in range(n):
                        skip(itype)
            else:
                f.seek(struct.calcsize(_SCALAR[vtype]), 1)

        if f.read(4) != b"GGUF":
            raise ValueError(f"not a GGUF file: {path}")
        version = read("<I")
        count = "<Q" if version >= 2 else "<I"
        read(count)  # tensors
        n_kv = read(count)
        for _ in range(n_kv):
            key = read_str().decode("utf-8", "replace")
            vtype = read("<I")
            if key in want and vtype in _SCALAR:
                out[key] = read(_SCALAR[vtype])
            elif key in want and vtype == 8:
                out[key] = read_str().decode("utf-8", "replace")
            else:
                skip(vtype)
            if want <= out.keys():
                break
    return out


def model_record(path: Path, n_gpu_layers: int) -> dict[str, Any]:
    """File name, size, SHA-256, architecture and quantization type of one model file."""
    path = Path(path)
    try:
        meta = gguf_metadata(path)
    except (ValueError, OSError, struct.error):
        meta = {}
    ft = meta.get("general.file_type")
    return {
        "file": path.name,
        "path": str(path.resolve()),
        "size_bytes": path.stat().st_size,
        "sha256": sha256_file(path),
        "architecture": meta.get("general.architecture"),
        "quantization": _FILE_TYPES.get(ft, f"type {ft}") if ft is not None else None,
        "n_gpu_layers": n_gpu_layers,
    }


def backend_of(system_info: str) -> str:
    """The GPU backend compiled into llama.cpp, from its system-info line."""
    s = system_info.upper()
    for name, marks in (
        ("CUDA", ("CUDA",)),
        ("Metal", ("METAL", "MTL")),
        ("Vulkan", ("VULKAN",)),
        ("ROCm", ("HIP", "ROCM")),
        ("SYCL", ("SYCL",)),
    ):
        if any(m in s for m in marks):
            return name
    return "CPU"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                timeout=5,
            )  # fmt: skip
            if out.stdout.strip():
                return out.stdout.strip()
    return platform.processor() or platform.machine()


def gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs (name, memory) via nvidia-smi when present; [] otherwise."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.stdout.strip().splitlines():
        name, _, mem = line.rpartition(",")
        with contextlib.suppress(ValueError):
            found.append({"name": name.strip(), "memory_bytes": int(float(mem)) * 1024 * 1024})
    return found


def machine_record() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "memory_bytes": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "gpus": gpus(),
    }


def software_record() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    from specgen import llamacpp

    info = llamacpp.system_info()
    llama_version = info.get("llama_cpp")
    if llama_version is None:  # not in system_info(): ask the bindings directly
        with contextlib.suppress(Exception):
            llama_version = llamacpp.llama_cpp.llama_version().decode()
    try:
        specgen_version = version("specgen")
    except PackageNotFoundError:
        from specgen import __version__ as specgen_version
    return {
        "specgen": specgen_version,
        "llama_cpp_python": info.get("llama_cpp_python"),
        "llama_cpp": llama_version,
        "backend": backend_of(info.get("system_info", "")),
        "gpu_offload": info.get("gpu_offload") == "True",
        "system_info": info.get("system_info"),
        "numpy": np.__version__,
    }


def build_record(
    target_path: Path,
    draft: Path | str,
    target_cfg: Any,
    draft_cfg: Any,
    settings: BenchSettings,
    prompts: Sequence[BenchPrompt],
    n_ctx: int | None = None,
    draft_p_min: float = 0.0,
) -> dict[str, Any]:
    """The reproducibility record: everything that changes the figures.

    `target_cfg`/`draft_cfg` are `EngineConfig`s; `draft` is a path or `ngram`.
    """
    from specgen.llamacpp import default_threads

    draft_rec: dict[str, Any]
    if isinstance(draft, Path) or (isinstance(draft, str) and draft not in ("ngram", "none")):
        draft_rec = model_record(Path(draft), draft_cfg.n_gpu_layers)
    else:
        draft_rec = {"file": str(draft), "sha256": None, "n_gpu_layers": 0}
    threads = target_cfg.n_threads if target_cfg.n_threads > 0 else default_threads()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "target": model_record(Path(target_path), target_cfg.n_gpu_layers),
        "draft": draft_rec,
        "draft_p_min": draft_p_min,
        "software": software_record(),
        "machine": machine_record(),
        "threads": threads,
        "n_ctx": n_ctx if n_ctx is not None else target_cfg.n_ctx,
        "n_batch": target_cfg.n_batch,
        "sampling": {
            "temps": list(settings.temps),
            "top_k": settings.top_k,
            "top_p": settings.top_p,
            "min_p": settings.min_p,
        },
        "seed": settings.seed,
        "n_tokens": settings.n_tokens,
        "runs": settings.runs,
        "draft_max": [k_label(k) for k in settings.draft_max],
        "prompt_set_sha256": prompt_set_sha256(prompts),
        "n_prompts": len(prompts),
    }


# not part of comparability: when, where the files lie, how long loading took, how busy
# the machine was (a warning says so)
_VOLATILE = {"date", "path", "load_s", "other_cpu_load"}


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


def compare_with(result: BenchResult, path: Path) -> dict[str, Any]:
    """Compare `result` with an earlier `--json` file: record differences and speedups.

    Raises:
        ConfigError: the file cannot be read or is not a bench result.
    """
    try:
        old = json.loads(Path(path).read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"--compare: cannot read {path}: {e}") from None
    if not isinstance(old, dict) or old.get("format") != FORMAT:
        raise ConfigError(f"--compare: {path} is not a specgen bench JSON file")
    diffs = record_differences(old.get("record", {}), result.record)
    old_speedups = {
        (c["temp"], c["draft_max"]): c["overall"]["speedup"] for c in old.get("configs", [])
    }
    rows = []
    for c in result.configs:
        key = (c["temp"], c["draft_max"])
        if key in old_speedups:
            rows.append(
                {"temp": key[0], "draft_max": key[1], "before": old_speedups[key],
                 "now": c["overall"]["speedup"]}
            )  # fmt: skip
    return {
        "file": str(path),
        "fingerprint": old.get("fingerprint"),
        "comparable": not diffs,
        "differences": diffs,
        "speedups": rows,
    }


# -- outputs ------------------------------------------------------------------------------------


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, then rename: never a partial file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(result: BenchResult, path: Path) -> None:
    text = json.dumps(result.to_dict(), indent=1, ensure_ascii=False) + "\n"
    atomic_write(path, text.encode("utf-8"))


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def speedup_text(s: dict[str, Any]) -> str:
    """'1.62× [1.55, 1.70]' (or '–')."""
    if s["speedup"] is None:
        return "–"
    lo, hi = s["speedup_ci95"]
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and s["n_pairs"] > 1 else ""
    return f"{s['speedup']:.2f}×{ci}"


def render_markdown(result: BenchResult) -> str:
    """Two README-ready tables (per configuration; speedup by prompt kind) and the record."""
    rec = result.record
    lines = [
        "| temp | K | ordinary tok/s | speculative tok/s | speedup [95% CI] | acceptance"
        " | tokens/pass | TTFT ord / spec (ms) | latency p50/p95/p99 (ms) | bound | achieved |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in result.configs:
        o = c["overall"]
        lat = o["speculative"]["latency_ms"]
        sp = speedup_text(o)
        if o["speedup"] is not None and o["speedup"] < 1:
            sp += " (slower)"
        lines.append(
            f"| {c['temp']:g} | {c['draft_max']} | {_f(o['ordinary']['tokens_per_s'], '.1f')}"
            f" | {_f(o['speculative']['tokens_per_s'], '.1f')} | {sp}"
            f" | {_pct(o['acceptance_rate'])} | {_f(o['tokens_per_pass'], '.2f')}"
            f" | {_f(_x1000(o['ordinary']['ttft_s']), '.0f')} /"
            f" {_f(_x1000(o['speculative']['ttft_s']), '.0f')}"
            f" | {_f(lat['p50'], '.1f')} / {_f(lat['p95'], '.1f')} / {_f(lat['p99'], '.1f')}"
            f" | {_f(o['theoretical_speedup'], '.2f')}×"
            f" | {_pct(o['achieved_fraction'])} |"
        )
    kinds = list(dict.fromkeys(k for c in result.configs for k in c["by_kind"]))
    if kinds:
        lines += ["", "Speedup by prompt kind (acceptance in parentheses):", ""]
        heads = [f"temp {c['temp']:g}, K {c['draft_max']}" for c in result.configs]
        lines.append("| kind | " + " | ".join(heads) + " |")
        lines.append("|---|" + "---:|" * len(heads))
        for kind in kinds:
            cells = []
            for c in result.configs:
                s = c["by_kind"].get(kind)
                cells.append(
                    "–" if s is None or s["speedup"] is None
                    else f"{s['speedup']:.2f}× ({_pct(s['acceptance_rate'])})"
                )  # fmt: skip
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    if result.auto_vs_best:
        lines.append("")
        lines += [f"- {auto_vs_best_text(a)}" for a in result.auto_vs_best]
    if rec:
        lines += ["", describe_record(rec)]
    return "\n".join(lines) + "\n"


def _x1000(x: float | None) -> float | None:
    return None if x is None else x * 1000


def describe_record(rec: dict[str, Any]) -> str:
    """One paragraph naming the machine, software, models and settings."""
    m, sw, t, d = rec["machine"], rec["software"], rec["target"], rec["draft"]
    gpu = ", ".join(f"{g['name']} ({g['memory_bytes'] / 2**30:.0f} GiB)" for g in m["gpus"])
    mem = f", {m['memory_bytes'] / 2**30:.0f} GiB RAM" if m.get("memory_bytes") else ""

    def model(x: dict[str, Any]) -> str:
        if x.get("sha256") is None:
            return x["file"]
        q = f" {x['quantization']}" if x.get("quantization") else ""
        return f"{x['file']}{q} (sha256 {x['sha256'][:12]}…, -ngl {x['n_gpu_layers']})"

    return (
        f"Machine: {m['cpu']}, {m['cpus_usable']} of {m['cpu_count']} CPUs usable{mem}"
        f"{', GPU ' + gpu if gpu else ''}; {m['os']}. "
        f"llama.cpp {sw['llama_cpp']} via llama-cpp-python {sw['llama_cpp_python']}"
        f" ({sw['backend']} backend), specgen {sw['specgen']}, {rec['threads']} threads,"
        f" context {rec['n_ctx']}. "
        f"Target {model(t)}; draft {model(d)}. "
        f"{rec['n_prompts']} prompts (set {rec['prompt_set_sha256'][:12]}…), -n {rec['n_tokens']},"
        f" {rec['runs']} run(s), seed {rec['seed']}, top-k {rec['sampling']['top_k']},"
        f" top-p {rec['sampling']['top_p']}, min-p {rec['sampling']['min_p']}."
        f" Record fingerprint {record_fingerprint(rec)}, {rec['date'][:10]}."
    )


def write_markdown(result: BenchResult, path: Path) -> None:
    atomic_write(path, render_markdown(result).encode("utf-8"))


PLOT_MISSING = "--plot needs matplotlib: pip install 'specgen[plot]'"


def check_plot_available() -> None:
    """Raises ConfigError (one line) when matplotlib is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(PLOT_MISSING)


def write_plot(result: BenchResult, path: Path) -> None:
    """PNG: speedup against block size per prompt kind (one panel per temperature), and
    acceptance by position in the block.

    Raises:
        ConfigError: matplotlib is not installed.
    """
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    temps = list(dict.fromkeys(c["temp"] for c in result.configs))
    fig, axes = plt.subplots(1, len(temps) + 1, figsize=(5 * (len(temps) + 1), 4), squeeze=False)
    for ax, temp in zip(axes[0], temps, strict=False):
        cfgs = [c for c in result.configs if c["temp"] == temp]
        labels = [c["draft_max"] for c in cfgs]
        xs = range(len(cfgs))
        kinds = list(dict.fromkeys(k for c in cfgs for k in c["by_kind"]))
        for kind in [ALL_KINDS, *kinds]:
            ys = [
                (c["overall"] if kind == ALL_KINDS else c["by_kind"].get(kind, {})).get("speedup")
                for c in cfgs
            ]
            ys = [np.nan if y is None else y for y in ys]
            style = {"linewidth": 3, "color": "black"} if kind == ALL_KINDS else {}
            ax.plot(list(xs), ys, marker="o", label=kind, **style)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(list(xs), labels)
        ax.set_xlabel("block size K")
        ax.set_ylabel("speedup (× ordinary decoding)")
        ax.set_title(f"temperature {temp:g}")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for c in result.configs:
        acc = c["overall"]["acceptance_by_position"]
        ys = [np.nan if a is None else a for a in acc]
        if ys:
            ax.plot(
                range(1, len(ys) + 1), ys, marker=".", label=f"t {c['temp']:g}, K {c['draft_max']}"
            )
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("position in block")
    ax.set_ylabel("acceptance (given the previous accepted)")
    ax.set_title("acceptance by position")
    ax.legend(fontsize=7)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, buf.getvalue())
