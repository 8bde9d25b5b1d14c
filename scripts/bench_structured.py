"""Structured output side by side with llama-server: the prompts and the report of
scripts/bench_structured.sh (which starts the servers and runs `specgen bench --url`).

    bench_structured.py prompts OUT_DIR     writes schema.jsonl and free.jsonl
    bench_structured.py report OUT_DIR      reads schema-*.json and free-*.json, prints summary.md

The prompts are scripts/grammar_bench.py's eight structured records (nested objects, enums,
arrays, numbers), each with its JSON Schema, as `json_schema` fields (llama-server's name,
which specgen serve also takes); free.jsonl holds the same prompts without a schema, for the
acceptance comparison.

The report, from the `--json` files of `specgen bench --url` (one file per alternation):
- output tokens/s per (temperature, streams, server): the median over the alternations
  of each level's aggregate output tokens/s (tokens of the level's requests / its wall time);
  the ratios are medians of the per-alternation ratios (specgen against the better
  llama-server configuration of that alternation, and against `specgen --draft none`);
- draft acceptance: llama-server's `timings.draft_n_accepted / draft_n` (accepted /
  proposed); specgen's draft model alone, `num_accepted_draft_tokens_by_source["draft"] /
  num_tested_draft_tokens_by_source["draft"]` (accepted / tested: proposals after a
  rejection are not counted; the grammar's forced tokens are not draft proposals);
- tokens per target pass: specgen's output tokens / `speculative.num_steps`; llama-server's
  output tokens / (output tokens - accepted drafts) (each of its passes samples one token
  from the target and keeps the accepted drafts before it);
- every constrained output parsed as JSON and checked against its schema (`check`, a
  validator of the keywords these schemas use, written apart from both servers' grammar
  engines); an output cut by max_tokens (finish `length`) is counted as truncated, not
  as a failure; anything else that does not validate is a bug.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grammar_bench import RECORDS  # noqa: E402  (the same eight records and schemas)

#: the labels bench_structured.sh gives its servers: llama-server's start with "llama-"
SPECGEN, SPECGEN_NODRAFT = "specgen", "specgen-nodraft"


def write_prompts(out: Path) -> None:
    with (out / "schema.jsonl").open("w") as s, (out / "free.jsonl").open("w") as f:
        for i, (text, schema) in enumerate(RECORDS):
            line = {"id": f"record-{i}", "kind": "record", "prompt": text}
            s.write(json.dumps(line | {"json_schema": schema}) + "\n")
            f.write(json.dumps(line | {"kind": "free"}) + "\n")


# -- schema check --------------------------------------------------------------------------

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}
_KNOWN = {"type", "enum", "properties", "required", "additionalProperties", "items",
          "maxItems", "minItems", "maxLength", "minLength", "minimum", "maximum"}  # fmt: skip


def check(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """What in `value` breaks `schema` (JSON Schema, the keywords in `_KNOWN`); [] if nothing.

    Raises:
        ValueError: the schema uses a keyword this check does not know (it would pass
            anything it cannot check).
    """
    if unknown := set(schema) - _KNOWN:
        raise ValueError(f"check() does not know {sorted(unknown)}")
    errs: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} not in {schema['enum']}")
    t = schema.get("type")
    if t is not None and not _TYPES[t](value):
        return errs + [f"{path}: not {t}: {value!r}"]
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", math.inf):
            errs.append(f"{path}: longer than {schema['maxLength']}")
        if len(value) < schema.get("minLength", 0):
            errs.append(f"{path}: shorter than {schema['minLength']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value > schema.get("maximum", math.inf) or value < schema.get("minimum", -math.inf):
            errs.append(f"{path}: {value} out of range")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", math.inf) or len(value) < schema.get("minItems", 0):
            errs.append(f"{path}: {len(value)} items")
        for i, v in enumerate(value):
            errs += check(v, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errs += [f"{path}: missing {k}" for k in schema.get("required", ()) if k not in value]
        for k, v in value.items():
            if k in props:
                errs += check(v, props[k], f"{path}.{k}")
            elif schema.get("additionalProperties") is False:
                errs.append(f"{path}: extra key {k}")
    return errs


def validate(text: str | None, schema: dict[str, Any]) -> str | None:
    """None when `text` is JSON that follows `schema`, else why not."""
    try:
        value = json.loads(text or "")
    except ValueError as e:
        return f"not JSON ({e})"
    errs = check(value, schema)
    return "; ".join(errs) if errs else None


# -- the report ----------------------------------------------------------------------------


def _load(out: Path, kind: str) -> list[dict[str, Any]]:
    """One {"runs": [...]} per alternation: the runs of its files (`KIND-REP.json`, or one
    file per temperature, `KIND-tT-REP.json`) together."""
    alts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for p in out.glob(f"{kind}-*.json"):
        alts[int(p.stem.split("-")[-1])] += json.loads(p.read_text())["runs"]
    return [{"runs": alts[rep]} for rep in sorted(alts)]


def _key(run: dict[str, Any]) -> tuple[float, int]:
    lv = run["level"]
    return float(lv["temp"]), int(lv["concurrency"])


def _med(xs: Iterable[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def spec_counts(reqs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Acceptance, tokens per target pass and the grammar's share over the completed
    requests of one (level, server), as the module docstring defines them."""
    ok = [r for r in reqs if r["failure"] is None]
    tokens = sum(r["output_tokens"] for r in ok)
    sg = [r["speculative"] for r in ok if r.get("speculative")]
    if sg:  # specgen
        tested = sum(s.get("num_tested_draft_tokens_by_source", {}).get("draft", 0) for s in sg)
        acc = sum(s.get("num_accepted_draft_tokens_by_source", {}).get("draft", 0) for s in sg)
        forced = sum(s.get("num_accepted_draft_tokens_by_source", {}).get("grammar", 0) for s in sg)
        steps = sum(s["num_steps"] for s in sg)
        return {
            "acceptance": acc / tested if tested else None,
            "tokens_per_pass": tokens / steps if steps else None,
            "forced_share": forced / tokens if tokens else None,
        }
    drafted = sum(r["spec"]["num_draft_tokens"] for r in ok if r.get("spec"))
    acc = sum(r["spec"]["num_accepted_draft_tokens"] for r in ok if r.get("spec"))
    return {
        "acceptance": acc / drafted if drafted else None,
        "tokens_per_pass": tokens / (tokens - acc) if tokens > acc else None,
        "forced_share": None,
    }


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "–" if x is None else format(x, fmt)


