"""The prompts of `specgen bench --url`: the bench prompt set by kind, or a JSONL file of raw
prompts or chat messages."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specgen.bench.prompts import builtin_prompts
from specgen.errors import ConfigError

#: request fields a prompt line may carry, sent with that prompt's requests unchanged: the
#: structured-output fields of OpenAI (`response_format`) and llama-server (`json_schema`,
#: `grammar`), which both servers take
STRUCTURE_FIELDS = ("response_format", "json_schema", "grammar")


@dataclass(frozen=True)
class LoadPrompt:
    """One request's input: a raw `prompt` or chat `messages` (role, content) pairs, and
    `fields`: request fields of `STRUCTURE_FIELDS` sent with it (a schema, a grammar)."""

    id: str
    kind: str
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    fields: Mapping[str, Any] | None = None


def load_prompts(path: Path | None, kinds: Sequence[str] = ()) -> list[LoadPrompt]:
    """The bench prompt set (None) or `--prompts FILE`: JSONL, one `{"prompt": "..."}` or
    `{"messages": [{"role": ..., "content": ...}, ...]}` per line (optional `id`, `kind`,
    and `STRUCTURE_FIELDS`: `{"prompt": ..., "json_schema": {...}}` asks for that schema).
    `kinds` keeps only those kinds (`--kind code,chat`).

    Raises:
        ConfigError: unreadable file, bad JSON or fields, no prompts of the kinds asked.
    """
    if path is None:
        out = [LoadPrompt(p.id, p.kind, prompt=p.text) for p in builtin_prompts()]
    else:
        try:
            text = Path(path).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ConfigError(f"--prompts: cannot read {path}: {why}") from None
        out = [
            _parse_line(line, n, path)
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
    if kinds:
        have = sorted({p.kind for p in out})
        out = [p for p in out if p.kind in kinds]
        if not out:
            raise ConfigError(
                f"--kind: no prompts of kind {', '.join(kinds)} (there are: {', '.join(have)})"
            )
    if not out:
        raise ConfigError(f"--prompts: no prompts in {path}")
    return out


def _parse_line(line: str, n: int, path: Path) -> LoadPrompt:
    where = f"--prompts: {path} line {n}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: needs an object with 'prompt' or 'messages'")
    pid, kind = str(obj.get("id", f"line-{n}")), str(obj.get("kind", "custom"))
    fields = {k: obj[k] for k in STRUCTURE_FIELDS if k in obj} or None
    if isinstance(obj.get("prompt"), str) and obj["prompt"]:
        return LoadPrompt(pid, kind, prompt=obj["prompt"], fields=fields)
    msgs = obj.get("messages")
    if (
        isinstance(msgs, list)
        and msgs
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in msgs
        )
    ):
        msg_pairs = tuple((m["role"], m["content"]) for m in msgs)
        return LoadPrompt(pid, kind, messages=msg_pairs, fields=fields)
    raise ConfigError(
        f"{where}: needs a non-empty string 'prompt' or a 'messages' list of {{role, content}}"
    )
