"""Writing `--trace` files: `TraceWriter` (one JSON line per event, flushed) and `tee`
(pass the loop's events through a writer). The schema is in `specgen.trace`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from specgen.events import Done, Prefilled, Step
from specgen.generation import relay
from specgen.sampling import SamplingParams

SCHEMA = "specgen.trace"
VERSION = 1

TokenText = Callable[[int], str]


def _r(x: float) -> float:
    return round(float(x), 9)


def _sampling(params: SamplingParams) -> dict[str, Any]:
    out: dict[str, Any] = {
        "temp": params.temp,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
    }
    c = params.constraints
    if c.active:  # the rows' probabilities (p_x, q_x, top) are those of the processed logits
        out |= {
            "logit_bias": [[t, b] for t, b in c.logit_bias],
            "repeat_penalty": c.repeat_penalty,
            "repeat_last_n": c.repeat_last_n,
            "presence_penalty": c.presence_penalty,
            "frequency_penalty": c.frequency_penalty,
        }
    return out


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
        OSError: the file cannot be created; a line cannot be written ("cannot write the
            trace: ..." with the path).
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
        try:
            self._f.write(json.dumps(obj, ensure_ascii=False) + "\n")
            self._f.flush()
        except OSError as e:  # a full disk, /dev/full: its bare strerror names no file
            raise OSError(e.errno, f"cannot write the trace: {e.strerror}", str(self.path)) from e

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
            "verify_rule": tr.verify_rule,
            "h": [_r(v) for v in tr.h],
            "sources": list(tr.sources),
            "n_drafted_by": dict(step.n_drafted_by),
            "n_accepted_by": dict(step.n_accepted_by),
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
    """Pass `generate`'s events through, writing each to `writer` first (`relay`: Ctrl-C
    while a line is written still ends the generation with its Done). Closing this
    generator closes `events` (so the loop restores its caches)."""
    return relay(events, writer.write)
