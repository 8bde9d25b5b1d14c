"""`--trace FILE.jsonl`: one JSON object per round, and `summarize` over such a file.

Schema ``specgen.trace`` version 1 (documented in the README). One object per line, each
with a ``type``:

- ``header`` (first line): ``schema``, ``version``, ``command``, ``target``, ``draft``,
  ``sampling`` {temp, top_k, top_p, min_p}, ``seed``, ``max_tokens``, ``created`` (UTC ISO
  8601) and any extra keys the command adds.
- ``generation`` (optional; `TraceWriter.begin`): ``generation`` (0-based index) and the
  settings of the generation that follows when a file holds several (``bench --trace``):
  ``sampling``, ``seed``, ``k`` and any extra keys.
- ``prefill``: ``generation``, ``n_prompt``, ``prefill_s``, ``ordinary_token_s`` (median
  single-token target pass, or null). Starts a new generation unless ``begin`` just did.
- ``round``: ``generation``, ``round`` (0-based within the generation), ``position``
  (committed tokens before the round), ``k``, ``drafted`` [ids], ``drafted_text``, ``q_x``,
  ``p_x`` (q_i(x_i), p_i(x_i); one-hot 1/0 values when greedy), ``u`` (the uniforms of the
  test u_i < p_i(x_i)/q_i(x_i); empty when greedy), ``accepted`` [bool per tested proposal,
  stopping at the first rejection], ``n_accepted``, ``next_token``, ``next_text``,
  ``next_kind`` ("residual", "bonus", "ordinary", or "none": a probe scored no bonus
  position and all its proposals were accepted, ``next_token`` is null), ``top``
  [{token, text, p}: the target's 3 most likely tokens where ``next_token`` was drawn,
  i.e. at the rejection point, empty for "none"; when greedy, p is the softmax at
  temperature 1], ``emitted_text``, ``draft_s``,
  ``verify_s``, ``sample_s``, ``round_s``, ``target_cache``, ``draft_cache``.
- ``end`` (last line of a finished generation): ``generation``, ``finish_reason``,
  ``n_generated``, ``stats``.

The output tokens of a generation are, round by round, ``drafted[:n_accepted] +
[next_token]`` (without a null ``next_token``), concatenated and cut to ``n_generated``
(nothing after an end-of-generation token, a stop string or -n is emitted):
`reconstruct_tokens` does it.

Files are streamed: each object is written as one complete line and flushed, so an
interrupted run (Ctrl-C, a crash) leaves a valid prefix with no ``end`` line, which
`summarize` reports as incomplete.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from specgen.errors import ConfigError
from specgen.events import Done, Prefilled, Step
from specgen.sampling import SamplingParams

SCHEMA = "specgen.trace"
VERSION = 1

TokenText = Callable[[int], str]


def _r(x: float) -> float:
    return round(float(x), 9)


def _sampling(params: SamplingParams) -> dict[str, Any]:
    return {
        "temp": params.temp,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
    }


class TraceWriter:
    """Writes a trace file as the run goes (see the module docstring for the schema).

    Args:
        path: destination (``-`` is not supported; the file is created or replaced).
        target, draft: model names for the header.
        params: sampling settings.
        seed: the seed used (None when random and unknown).
        max_tokens: -n.
        command: "run" or "bench".
        token_text: token id -> text, for the ``*_text`` fields (omitted when None).
        extra: more header keys (e.g. the bench prompt name).

    Raises:
        OSError: the file cannot be created.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        target: str,
        draft: str,
        params: SamplingParams,
        seed: int | None = None,
        max_tokens: int | None = None,
        command: str = "run",
        token_text: TokenText | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self._text = token_text
        self._greedy = params.greedy
        self._round = 0
        self._gen = -1
        self._begun = False
        self._f: IO[str] | None = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        header: dict[str, Any] = {
            "type": "header",
            "schema": SCHEMA,
            "version": VERSION,
            "command": command,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "target": target,
            "draft": draft,
            "sampling": _sampling(params),
            "seed": seed,
            "max_tokens": max_tokens,
        }
        header.update(extra or {})
        self._line(header)

    def _line(self, obj: dict[str, Any]) -> None:
        if self._f is None:
            raise ValueError("trace writer is closed")
        # one write per complete line, then flush: the file is always a valid prefix
        self._f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self._f.flush()

    def set_token_text(self, token_text: TokenText | None) -> None:
        """Set how token ids become text for the ``*_text`` fields (models open later)."""
        self._text = token_text

    def begin(
        self,
        params: SamplingParams | None = None,
        seed: int | None = None,
        k: int | str | None = None,
        **extra: Any,
    ) -> None:
        """Start a new generation with its own settings (for files holding several, such as
        ``bench --trace``); without it each Prefilled event starts one implicitly."""
        self._gen += 1
        self._round = 0
        self._begun = True
        obj: dict[str, Any] = {"type": "generation", "generation": self._gen}
        if params is not None:
            self._greedy = params.greedy
            obj["sampling"] = _sampling(params)
        obj.update({"seed": seed, "k": k, **extra})
        self._line(obj)

    def write(self, event: object) -> None:
        """Record one loop event (Prefilled, Step, Done); others are ignored.

        Raises:
            ValueError: a Step without a RoundTrace (generate with ``trace=True``).
        """
        if isinstance(event, Step):
            self.step(event)
        elif isinstance(event, Prefilled):
            if not self._begun:
                self._gen += 1
                self._round = 0
            self._begun = False
            self._line(
                {
                    "type": "prefill",
                    "generation": self._gen,
                    "n_prompt": event.n_prompt,
                    "prefill_s": _r(event.prefill_s),
                    "ordinary_token_s": None
                    if event.ordinary_token_s is None
                    else _r(event.ordinary_token_s),
                }
            )
        elif isinstance(event, Done):
            self._line(
                {
                    "type": "end",
                    "generation": max(self._gen, 0),
                    "finish_reason": event.finish_reason,
                    "n_generated": len(event.tokens),
                    "stats": event.stats.to_dict(),
                }
            )

    def step(self, step: Step) -> None:
        """Record one round (`step.trace` must be set)."""
        tr = step.trace
        if tr is None:
            raise ValueError("Step has no RoundTrace: run generate with trace=True")
        obj: dict[str, Any] = {
            "type": "round",
            "generation": max(self._gen, 0),
            "round": self._round,
            "position": tr.position,
            "k": step.k,
            "drafted": list(tr.drafted),
            "q_x": [_r(v) for v in tr.q_x],
            "p_x": [_r(v) for v in tr.p_x],
            # greedy acceptance compares with the argmax: the loop's uniforms are unused
            "u": [] if self._greedy else [_r(v) for v in tr.u],
            "accepted": list(tr.accepted),
            "n_accepted": sum(tr.accepted),
            "next_token": tr.next_token,
            "next_kind": tr.next_kind,
            "top": [{"token": t, "p": _r(p)} for t, p in tr.top],
            "emitted_text": step.text,
            "draft_s": _r(step.draft_s),
            "verify_s": _r(step.verify_s),
            "sample_s": _r(step.sample_s),
            "round_s": _r(step.round_s),
            "target_cache": tr.target_cache,
            "draft_cache": tr.draft_cache,
        }
        if self._text is not None:
            obj["drafted_text"] = [self._text(t) for t in tr.drafted]
            if tr.next_token is not None:
                obj["next_text"] = self._text(tr.next_token)
            for entry in obj["top"]:
                entry["text"] = self._text(entry["token"])
        self._round += 1
        self._line(obj)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def token_text_of(engine: Any) -> TokenText:
    """token id -> its text (UTF-8, invalid bytes replaced) for an Engine's vocabulary."""
    return lambda t: engine.token_bytes(t).decode("utf-8", "replace")