def report(out: Path) -> str:
    schema_runs, free_runs = _load(out, "schema"), _load(out, "free")
    if not schema_runs:
        raise SystemExit(f"no schema-*.json in {out}")
    schemas = {f"record-{i}": s for i, (_, s) in enumerate(RECORDS)}
    # tokens/s[(temp, streams)][label] = [one per alternation]
    tps: dict[tuple[float, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    reqs: dict[tuple[str, tuple[float, int], str], list[dict[str, Any]]] = defaultdict(list)
    vs_llama: dict[tuple[float, int], list[float]] = defaultdict(list)
    vs_self: dict[tuple[float, int], list[float]] = defaultdict(list)
    invalid: list[str] = []
    n_checked = n_truncated = n_failed = 0
    for alt in schema_runs:
        this: dict[tuple[float, int], dict[str, float]] = defaultdict(dict)
        for run in alt["runs"]:
            k, label = _key(run), run["label"]
            this[k][label] = run["summary"]["output_throughput"]
            tps[k][label].append(run["summary"]["output_throughput"])
            reqs[("schema", k, label)] += run["requests"]
            for r in run["requests"]:
                if r["failure"] is not None:
                    n_failed += 1
                    invalid.append(f"{label} {k} {r['prompt_id']}: request failed: {r['failure']}")
                    continue
                n_checked += 1
                why = validate(r.get("text"), schemas[r["prompt_id"]])
                if why is not None and r.get("finish_reason") == "length":
                    n_truncated += 1
                elif why is not None:
                    invalid.append(f"{label} temp {k[0]:g} x{k[1]} {r['prompt_id']}: {why}")
        for k, row in this.items():
            best = max((v for x, v in row.items() if x.startswith("llama-")), default=None)
            if (r1 := _ratio(row.get(SPECGEN), best)) is not None:
                vs_llama[k].append(r1)
            if (r2 := _ratio(row.get(SPECGEN), row.get(SPECGEN_NODRAFT))) is not None:
                vs_self[k].append(r2)
    for alt in free_runs:
        for run in alt["runs"]:
            reqs[("free", _key(run), run["label"])] += run["requests"]

    labels = list(dict.fromkeys(run["label"] for run in schema_runs[0]["runs"]))
    lines = [
        f"Alternations: {len(schema_runs)} (schema), {len(free_runs)} (unconstrained).",
        "",
        "| temperature | streams | " + " | ".join(labels)
        + " | specgen / better llama-server | specgen / --draft none |",
        "|---|---:|" + "---:|" * (len(labels) + 2),
    ]  # fmt: skip
    for k in sorted(tps):
        row = tps[k]
        cells = []
        for label in labels:
            acc = spec_counts(reqs[("schema", k, label)])["acceptance"]
            a = f" ({acc:.2f})" if acc is not None else ""
            cells.append(f"{_f(_med(row.get(label, [])))}{a}")
        lines.append(
            f"| {k[0]:g} | {k[1]} | " + " | ".join(cells)
            + f" | **{_f(_med(vs_llama[k]), '.2f')}x** | **{_f(_med(vs_self[k]), '.2f')}x** |"
        )  # fmt: skip
    lines += [
        "",
        "Output tokens/s under the schema, median over the alternations (draft acceptance).",
        "",
        "| temperature | streams | server | acceptance, schema / free | "
        "tokens per target pass, schema / free | tokens the grammar forced |",
        "|---|---:|---|---|---|---:|",
    ]
    for k in sorted(tps):
        for label in (x for x in labels if not x.endswith("nodraft")):
            s = spec_counts(reqs[("schema", k, label)])
            f = spec_counts(reqs[("free", k, label)]) if ("free", k, label) in reqs else {}
            lines.append(
                f"| {k[0]:g} | {k[1]} | {label} | {_f(s['acceptance'], '.2f')} / "
                f"{_f(f.get('acceptance'), '.2f')} | {_f(s['tokens_per_pass'], '.2f')} / "
                f"{_f(f.get('tokens_per_pass'), '.2f')} | "
                f"{_f(None if s['forced_share'] is None else 100 * s['forced_share'], '.0f')}"
                f"{'' if s['forced_share'] is None else '%'} |"
            )
    lines += [
        "",
        f"Constrained outputs checked: {n_checked}; valid JSON following the schema: "
        f"{n_checked - n_truncated - len(invalid) + n_failed}; cut by max_tokens: "
        f"{n_truncated}; invalid: {len(invalid) - n_failed}; failed requests: {n_failed}.",
    ]
    lines += [f"- {x}" for x in invalid]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("prompts", "report"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out = Path(argv[1])
    if argv[0] == "prompts":
        out.mkdir(parents=True, exist_ok=True)
        write_prompts(out)
    else:
        print(report(out), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
