#!/usr/bin/env python3
"""What one sampled row under a grammar costs on the host: a full-vocabulary mask at a new
state against the top-k walk (`specgen.grammarrows.GrammarProcessor.top_k_rows`), medians
over the states of a seeded walk through each grammar.

Grammars: free text at the top level (``root ::= [^\\n]*``), the grammar of
``tool_choice: "auto"`` (free text, then tagged calls: `specgen.server.callgrammar.call_grammar`),
and a JSON Schema (a person record). Vocabularies: the GGUF files given (their tokenizers
only matter: a model is loaded with a 256-token context to read its vocabulary). Rows: the
model's own logits would need a decode per state; a row of standard normal logits times 3
stands in (the walk's cost depends on how many of the first candidates are allowed, which
the grammar decides more than the row). Each state's mask is computed by a fresh matcher
(no cache), the walk by another, so neither reuses the other's work. Also reported: the
share of walks that found their k tokens without falling back to the mask.

Usage (hold the model lock: two llama.cpp processes slow each other down):

    flock /tmp/specgen-model.lock .venv/bin/python scripts/grammar_row_cost.py \\
        MODEL.gguf [MODEL.gguf ...] [--states 12] [--top-k 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from bench_common import emit, provenance

from specgen import grammarrows
from specgen.grammar import compile_grammar, tokenizer_for
from specgen.grammarrows import GrammarProcessor
from specgen.grammarspec import GrammarSpec
from specgen.llamacpp import EngineConfig, LlamaEngine
from specgen.server.callgrammar import call_grammar
from specgen.server.schemas import Tool
from specgen.server.tools import Choice

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def grammars() -> dict[str, GrammarSpec]:
    tool = Tool.model_validate(
        {"type": "function", "function": {"name": "get_weather", "parameters": PERSON}}
    )
    auto = call_grammar([tool], Choice("auto", syntax="hermes"))
    assert auto is not None
    return {
        "free text": GrammarSpec("gbnf", "root ::= [^\\n]*"),
        "tool_choice auto": auto,
        "JSON Schema": GrammarSpec.json_schema(PERSON),
    }


def states(g, n: int, rng: np.random.Generator) -> list[list[int]]:
    """A seeded walk's outputs through `g`, each token drawn among the allowed ones."""
    m, out, seen = g.matcher(), [], [[]]
    eog = set(g.tokenizer.eog)
    for _ in range(n):
        assert m.sync(out)
        ok = [t for t in np.flatnonzero(m.allowed()).tolist() if t not in eog]
        if not ok:
            break
        out = [*out, int(rng.choice(ok))]
        seen.append(out)
    return seen


REAL_FIRST_ALLOWED = grammarrows.first_allowed


def _counting(found: list[bool]):
    """`first_allowed`, recording whether each walk found its k tokens."""

    def counted(*args, **kwargs):
        kept = REAL_FIRST_ALLOWED(*args, **kwargs)
        found.append(kept is not None)
        return kept

    return counted


def measure(path: Path, n_states: int, k: int) -> list[dict]:
    rows = []
    with LlamaEngine(path, EngineConfig(n_ctx=256)) as eng:
        tok = tokenizer_for(eng)
        for name, spec in grammars().items():
            g = compile_grammar(spec, tok)
            rng = np.random.default_rng(0)
            masks: list[float] = []
            walks: list[float] = []
            found: list[bool] = []
            grammarrows.first_allowed = _counting(found)
            try:
                for state in states(g, n_states, rng):
                    z = (rng.standard_normal((1, tok.n_vocab)) * 3).astype(np.float32)
                    full = GrammarProcessor(g, 0)
                    t0 = time.perf_counter()
                    full.rows(z, state, ())
                    masks.append(time.perf_counter() - t0)
                    walker = GrammarProcessor(g, 0)
                    walker._walks = lambda: True  # type: ignore[method-assign]
                    t0 = time.perf_counter()
                    walker.top_k_rows(z, state, (), k)
                    walks.append(time.perf_counter() - t0)
            finally:
                grammarrows.first_allowed = REAL_FIRST_ALLOWED
            row = {
                "vocabulary": f"{path.name} ({tok.n_vocab} tokens)",
                "grammar": name,
                "states": len(masks),
                "mask_ms": 1000 * statistics.median(masks),
                "walk_ms": 1000 * statistics.median(walks),
                "walks_decided": sum(found) / max(len(found), 1),
            }
            rows.append(row)
            print(
                f"| {row['vocabulary']} | {name} | {row['mask_ms']:.3f} | {row['walk_ms']:.3f} |"
                f" {row['walks_decided']:.0%} |",
                flush=True,
            )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--states", type=int, default=12)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    print("| vocabulary | grammar | mask, ms | walk, ms | walks decided |")
    print("|---|---|---|---|---|")
    rows = [r for m in opts.models for r in measure(m, opts.states, opts.top_k)]
    emit({"provenance": provenance(), "top_k": opts.top_k, "rows": rows}, opts.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
