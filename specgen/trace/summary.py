"""`specgen trace summarize`: acceptance by block position, most rejected tokens, time
split and lost rounds of a `--trace` file (`summarize` -> `TraceSummary`)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specgen import acceptance_stats
from specgen.trace.read import Generation, TraceFile, TraceRound, read_trace


@dataclass(frozen=True)
class PositionAcceptance:
    """Acceptance at block position i (1-based): of the proposals that were tested there,
    how many were accepted (conditional on reaching i)."""

    position: int
    tested: int
    accepted: int

    @property
    def rate(self) -> float:
        return acceptance_stats.acceptance_rate(self.accepted, self.tested)


@dataclass(frozen=True)
class RejectedToken:
    """A draft token the target rejected, how often, and what was emitted instead
    (`preferred`: (token, text, count), most common first)."""

    token: int
    text: str
    count: int
    preferred: tuple[tuple[int, str, int], ...]


@dataclass(frozen=True)
class LostRound:
    """A round slower than ordinary decoding of the tokens it emitted.

    Attributes:
        round, position, k, n_accepted: from the trace; generation: which one.
        n_emitted: tokens the round emitted.
        round_s: its wall time; ordinary_s: n_emitted x the ordinary pass time.
        lost_s: round_s - ordinary_s (> 0).
    """

    round: int
    position: int
    k: int
    n_accepted: int
    n_emitted: int
    round_s: float
    ordinary_s: float
    lost_s: float
    generation: int = 0


@dataclass(frozen=True)
class TraceSummary:
    """What `specgen trace summarize` shows (data; the CLI renders it).

    Attributes:
        header: the trace header.
        complete: every generation has an end record (the run finished).
        finish_reason: from the last generation's end record, or None.
        n_generations: generations in the file (1 for `run`; several for `bench`).
        n_rounds, n_generated, n_drafted, n_accepted: totals (n_generated from the end
            record, else the reconstructed count; n_drafted counts every proposal, so
            n_accepted / n_drafted is the per-token acceptance rate alpha).
        by_position: acceptance by position in the block.
        rejected: most often rejected draft tokens (up to `top`).
        time_s: seconds by stage: draft, verify, sample, other, total (sums over rounds).
        ordinary_token_s: the ordinary-decoding pass time used for `lost` (each
            generation's measurement at prefill, else the median of the file's K = 0
            rounds; the median over generations is shown), or None.
        baseline_source: "run" (a generation's own baseline at its end, kept current by its
            ordinary rounds), "measured" (only its passes after the prompt), "k0-rounds"
            (the file's K = 0 rounds), several joined by "+", or None.
        lost: the rounds that lost time, worst first (up to `top`); n_lost and lost_s
            count all of them. A round is lost only when it was more than
            ``loss_margin`` slower than ordinary decoding of its tokens.
        loss_margin: that margin, a fraction of the ordinary time (see `loss_margin`).
        by_source: {proposer: (proposed, accepted)}: "draft" (the draft model), "lookup"
            (prompt lookup), "prediction" (lookup in a predicted output), "grammar" (tokens
            the grammar forced), counted as n_drafted
            and n_accepted are; only proposers with a proposal.
    """

    header: dict[str, Any]
    complete: bool
    finish_reason: str | None
    n_generations: int
    n_rounds: int
    n_generated: int
    n_drafted: int
    n_accepted: int
    by_position: tuple[PositionAcceptance, ...]
    rejected: tuple[RejectedToken, ...]
    time_s: dict[str, float]
    ordinary_token_s: float | None
    baseline_source: str | None
    lost: tuple[LostRound, ...]
    n_lost: int
    lost_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    loss_margin: float = 0.0
    by_source: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        return acceptance_stats.acceptance_rate(self.n_accepted, self.n_drafted)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for `trace summarize --json`)."""
        return {
            "header": self.header,
            "complete": self.complete,
            "finish_reason": self.finish_reason,
            "n_generations": self.n_generations,
            "n_rounds": self.n_rounds,
            "n_generated": self.n_generated,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "acceptance_rate": round(self.acceptance_rate, 6),
            "by_source": {
                src: {"proposed": n, "accepted": a} for src, (n, a) in self.by_source.items()
            },
            "by_position": [
                {
                    "position": p.position,
                    "tested": p.tested,
                    "accepted": p.accepted,
                    "rate": round(p.rate, 6),
                }
                for p in self.by_position
            ],
            "rejected": [
                {
                    "token": r.token,
                    "text": r.text,
                    "count": r.count,
                    "preferred": [{"token": t, "text": s, "count": c} for t, s, c in r.preferred],
                }
                for r in self.rejected
            ],
            "time_s": {k: round(v, 6) for k, v in self.time_s.items()},
            "ordinary_token_s": self.ordinary_token_s,
            "baseline_source": self.baseline_source,
            "loss_margin": round(self.loss_margin, 4),
            "n_lost": self.n_lost,
            "lost_s": round(self.lost_s, 6),
            "lost": [asdict(r) for r in self.lost],
            "notes": list(self.notes),
        }


def _emitted_counts(gen: Generation) -> list[int]:
    """Tokens emitted by each round of a generation (its last rounds may be cut by
    n_generated)."""
    left = gen.end.n_generated if gen.end is not None else None
    counts = []
    for r in gen.rounds:
        n = r.n_accepted + (r.next_token is not None)  # none after a probe's accept
        if left is not None:
            n = max(0, min(n, left))
            left -= n
        counts.append(n)
    return counts


def summarize(path: Path | str, top: int = 10) -> TraceSummary:
    """Read a trace and summarize it: acceptance by block position, the tokens most often
    rejected and what replaced them, the time split, and the rounds where speculation
    lost time against ordinary decoding.

    Raises:
        ConfigError, OSError: as `read_trace`.
    """
    tf = read_trace(path)
    rounds = tf.rounds
    emitted_by_gen = [_emitted_counts(g) for g in tf.generations]
    lost, baselines = lost_rounds(tf.generations, emitted_by_gen)
    used = [b for per_source in baselines.values() for b in per_source]
    complete = bool(tf.generations) and all(g.end is not None for g in tf.generations)
    return TraceSummary(
        header=tf.header,
        complete=complete,
        finish_reason=tf.end.finish_reason if tf.end is not None else None,
        n_generations=len(tf.generations),
        n_rounds=len(rounds),
        n_generated=sum(sum(e) for e in emitted_by_gen),
        n_drafted=sum(len(r.drafted) for r in rounds),
        n_accepted=sum(r.n_accepted for r in rounds),
        by_position=acceptance_by_position(rounds),
        rejected=rejected_tokens(rounds, top),
        time_s=time_split(rounds),
        ordinary_token_s=statistics.median(used) if used else None,
        baseline_source="+".join(sorted(set(baselines))) or None,
        lost=tuple(lost[:top]),
        n_lost=len(lost),
        lost_s=sum(x.lost_s for x in lost),
        notes=_notes(tf, complete, bool(baselines)),
        loss_margin=loss_margin([r.round_s for r in rounds if r.k == 0]),
        by_source=by_source(rounds),
    )


def by_source(rounds: list[TraceRound]) -> dict[str, tuple[int, int]]:
    """{proposer: (proposed, accepted)} over every round's drafted tokens, in the order
    draft, lookup, prediction, grammar (a round without ``sources`` is all "draft")."""
    counts: dict[str, list[int]] = {}
    for r in rounds:
        for i in range(len(r.drafted)):
            src = r.sources[i] if i < len(r.sources) else "draft"
            c = counts.setdefault(src, [0, 0])
            c[0] += 1
            c[1] += i < r.n_accepted
    order = {"draft": 0, "lookup": 1, "prediction": 2, "grammar": 3}
    return {s: (c[0], c[1]) for s, c in sorted(counts.items(), key=lambda x: order.get(x[0], 4))}


def acceptance_by_position(rounds: list[TraceRound]) -> tuple[PositionAcceptance, ...]:
    """The table of acceptance at each block position i (1-based), over the tested
    proposals (a position is reached only after all before it were accepted), up to the
    deepest position tested (`specgen.acceptance_stats.position_counts`; a round's
    ``accepted`` holds its tested proposals)."""
    depth = max((len(r.accepted) for r in rounds), default=0)
    tested, accepted = acceptance_stats.position_counts(
        ((len(r.accepted), r.n_accepted) for r in rounds), depth
    )
    return tuple(
        PositionAcceptance(i + 1, t, a)
        for i, (t, a) in enumerate(zip(tested, accepted, strict=True))
        if t
    )


def rejected_tokens(rounds: list[TraceRound], top: int) -> tuple[RejectedToken, ...]:
    """The table of the `top` proposals most often rejected, each with the 3 tokens drawn
    most often in its place."""
    rejected: Counter[int] = Counter()
    preferred: dict[int, Counter[int]] = defaultdict(Counter)
    text: dict[int, str] = {}
    for r in rounds:
        if r.n_accepted < len(r.accepted) and r.next_token is not None:
            x = r.drafted[r.n_accepted]
            rejected[x] += 1
            preferred[x][r.next_token] += 1
            if r.drafted_text is not None:
                text[x] = r.drafted_text[r.n_accepted]
            if r.next_text is not None:
                text[r.next_token] = r.next_text
    return tuple(
        RejectedToken(
            x,
            text.get(x, ""),
            c,
            tuple((t, text.get(t, ""), n) for t, n in preferred[x].most_common(3)),
        )
        for x, c in rejected.most_common(top)
    )


def time_split(rounds: list[TraceRound]) -> dict[str, float]:
    """Seconds in draft, verify, sample, other and in total, over all rounds."""
    time_s = {
        "draft": sum(r.draft_s for r in rounds),
        "verify": sum(r.verify_s for r in rounds),
        "sample": sum(r.sample_s for r in rounds),
        "total": sum(r.round_s for r in rounds),
    }
    time_s["other"] = max(
        0.0, time_s["total"] - time_s["draft"] - time_s["verify"] - time_s["sample"]
    )
    return time_s


def lost_rounds(
    generations: list[Generation], emitted_by_gen: list[list[int]]
) -> tuple[list[LostRound], dict[str, list[float]]]:
    """The table of rounds slower than ordinary decoding of the tokens they emitted, the
    worst first, and the baselines used ({source: seconds per token, one per generation};
    empty when the trace has no ordinary-pass timing).

    Each generation is judged against its own baseline at its end ("run"), else its
    measurement at prefill ("measured"), else the median of the file's K = 0 rounds
    ("k0-rounds")."""
    k0 = [r.round_s for g in generations for r in g.rounds if r.k == 0]
    k0_median = statistics.median(k0) if k0 else None
    baselines: dict[str, list[float]] = defaultdict(list)
    lost: list[LostRound] = []
    margin = loss_margin(k0)
    for gen, emitted in zip(generations, emitted_by_gen, strict=True):
        # the run's own baseline at its end (the passes after the prompt, then its K = 0
        # rounds: `specgen.measure.Baseline`), as the summary and --json show it
        at_end = gen.end.stats.get("ordinary_token_s") if gen.end is not None else None
        measured = at_end or (gen.prefill.ordinary_token_s if gen.prefill is not None else None)
        baseline = measured if measured else k0_median
        if baseline is None:
            continue
        baselines["run" if at_end else "measured" if measured else "k0-rounds"].append(baseline)
        for r, n_em in zip(gen.rounds, emitted, strict=True):
            ordinary_s = n_em * baseline
            if r.k == 0 or n_em == 0 or r.round_s <= ordinary_s * (1.0 + margin):
                continue  # within the timing noise of an ordinary pass: not a loss
            lost.append(
                LostRound(
                    r.round, r.position, r.k, r.n_accepted, n_em, r.round_s, ordinary_s,
                    r.round_s - ordinary_s, gen.index,
                )
            )  # fmt: skip
    lost.sort(key=lambda x: -x.lost_s)
    return lost, baselines


def _notes(tf: TraceFile, complete: bool, timed: bool) -> tuple[str, ...]:
    notes = []
    if not timed and tf.rounds:
        notes.append("no ordinary-pass timing in the trace: lost rounds not computed")
    if not complete:
        notes.append("the trace has no end record: the run was interrupted or is still going")
    if tf.truncated_line:
        notes.append("the last line was cut off mid-write and was ignored")
    return tuple(notes)


#: a round must be this much slower (relative) than ordinary decoding of its tokens to
#: count as a loss, when the trace has too few ordinary rounds to measure its own noise
LOSS_MARGIN_DEFAULT = 0.10
#: the smallest margin, however steady the ordinary rounds were
LOSS_MARGIN_MIN = 0.05
#: K = 0 rounds needed to measure the noise from the trace itself
_NOISE_ROUNDS = 5


def loss_margin(k0_round_s: Sequence[float]) -> float:
    """How much slower than ordinary decoding (a fraction of it) a round must be to be
    called a loss: the timing noise of one ordinary pass, so that a round 0.019 ms slower
    than a 25 ms pass is a tie, not a loss.

    Measured from the trace's own K = 0 rounds (seconds, one pass each) as the 90th
    percentile over the median, minus 1 (on this project's shared 2-core machine about
    0.18 for the demo target), at least ``LOSS_MARGIN_MIN``; ``LOSS_MARGIN_DEFAULT`` with
    fewer than 5 of them.
    """
    if len(k0_round_s) < _NOISE_ROUNDS:
        return LOSS_MARGIN_DEFAULT
    median = statistics.median(k0_round_s)
    if median <= 0:
        return LOSS_MARGIN_DEFAULT
    p90 = statistics.quantiles(k0_round_s, n=10)[-1]
    return max(LOSS_MARGIN_MIN, p90 / median - 1.0)