def tee(events: Iterator[Any], writer: TraceWriter) -> Iterator[Any]:
    """Pass `generate`'s events through, writing each to `writer` first. Closing this
    generator closes `events` (so the loop restores its caches)."""
    try:
        for ev in events:
            writer.write(ev)
            yield ev
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


# -- reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TopToken:
    """One of the target's most likely tokens where a round's `next_token` was drawn."""

    token: int
    p: float
    text: str | None = None


@dataclass(frozen=True)
class TraceRound:
    """One ``round`` record (see the module docstring for each field's meaning);
    ``drafted_text`` and ``next_text`` are None when the file has no vocabulary text."""

    generation: int
    round: int
    position: int
    k: int
    drafted: tuple[int, ...]
    q_x: tuple[float, ...]
    p_x: tuple[float, ...]
    u: tuple[float, ...]
    accepted: tuple[bool, ...]
    n_accepted: int
    next_token: int | None
    next_kind: str
    top: tuple[TopToken, ...]
    emitted_text: str
    draft_s: float
    verify_s: float
    sample_s: float
    round_s: float
    target_cache: int
    draft_cache: int
    drafted_text: tuple[str, ...] | None = None
    next_text: str | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TraceRound:
        """Raises KeyError, TypeError or ValueError for a malformed record."""
        nxt = obj["next_token"]
        texts = obj.get("drafted_text")
        return cls(
            generation=int(obj.get("generation", 0)),
            round=int(obj["round"]),
            position=int(obj["position"]),
            k=int(obj["k"]),
            drafted=tuple(int(x) for x in obj["drafted"]),
            q_x=tuple(float(x) for x in obj["q_x"]),
            p_x=tuple(float(x) for x in obj["p_x"]),
            u=tuple(float(x) for x in obj["u"]),
            accepted=tuple(bool(x) for x in obj["accepted"]),
            n_accepted=int(obj["n_accepted"]),
            next_token=None if nxt is None else int(nxt),
            next_kind=str(obj["next_kind"]),
            top=tuple(TopToken(int(t["token"]), float(t["p"]), t.get("text")) for t in obj["top"]),
            emitted_text=str(obj["emitted_text"]),
            draft_s=float(obj["draft_s"]),
            verify_s=float(obj["verify_s"]),
            sample_s=float(obj["sample_s"]),
            round_s=float(obj["round_s"]),
            target_cache=int(obj["target_cache"]),
            draft_cache=int(obj["draft_cache"]),
            drafted_text=None if texts is None else tuple(str(t) for t in texts),
            next_text=obj.get("next_text"),
        )


