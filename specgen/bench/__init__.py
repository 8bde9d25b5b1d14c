"""`specgen bench`: measure ordinary against speculative decoding, honestly. Returns data,
never prints (`specgen.cli.bench` renders it).

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

The code, by module: `prompts` (the prompt set, list options), `stats` (pure statistics),
`results` (the data: runs, settings, the result), `method` (the measurement), `summary`
(figures per configuration), `record` (the reproducibility record), `report` (JSON,
Markdown, plot). The names used as `bench.NAME` are re-exported here.
"""

from __future__ import annotations

from specgen.acceptance_stats import position_counts, rates
from specgen.bench.method import (
    BenchInterrupted,
    bench,
    check_draft,
    cpu_snapshot,
    other_cpu_load,
    run_bench,
)
from specgen.bench.prompts import (
    BenchPrompt,
    builtin_prompts,
    load_prompts,
    parse_draft_max_list,
    parse_temp_list,
    prompt_set_sha256,
)
from specgen.bench.record import backend_of, build_record, compare_with, load_earlier
from specgen.bench.report import (
    atomic_write,
    check_plot_available,
    describe_record,
    speedup_text,
    write_json,
    write_markdown,
    write_plot,
)
from specgen.bench.results import (
    FORMAT,
    ORDINARY,
    SPECULATIVE,
    AutoVsBest,
    BenchResult,
    BenchSettings,
    Comparison,
    ConfigSummary,
    PairSummary,
    Progress,
    Round,
    RunResult,
    record_differences,
    record_fingerprint,
)
from specgen.bench.stats import bootstrap_median_ci, percentiles, theoretical_speedup
from specgen.bench.summary import auto_vs_best, auto_vs_best_text, pct, summarize

__all__ = [
    "FORMAT",
    "ORDINARY",
    "SPECULATIVE",
    "AutoVsBest",
    "BenchInterrupted",
    "BenchPrompt",
    "BenchResult",
    "BenchSettings",
    "Comparison",
    "ConfigSummary",
    "PairSummary",
    "Progress",
    "Round",
    "RunResult",
    "atomic_write",
    "auto_vs_best",
    "auto_vs_best_text",
    "backend_of",
    "bench",
    "bootstrap_median_ci",
    "build_record",
    "builtin_prompts",
    "check_draft",
    "check_plot_available",
    "compare_with",
    "load_earlier",
    "cpu_snapshot",
    "describe_record",
    "load_prompts",
    "other_cpu_load",
    "parse_draft_max_list",
    "parse_temp_list",
    "pct",
    "percentiles",
    "position_counts",
    "prompt_set_sha256",
    "rates",
    "record_differences",
    "record_fingerprint",
    "run_bench",
    "speedup_text",
    "summarize",
    "theoretical_speedup",
    "write_json",
    "write_markdown",
    "write_plot",
]
