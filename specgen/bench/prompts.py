"""The prompt set of `specgen bench` and its list options: `BenchPrompt`, the built-in set
(package data `specgen/data/prompts.jsonl`), `--prompts FILE` parsing, the set's SHA-256 for
the reproducibility record, and the parsers of `--draft-max` and `--temp` lists."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from specgen.errors import ConfigError
from specgen.flags import parse_draft_max

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
        ConfigError: empty list, a duplicate, or a non-number. A negative temperature
            is greedy (0), as in llama.cpp and `specgen run`.
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
        if not np.isfinite(t):
            raise ConfigError(f"--temp must be a number, got {s}")
        out.append(max(t, 0.0))
    if len(set(out)) != len(out):
        raise ConfigError(f"--temp lists a value twice (0 or below = greedy): {value!r}")
    return tuple(out)


def k_label(draft_max: int | None) -> str:
    return "auto" if draft_max is None else str(draft_max)
