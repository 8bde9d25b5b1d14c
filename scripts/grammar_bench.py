"""Structured output under speculation on the demo pair: interleaved runs, medians.

Eight prompts asking for structured records (nested objects, enums, arrays, numbers),
each with its JSON Schema. Modes per (repetition, prompt), in rotating order so that
drift of a shared machine hits all alike: speculative under the schema (the draft model,
K fixed; positions the grammar allows alone join blocks as source "grammar"), ordinary
constrained decoding (`--draft none` under the same schema), and speculative without the
schema (the same prompts, unconstrained, for the acceptance comparison). At temperature
0 and 0.8 (run's top-k/top-p/min-p), one stream. Reported: median tokens/s of each mode,
the speedup under the schema (spec / ordinary), draft acceptance (model proposals only)
with and without the schema, tokens per target pass, the share of tokens the grammar
forced, and the grammar's host cost per position (sync + mask on the 262,144-token
vocabulary), timed apart.

Usage (hold the model lock: two llama.cpp processes slow each other down):
    flock /tmp/specgen-model.lock .venv/bin/python scripts/grammar_bench.py \
        [--reps 2] [-n 160] [-k 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench_common import emit, provenance

import specgen.round as round_module
from specgen.drafters import ModelDrafter
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.grammar import compile_grammar, tokenizer_for
from specgen.grammarspec import GrammarSpec
from specgen.models.demo import ensure_demo_pair
from specgen.sampling import SamplingParams
from specgen.session import ModelSpec, load

S, INT, N = {"type": "string", "maxLength": 40}, {"type": "integer"}, {"type": "number"}


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": required or list(props),
        "additionalProperties": False,
    }


RECORDS: list[tuple[str, dict]] = [
    (
        "A person record as JSON:\n",
        obj({"name": S, "age": INT, "city": S, "role": {"enum": ["admin", "user", "guest"]}}),
    ),
    (
        "An order from the shop, as JSON:\n",
        obj(
            {
                "order_id": INT,
                "customer": obj({"name": S, "email": S}),
                "items": {
                    "type": "array",
                    "items": obj({"sku": S, "qty": INT, "price": N}),
                    "maxItems": 3,
                },
                "status": {"enum": ["pending", "shipped", "delivered"]},
            }
        ),
    ),  # fmt: skip
    (
        "Weather report for Lisbon in JSON:\n",
        obj(
            {
                "city": S,
                "temperature_c": N,
                "humidity": INT,
                "conditions": {"enum": ["sunny", "cloudy", "rain", "snow"]},
            }
        ),
    ),  # fmt: skip
    (
        "Book metadata (JSON):\n",
        obj(
            {
                "title": S,
                "author": S,
                "year": INT,
                "isbn": S,
                "tags": {"type": "array", "items": S, "maxItems": 4},
            }
        ),
    ),  # fmt: skip
    (
        "Extract the event as JSON: 'The board meets on Friday at 10 in room 4.'\n",
        obj(
            {
                "event": S,
                "day": {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]},
                "hour": INT,
                "room": INT,
            }
        ),
    ),  # fmt: skip
    (
        "A product review, as a JSON object:\n",
        obj(
            {
                "product": S,
                "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                "pros": {"type": "array", "items": S, "maxItems": 3},
                "cons": {"type": "array", "items": S, "maxItems": 3},
                "recommend": {"type": "boolean"},
            }
        ),
    ),  # fmt: skip
    (
        "Server log entry in JSON:\n",
        obj(
            {
                "level": {"enum": ["debug", "info", "warning", "error"]},
                "service": S,
                "latency_ms": N,
                "host": obj({"name": S, "region": S}),
            }
        ),
    ),  # fmt: skip
    (
        "Recipe card as JSON:\n",
        obj(
            {
                "name": S,
                "servings": INT,
                "ingredients": {
                    "type": "array",
                    "items": obj({"item": S, "grams": INT}),
                    "maxItems": 4,
                },
                "vegetarian": {"type": "boolean"},
            }
        ),
    ),  # fmt: skip
]


def one(target, drafter, text, params, spec, k, n, seed, keep_rows=False) -> dict:
    prompt = target.tokenize(text.encode("utf-8"))
    cfg = GenerateConfig(max_tokens=n, params=params, seed=seed, grammar=spec)
    real = round_module.forced_rows
    if keep_rows:  # the code before forced positions skipped their rows: every row computed
        round_module.forced_rows = lambda grammar, committed, block: ()
    try:
        done = list(generate(target, drafter, prompt, cfg, FixedK(k)))[-1]
    finally:
        round_module.forced_rows = real
    s = done.stats
    model_drafted = s.n_drafted_by.get("draft", 0)
    return {
        "tokens_per_s": s.tokens_per_s,
        "n_generated": s.n_generated,
        "tokens_per_pass": s.tokens_per_pass,
        "draft_acceptance": (
            s.n_accepted_by.get("draft", 0) / model_drafted if model_drafted else None
        ),
        "grammar_share": s.n_accepted_by.get("grammar", 0) / max(1, s.n_generated),
        "finish": done.finish_reason,
    }


def host_cost(target, repeats: int = 5) -> dict[str, float]:
    """Median and max ms per position of the grammar's work on a record: sync (advance one
    token, with a 3-token rollback every fourth position, as a rejection does) + mask."""
    tok = tokenizer_for(target)
    record = '{"order_id": 42, "customer": {"name": "Ana", "email": "a@b.pt"}, "items": '
    record += '[{"sku": "X1", "qty": 2, "price": 9.5}], "status": "shipped"}'
    spec = GrammarSpec.json_schema(RECORDS[1][1])
    ids = target.tokenize(record.encode(), add_special=False)
    times = []
    row = __import__("numpy").zeros(target.n_vocab, dtype="float32")
    for _ in range(repeats):
        m = compile_grammar(spec, tok).matcher()
        for i in range(1, len(ids) + 1):
            t0 = time.perf_counter()
            if i % 4 == 0 and i > 3:
                m.sync(ids[: i - 3])  # a rollback
            m.sync(ids[:i])
            m.mask(row)
            times.append(time.perf_counter() - t0)
    return {
        "per_position_ms_median": 1e3 * statistics.median(times),
        "per_position_ms_max": 1e3 * max(times),
        "positions": len(ids),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--ab-rows",
        action="store_true",
        help="a fourth mode: speculative under the schema with every forced row computed",
    )
    a = ap.parse_args()
    target_path, draft_path = ensure_demo_pair()
    loaded = load(ModelSpec.from_flags(target_path, draft_path, 2048, 0, 0, 0), SamplingParams())
    results: dict[str, dict] = {}
    try:
        target, model = loaded.target, loaded.drafter
        assert isinstance(model, ModelDrafter)
        for temp in (0.0, 0.8):
            params = replace(SamplingParams(), temp=temp)
            drafter = model.with_params(params)
            # (drafter, with the schema?, K) per mode
            modes = {
                "spec+schema": (drafter, True, a.k),
                "ord+schema": (None, True, 0),
                "spec": (drafter, False, a.k),
            }
            if a.ab_rows:
                modes["spec+schema,rows"] = (drafter, True, a.k)
            one(target, drafter, RECORDS[0][0], params, None, a.k, 16, 0)  # warm-up
            runs: dict[str, list[dict]] = {m: [] for m in modes}
            names, turn = list(modes), 0
            for rep in range(a.reps):
                for i, (text, schema) in enumerate(RECORDS):
                    spec = GrammarSpec.json_schema(schema)
                    order = names[turn % len(names) :] + names[: turn % len(names)]
                    turn += 1
                    for m in order:
                        d, constrained, k = modes[m]
                        g = spec if constrained else None
                        r = one(
                            target, d, text, params, g, k, a.n, 1000 * rep + i, m.endswith("rows")
                        )
                        runs[m].append(r)
                        print(
                            f"  T={temp} rep {rep} #{i} {m:12s} {r['tokens_per_s']:6.1f} tok/s"
                            f" {r['n_generated']:4d} tok, {r['tokens_per_pass']:.2f}/pass,"
                            f" acc {r['draft_acceptance']}, {r['finish']}",
                            file=sys.stderr,
                            flush=True,
                        )

            def med(m: str, key: str, runs: dict[str, list[dict]] = runs) -> float | None:
                xs = [r[key] for r in runs[m] if r[key] is not None]
                return statistics.median(xs) if xs else None

            tps = {m: med(m, "tokens_per_s") for m in modes}
            results[f"temp {temp}"] = {
                "tokens_per_s_median": tps,
                "speedup_under_schema": tps["spec+schema"] / tps["ord+schema"],  # type: ignore[operator]
                "skipping_forced_rows_ratio": (
                    tps["spec+schema"] / tps["spec+schema,rows"]  # type: ignore[operator]
                    if a.ab_rows
                    else None
                ),
                "draft_acceptance_median": {
                    "schema": med("spec+schema", "draft_acceptance"),
                    "unconstrained": med("spec", "draft_acceptance"),
                },
                "tokens_per_pass_median": {m: med(m, "tokens_per_pass") for m in modes},
                "grammar_forced_share_median": med("spec+schema", "grammar_share"),
                "finish": {m: [r["finish"] for r in runs[m]] for m in modes},
            }
        host = host_cost(target)
    finally:
        loaded.close()
    out = {
        **provenance(),
        "n": a.n,
        "k": a.k,
        "reps": a.reps,
        "results": results,
        "grammar_host_cost": host,
    }
    emit(out, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