@dataclass(frozen=True)
class TracePrefill:
    """A ``prefill`` record: prompt tokens, seconds, and the ordinary pass time (or None)."""

    n_prompt: int
    prefill_s: float
    ordinary_token_s: float | None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TracePrefill:
        o = obj.get("ordinary_token_s")
        return cls(int(obj["n_prompt"]), float(obj["prefill_s"]), None if o is None else float(o))


@dataclass(frozen=True)
class TraceEnd:
    """An ``end`` record: why the generation ended, its tokens, its `Stats.to_dict`."""

    finish_reason: str
    n_generated: int
    stats: dict[str, Any]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TraceEnd:
        return cls(str(obj["finish_reason"]), int(obj["n_generated"]), dict(obj.get("stats", {})))


@dataclass(frozen=True)
class Generation:
    """One generation in a trace.

    Attributes:
        index: its ``generation`` number.
        meta: the ``generation`` object that announced it (its settings, with any extra
            keys the command added), or None.
        prefill: its prefill record, or None.
        rounds: its rounds, in order.
        end: its end record, or None when it did not finish.
    """

    index: int
    meta: dict[str, Any] | None
    prefill: TracePrefill | None
    rounds: list[TraceRound]
    end: TraceEnd | None


@dataclass(frozen=True)
class TraceFile:
    """A parsed trace.

    Attributes:
        header: the header object (open: commands add their own keys).
        generations: in file order (one for `run --trace`).
        truncated_line: True when the last line was cut mid-write (ignored).
    """

    header: dict[str, Any]
    generations: list[Generation]
    truncated_line: bool = False

    @property
    def rounds(self) -> list[TraceRound]:
        """Every round, in order."""
        return [r for g in self.generations for r in g.rounds]

    @property
    def end(self) -> TraceEnd | None:
        """The end record of the last generation (None if it did not finish)."""
        return self.generations[-1].end if self.generations else None


def read_trace(path: Path | str) -> TraceFile:
    """Parse a trace file.

    Raises:
        ConfigError: not a specgen trace, a newer schema version, or a malformed line
            (other than a cut-off last line).
        OSError: the file cannot be read.
    """
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
        cut_allowed = False
    else:
        cut_allowed = True  # no final newline: the last line may be a partial write
    objs: list[dict[str, Any]] = []
    truncated = False
    for i, line in enumerate(lines):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1 and cut_allowed and i > 0:
                truncated = True
                break
            raise ConfigError(f"{path}: line {i + 1} is not JSON: not a specgen trace") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"{path}: line {i + 1} is not a JSON object")
        objs.append(obj)
    if not objs or objs[0].get("schema") != SCHEMA:
        raise ConfigError(f"{path}: not a specgen trace (no '{SCHEMA}' header on line 1)")
    version = objs[0].get("version")
    if not isinstance(version, int) or version > VERSION:
        raise ConfigError(
            f"{path}: trace schema version {version} is newer than this specgen reads"
            f" ({VERSION}): upgrade specgen"
        )
    gens: dict[int, Generation] = {}
    for line_no, obj in enumerate(objs[1:], start=2):
        kind = obj.get("type")
        if kind not in ("generation", "prefill", "round", "end"):
            continue  # unknown record types from a later minor addition are skipped
        try:
            g = int(obj.get("generation", 0))
            gen = gens.setdefault(g, Generation(g, None, None, [], None))
            if kind == "generation":
                gens[g] = replace(gen, meta=obj)
            elif kind == "prefill":
                gens[g] = replace(gen, prefill=TracePrefill.from_json(obj))
            elif kind == "end":
                gens[g] = replace(gen, end=TraceEnd.from_json(obj))
            else:
                gen.rounds.append(TraceRound.from_json(obj))
        except KeyError as e:
            raise ConfigError(f"{path}: line {line_no}: the {kind} record has no {e}") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"{path}: line {line_no}: malformed {kind} record: {e}") from None
    return TraceFile(objs[0], list(gens.values()), truncated)


