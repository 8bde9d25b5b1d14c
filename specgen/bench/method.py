"""The measurement of `specgen bench` (the method is described in `specgen.bench`): one
generation reduced to rounds (`measure`), loading the models and building the record
(`bench`), the alternating ordinary/speculative runs (`run_bench`), and the CPU-load check
that flags a busy machine. Every generation goes through the public API
(`specgen.Pair.stream`, ``ordinary=True`` for the baseline), as `specgen run`'s does.

specgen.session and the API (and with them llama.cpp) are imported only for their types and
where the runs start: the bench package is imported by ui/reports for its result types,
without a model."""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from specgen.bench.prompts import BenchPrompt, k_label
from specgen.bench.record import build_record
from specgen.bench.results import (
    ORDINARY,
    SPECULATIVE,
    BenchResult,
    BenchSettings,
    Progress,
    Round,
    RunResult,
)
from specgen.bench.summary import summarize
from specgen.engine import Drafter
from specgen.errors import ConfigError
from specgen.events import Done, Prefilled, Step
from specgen.models.resolve import DRAFT_NONE

if TYPE_CHECKING:
    from collections.abc import Iterable

    from specgen.chat import TemplateModel
    from specgen.session import Session

# -- one generation -----------------------------------------------------------------------


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, bytes (ru_maxrss: KiB on Linux,
    bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


# Called with (run info, event) for every event of every measured generation: the seam for
# `--trace` (open a writer on Prefilled, write each Step, close it on Done).
EventHook = Callable[[dict[str, Any], Prefilled | Step | Done], None]


def measure(
    events: Iterable[Prefilled | Step | Done],
    on_event: Callable[[Prefilled | Step | Done], None] | None = None,
) -> tuple[list[Round], Done, Prefilled]:
    """Run one generation (`specgen.Pair.stream`'s events) and reduce them to rounds."""
    rounds: list[Round] = []
    done: Done | None = None
    pre: Prefilled | None = None
    for ev in events:
        if on_event is not None:
            on_event(ev)
        if isinstance(ev, Step):
            rounds.append(Round.of(ev))
        elif isinstance(ev, Done):
            done = ev
        elif isinstance(ev, Prefilled):
            pre = ev
    assert done is not None and pre is not None
    return rounds, done, pre


# -- the benchmark --------------------------------------------------------------------------


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C during the measurement. Still a KeyboardInterrupt (exit 130 when not
    handled); `result` holds the generations finished before it, summarized, its first
    warning saying the figures are incomplete (`record` is filled by `bench`)."""

    def __init__(self, result: BenchResult) -> None:
        super().__init__()
        self.result = result


def check_draft(draft: str | None) -> None:
    """Refuse ``--draft none`` before anything is loaded: a benchmark compares ordinary with
    speculative decoding.

    Raises:
        ConfigError: `draft` is ``none``.
    """
    if draft == DRAFT_NONE:
        raise ConfigError(
            "bench compares ordinary with speculative decoding: give a draft model or"
            " 'ngram', not 'none'"
        )


def bench(
    opened: Session,
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    progress: Callable[[Progress], None] | None = None,
    on_event: EventHook | None = None,
    status: Callable[[str], None] | None = None,
) -> BenchResult:
    """Build the record of an open pair (`specgen.session.open`), run `run_bench` on it.
    The caller keeps (and closes) the session.

    Raises:
        ConfigError: no drafter (``--draft none``: nothing to compare with).
    """
    spec = opened.spec
    check_draft(opened.draft_name)
    assert opened.drafter is not None
    busy0 = cpu_snapshot()
    if status is not None:
        status("hashing model files")
    record = build_record(
        spec.target, spec.draft, spec.target_cfg, spec.draft_cfg, settings, prompts,
        n_ctx=opened.target.n_ctx, draft_p_min=opened.flags.draft_p_min,
    )  # fmt: skip
    record["load_s"] = round(opened.load_s, 3)
    # where the layers went: --rpc servers, and the devices each model could use
    record["rpc"] = list(spec.rpc)
    record["target"]["devices"] = list(opened.target.devices)
    draft = opened.draft_engine
    record["draft"]["devices"] = list(draft.devices) if draft is not None else []
    try:
        result = run_bench(opened.target, opened.drafter, prompts, settings, progress, on_event)
    except BenchInterrupted as e:
        e.result.record = record
        raise
    result.warnings.extend(opened.warnings)  # a draft larger than its target
    others = other_cpu_load(busy0, cpu_snapshot())
    record["other_cpu_load"] = None if others is None else round(others, 3)
    result.record = record
    usable = record["machine"]["cpus_usable"]
    if others is not None and others > 0.1 * usable:
        result.warnings.insert(
            0,
            f"other processes kept {others:.1f} of {usable} CPUs busy during the measurement:"
            " the figures are distorted; rerun on a quiet machine"
            + (" (a ggml-rpc-server on this machine counts as one)" if record["rpc"] else ""),
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


def run_bench(
    target: TemplateModel,
    drafter: Drafter,
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    progress: Callable[[Progress], None] | None = None,
    on_event: EventHook | None = None,
) -> BenchResult:
    """Measure every configuration on every prompt, alternating ordinary and speculative
    decoding with the same seed (see the module docstring).

    Args:
        target, drafter: open models, driven through `specgen.Pair.of` (each generation
            drafts under its own temperature: `specgen.engine.under`); the caller keeps
            (and closes) them.
        on_event: called with (run info, event) for every Prefilled, Step and Done of the
            measured generations, not the warm-up (with `settings.trace`, each Step
            carries its RoundTrace): the seam for `--trace`.

    Raises:
        ConfigError: a prompt plus `n_tokens` and the block does not fit in the context.
        PromptError, EngineError: from the loop.
        BenchInterrupted: Ctrl-C; it carries what was measured until then.
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
    # start-up time: the API loads llama.cpp; the bench package is imported without a model
    from specgen import Pair

    pair = Pair.of(target, drafter, k_init=settings.k_init)
    total = settings.total_generations(len(prompts))
    done = 0

    def tick(desc: str) -> None:
        if progress is not None:
            progress(Progress(done, total, desc))

    def one(mode, temp, k, prompt_i, run, seed, warm=False) -> RunResult:
        flags = replace(settings.flags(temp, seed), draft_max=k_label(k))
        if warm:
            flags = replace(flags, max_tokens=min(settings.n_tokens, 16))
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
        # as `specgen run` does (its baseline for the controller timed after the prompt);
        # the ordinary runs with the target alone
        gen = pair.stream(ids[prompt_i], flags, trace=settings.trace, ordinary=mode == ORDINARY)
        rounds, d, pre = measure(gen, hook)
        s = d.stats
        return RunResult(
            mode=mode, temp=temp, draft_max=k, prompt_id=p.id, kind=p.kind, run=run,
            seed=seed, stats=s, rounds=rounds, n_generated=s.n_generated,
            prefill_s=s.prefill_s, decode_s=s.decode_s, ttft_s=s.ttft_s,
            peak_rss_bytes=peak_rss_bytes(),
        )  # fmt: skip

    if settings.warmup:
        for mode in (ORDINARY, SPECULATIVE):
            tick(f"warm-up ({mode})")
            one(mode, settings.temps[0], settings.draft_max[0], 0, -1, settings.seed, warm=True)
            done += 1
    results: list[RunResult] = []
    try:
        # every configuration is measured on each prompt before the next prompt, so slow
        # drift of a shared machine affects all of them alike (comparisons across K stay fair)
        for temp in settings.temps:
            for run in range(settings.runs):
                for i, p in enumerate(prompts):
                    seed = settings.seed + 1000 * run + i
                    for k in settings.draft_max:
                        for mode in (ORDINARY, SPECULATIVE):
                            tick(f"temp {temp:g} K {k_label(k)} · {p.id} · {mode}")
                            results.append(one(mode, temp, k, i, run, seed))
                            done += 1
    except KeyboardInterrupt:
        # only whole generations count (an ordinary run without its speculative partner is
        # left out of every figure by the pairing)
        partial = BenchResult(settings=settings, prompts=list(prompts), runs=results)
        summarize(partial)
        n_warm = 2 if settings.warmup else 0
        # the progress counter counts the warm-ups too: say so, or "[16/50]" on screen
        # reads as a different count from "14 of 48" here
        warm = f" (after {n_warm} warm-up generations)" if n_warm else ""
        partial.warnings.insert(
            0,
            f"interrupted (Ctrl-C) after {len(results)} of {total - n_warm} measured"
            f" generations{warm}: incomplete figures, from the configurations measured so far",
        )
        raise BenchInterrupted(partial) from None
    tick("done")
    result = BenchResult(settings=settings, prompts=list(prompts), runs=results)
    summarize(result)
    return result
