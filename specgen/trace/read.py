"""Reading `--trace` files back: typed rounds, prefills and ends per generation
(`read_trace`), and the output tokens they imply (`reconstruct_tokens`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specgen.errors import ConfigError
from specgen.trace.write import SCHEMA, VERSION


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
    sources: tuple[str, ...] = ()  # per drafted token; () in files from before it: "draft"

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
            sources=tuple(str(x) for x in obj.get("sources", ())),
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
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
        cut_allowed = False
    else:
        cut_allowed = True  # no final newline: the last line may be a partial write
    objs: list[dict[str, Any]] = []
    truncated = False
    for i, line in enumerate(lines):
        if not line.strip():  # a blank line (an editor's, a concatenation's) holds nothing
            continue
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if i == len(lines) - 1 and cut_allowed and i > 0:
                truncated = True  # cut mid-write, a character's bytes included
                break
            what = "UTF-8 text" if isinstance(e, UnicodeDecodeError) else "JSON"
            raise ConfigError(f"{path}: line {i + 1} is not {what}: not a specgen trace") from None
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