def reconstruct_tokens(trace: TraceFile, generation: int = 0) -> list[int]:
    """The emitted token ids of one generation (the i-th in the file): per round
    drafted[:n_accepted] + [next_token], cut to its end record's n_generated (uncut when it
    has no end record)."""
    gen = trace.generations[generation]
    out: list[int] = []
    for r in gen.rounds:
        out += r.drafted[: r.n_accepted]
        if r.next_token is not None:
            out.append(r.next_token)
    if gen.end is not None:
        del out[gen.end.n_generated :]
    return out


# -- summary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PositionAcceptance:
    """Acceptance at block position i (1-based): of the proposals that were tested there,
    how many were accepted (conditional on reaching i)."""

    position: int
    tested: int
    accepted: int

    @property
    def rate(self) -> float:
        return self.accepted / self.tested if self.tested else 0.0


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
        baseline_source: "measured", "k0-rounds", both joined by "+", or None.
        lost: the rounds that lost time, worst first (up to `top`); n_lost and lost_s
            count all of them. A round is lost only when it was more than
            ``loss_margin`` slower than ordinary decoding of its tokens.
        loss_margin: that margin, a fraction of the ordinary time (see `loss_margin`).
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

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

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
    notes: list[str] = []

    tested: Counter[int] = Counter()
    acc: Counter[int] = Counter()
    rejected: Counter[int] = Counter()
    preferred: dict[int, Counter[int]] = defaultdict(Counter)
    text: dict[int, str] = {}
    n_drafted = n_accepted = 0
    for r in rounds:
        for i, ok in enumerate(r.accepted):
            tested[i + 1] += 1
            acc[i + 1] += ok
        n_drafted += len(r.drafted)
        n_accepted += r.n_accepted
        if r.n_accepted < len(r.accepted) and r.next_token is not None:
            x = r.drafted[r.n_accepted]
            rejected[x] += 1
            preferred[x][r.next_token] += 1
            if r.drafted_text is not None:
                text[x] = r.drafted_text[r.n_accepted]
            if r.next_text is not None:
                text[r.next_token] = r.next_text
    by_position = tuple(PositionAcceptance(i, tested[i], acc[i]) for i in sorted(tested))
    worst = tuple(
        RejectedToken(
            x,
            text.get(x, ""),
            c,
            tuple((t, text.get(t, ""), n) for t, n in preferred[x].most_common(3)),
        )
        for x, c in rejected.most_common(top)
    )

    time_s = {
        "draft": sum(r.draft_s for r in rounds),
        "verify": sum(r.verify_s for r in rounds),
        "sample": sum(r.sample_s for r in rounds),
        "total": sum(r.round_s for r in rounds),
    }
    time_s["other"] = max(
        0.0, time_s["total"] - time_s["draft"] - time_s["verify"] - time_s["sample"]
    )

    # the ordinary-decoding time per token each generation is judged against: its own
    # measurement at prefill, else the median of the file's K = 0 rounds
    k0 = [r.round_s for r in rounds if r.k == 0]
    k0_median = statistics.median(k0) if k0 else None
    used: list[float] = []
    sources: set[str] = set()
    lost: list[LostRound] = []
    margin = loss_margin(k0)
    for gen, emitted in zip(tf.generations, emitted_by_gen, strict=True):
        measured = gen.prefill.ordinary_token_s if gen.prefill is not None else None
        baseline = measured if measured else k0_median
        if baseline is None:
            continue
        used.append(baseline)
        sources.add("measured" if measured else "k0-rounds")
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
    if not used and rounds:
        notes.append("no ordinary-pass timing in the trace: lost rounds not computed")
    lost.sort(key=lambda x: -x.lost_s)
    complete = bool(tf.generations) and all(g.end is not None for g in tf.generations)
    if not complete:
        notes.append("the trace has no end record: the run was interrupted or is still going")
    if tf.truncated_line:
        notes.append("the last line was cut off mid-write and was ignored")
    return TraceSummary(
        header=tf.header,
        complete=complete,
        finish_reason=tf.end.finish_reason if tf.end is not None else None,
        n_generations=len(tf.generations),
        n_rounds=len(rounds),
        n_generated=sum(sum(e) for e in emitted_by_gen),
        n_drafted=n_drafted,
        n_accepted=n_accepted,
        by_position=by_position,
        rejected=worst,
        time_s=time_s,
        ordinary_token_s=statistics.median(used) if used else None,
        baseline_source="+".join(sorted(sources)) or None,
        lost=tuple(lost[:top]),
        n_lost=len(lost),
        lost_s=sum(x.lost_s for x in lost),
        notes=tuple(notes),
        loss_margin=margin,
    )


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
