"""The summaries of `specgen bench`: measured runs paired (ordinary, speculative) and reduced
to the figures the report shows per configuration and prompt kind (speedup with its
interval, latencies, acceptance, time split, theoretical bound), `auto` against the best
fixed block size, and the warnings."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specgen.acceptance_stats import acceptance_rate, position_counts, rates, tokens_per_pass
from specgen.bench.prompts import k_label
from specgen.bench.results import (
    ORDINARY,
    SPECULATIVE,
    AutoVsBest,
    BenchResult,
    ConfigSummary,
    Latency,
    ModeSummary,
    PairSummary,
    RunResult,
    TimeSplit,
    _k_span,
    _ms,
)
from specgen.bench.stats import bootstrap_median_ci, percentiles, theoretical_speedup

# -- summaries --------------------------------------------------------------------------------


def _pairs(runs: Sequence[RunResult]) -> list[tuple[RunResult, RunResult]]:
    by_key: dict[tuple[float, int | None, str, int], dict[str, RunResult]] = {}
    for r in runs:
        by_key.setdefault((r.temp, r.draft_max, r.prompt_id, r.run), {})[r.mode] = r
    return [(d[ORDINARY], d[SPECULATIVE]) for d in by_key.values() if len(d) == 2]


def _med(xs: Sequence[float]) -> float:
    return float(np.median(xs)) if len(xs) else float("nan")


def _mode_summary(runs: Sequence[RunResult]) -> ModeSummary:
    lat: list[float] = []
    for r in runs:
        lat += r.token_latencies_s()
    p50, p95, p99 = percentiles(lat)
    decode = sum(r.decode_s for r in runs)
    gen = sum(r.n_generated for r in runs)
    return ModeSummary(
        ttft_s=round(_med([r.ttft_s for r in runs]), 6),
        tokens_per_s=round(gen / decode, 4) if decode > 0 else None,
        steady_tokens_per_s=round(_med([r.steady_tokens_per_s for r in runs]), 4),
        latency_ms=Latency(_ms(p50), _ms(p95), _ms(p99)),
    )


def summarize_pairs(
    pairs: Sequence[tuple[RunResult, RunResult]], n_boot: int = 4000, seed: int = 0
) -> PairSummary:
    """Everything the report shows for one group of (ordinary, speculative) pairs."""
    ords = [o for o, _ in pairs]
    specs = [s for _, s in pairs]
    ratios = [s.tokens_per_s / o.tokens_per_s for o, s in pairs if o.tokens_per_s > 0]
    e2e = [o.e2e_s / s.e2e_s for o, s in pairs if s.e2e_s > 0]
    ci: tuple[float | None, float | None] = (
        bootstrap_median_ci(ratios, n_boot=n_boot, seed=seed) if ratios else (None, None)
    )

    rounds = [r for s in specs for r in s.rounds]
    k_span = _k_span(rounds)
    tested, accepted = position_counts(((r.m, r.n) for r in rounds), k_span)
    by_pos = rates(tested, accepted)
    n_proposed = sum(r.m for r in rounds)
    n_drafted = sum(r.n_drafted for r in rounds)  # the loop's count (`Stats.acceptance_rate`)
    n_acc = sum(r.n for r in rounds)
    gen = sum(s.n_generated for s in specs)
    decode = sum(s.decode_s for s in specs)
    draft_s = sum(s.stats.draft_s for s in specs)
    verify_s = sum(s.stats.verify_s for s in specs)
    sample_s = sum(s.stats.sample_s for s in specs)
    host_s = sum(s.stats.host_s for s in specs)
    draft_host_s = sum(s.stats.draft_host_s for s in specs)
    n_rows = sum(s.stats.n_rows for s in specs)
    ord_host_s = sum(o.stats.host_s for o in ords)

    # theoretical bound from the measured terms
    ord_decode = sum(o.decode_s for o in ords)
    ord_gen = sum(o.n_generated for o in ords)
    ordinary_token_s = ord_decode / ord_gen if ord_gen else float("nan")
    draft_token_s = sum(r.draft_s for r in rounds) / n_proposed if n_proposed else 0.0
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
    return PairSummary(
        n_pairs=len(pairs),
        speedup=_r(speedup),
        speedup_ci95=[_r(ci[0]), _r(ci[1])],
        speedup_e2e=_r(_med(e2e)),
        ordinary=_mode_summary(ords),
        speculative=_mode_summary(specs),
        acceptance_rate=_r(acceptance_rate(n_acc, n_drafted)) if n_drafted else None,
        tokens_per_pass=_r(tokens_per_pass(gen, len(rounds))) if rounds else None,
        mean_block=_r(n_proposed / len(rounds)) if rounds else None,
        acceptance_by_position=[_r(a) if a is not None else None for a in by_pos],
        position_tested=tested,
        time_split_s=TimeSplit(
            draft=_r(draft_s),
            verify=_r(verify_s),
            sampling=_r(sample_s),
            other=_r(max(0.0, decode - draft_s - verify_s - sample_s)),
            decode=_r(decode),
            host=_r(host_s),
        ),
        ordinary_token_s=_r(ordinary_token_s),
        draft_token_s=_r(draft_token_s),
        verify_s_by_block={str(m): _r(v) for m, v in sorted(rest_mean.items())},
        theoretical_speedup=_r(bound),
        achieved_fraction=_r(speedup / bound) if bound == bound and bound > 0 else None,
        peak_rss_bytes=max((r.peak_rss_bytes for r in (*ords, *specs)), default=0),
        # the loop's own cost, outside llama_decode: what a faster accelerator cannot
        # shorten (per round: both models; per row: the target side per scored row)
        host_s_per_round=_r(host_s / len(rounds), 9) if rounds else None,
        host_s_per_row=_r((host_s - draft_host_s) / n_rows, 9) if n_rows else None,
        ordinary_host_s_per_token=_r(ord_host_s / ord_gen, 9) if ord_gen else None,
    )


def _r(x: float | None, nd: int = 6) -> float | None:
    if x is None or x != x:
        return None
    return round(float(x), nd)


def auto_vs_best(
    runs: Sequence[RunResult], temp: float, n_boot: int = 4000, seed: int = 0
) -> AutoVsBest | None:
    """`auto` against the best fixed block size at one temperature, paired per prompt and run.

    The best fixed K is the one with the highest median speedup. For every (prompt, run)
    measured under both, the ratio is auto's speedup over the best K's speedup, each
    against the ordinary run measured next to it (so slow drift of the machine cancels);
    the result is the median ratio with a 95% percentile-bootstrap interval. 1.0 means
    auto matched the best fixed K chosen in hindsight.

    Returns:
        The comparison, or None when `runs` lacks auto or every fixed K at `temp`.
    """

    def speedups(k: int | None) -> dict[tuple[str, int], float]:
        out: dict[tuple[str, int], float] = {}
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
    return AutoVsBest(
        temp=temp,
        best_k=best,
        best_speedup=_r(_med(list(per_k[best].values()))),
        auto_speedup=_r(_med(list(auto.values()))),
        ratio=_r(_med(ratios)),
        ratio_ci95=[_r(lo), _r(hi)],
        n_pairs=len(keys),
    )


def auto_vs_best_text(a: AutoVsBest) -> str:
    """One line for the table footers, e.g. 'temp 0: auto / best fixed K (8) = 0.97×
    [0.93, 1.01], the median of 16 paired ratios (auto's speedup / K 8's, same prompt and
    run); not the ratio of the table's median speedups (K 8 1.56×, auto 1.53×)'.
    Both figures are named, as they can differ: a median of ratios is not a ratio of
    medians."""
    lo, hi = a.ratio_ci95
    k = a.best_k
    return (
        f"temp {a.temp:g}: auto / best fixed K ({k}) = {_x(a.ratio)}"
        f" [{_f2(lo)}, {_f2(hi)}], the median of {a.n_pairs} paired ratios (auto's"
        f" speedup / K {k}'s, same prompt and run); not the ratio of the table's median"
        f" speedups (K {k} {_x(a.best_speedup)}, auto {_x(a.auto_speedup)})"
    )


def _f2(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _x(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


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
            entry = ConfigSummary(
                temp=temp,
                draft_max=k_label(k),
                overall=summarize_pairs(pairs, s.n_boot, s.seed),
                by_kind={
                    kind: summarize_pairs(
                        [pr for pr in pairs if pr[0].kind == kind], s.n_boot, s.seed
                    )
                    for kind in kinds
                    if any(pr[0].kind == kind for pr in pairs)
                },
            )
            result.configs.append(entry)
            ov = entry.overall
            if ov.speedup is not None and ov.speedup < 1.0:
                result.warnings.append(
                    f"temp {temp:g}, K {k_label(k)}: speculation is slower than ordinary"
                    f" decoding (speedup {ov.speedup:.2f}x, acceptance"
                    f" {pct(ov.acceptance_rate)})"
                )
            for kind, ks in entry.by_kind.items():
                if ov.speedup is not None and ov.speedup >= 1.0 and (ks.speedup or 0) < 1:
                    result.warnings.append(
                        f"temp {temp:g}, K {k_label(k)}: slower than ordinary decoding on"
                        f" {kind} prompts ({ks.speedup or 0:.3f}x)"
                    )


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"
