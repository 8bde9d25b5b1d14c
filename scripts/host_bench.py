#!/usr/bin/env python3
"""The speculative loop's host cost alone: everything outside llama_decode, per round.

    PYTHONPATH=. python scripts/host_bench.py [--repeats 7] [--markdown FILE]

The real loop (`generate.generate` with a `ModelDrafter`) runs over engines that replay
logits rows recorded once from the demo pair (Gemma 3 270M: F32 target, Q4_K_M draft;
full 262,144-wide rows of both models at every position of a fixed text), so a decode
costs nothing and what is left is the loop's own work: warps, draws, rejection,
emitting, bookkeeping. The replay engine returns the rows recorded at the positions it
is asked for (target and draft rows of the same context, so acceptance is the real
pair's), as views of arrays too large for the CPU caches, like llama.cpp's fresh output
buffer.

Host time is computed here, not read from the loop's own counters, so the same script
measures older code: per round, round wall time minus the replay engines' decode time;
the draft side is the drafting phase's share, the target side the rest, per row the
target scored. Each configuration (block size K 1/4/8/16; temperature 0, or 0.8 with
the default warpers top-k 40, top-p 0.95, min-p 0.05, or with every truncation off)
runs `--repeats` generations interleaved with the other configurations; the table shows
medians over the repeats.

Then ordinary decoding's per-token sampling cost side by side with llama.cpp's own
sampler chain (llama-cpp-python's sampler API, the same warpers, `llama_sampler_sample`
on the live context), on the real target, one token each in turn: specgen's is `warp` +
`draw` on the fresh logits row.

The recorded rows go to $SPECGEN_CACHE/host_bench/ (about 270 MB, outside git), written
on first use. Run it on a quiet machine: other load changes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specgen.drafters import ModelDrafter
from specgen.engine import VocabInfo
from specgen.events import Done, Step
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.sampling import SamplingParams, draw, warp

TEXT = (
    b"The history of the Roman Empire begins with the founding of the city of Rome, which,"
    b" according to legend,"
)
POSITIONS = 128
KS = (1, 4, 8, 16)
WARPERS = {
    "greedy": SamplingParams(temp=0.0),
    "default": SamplingParams(temp=0.8, top_k=40, top_p=0.95, min_p=0.05),
    "off": SamplingParams(temp=0.8, top_k=0, top_p=1.0, min_p=0.0),
}


def cache_dir() -> Path:
    env = os.environ.get("SPECGEN_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "specgen"


def demo_pair() -> tuple[Path, Path]:
    try:
        from specgen.models.demo import ensure_demo_pair
    except ImportError:  # before the models/ package
        from specgen.demo import ensure_demo_pair  # type: ignore[no-redef]
    return ensure_demo_pair()


# -- recording ---------------------------------------------------------------------------


def record(target: Path, draft: Path, out: Path) -> None:
    """Greedy continuation of TEXT by the target to POSITIONS tokens, then every
    position's logits row from both models, saved as (POSITIONS, n_vocab) float32."""
    from specgen.llamacpp import EngineConfig, LlamaEngine

    cfg = EngineConfig(n_ctx=512, n_threads=0)
    with LlamaEngine(target, cfg) as t:
        tokens = t.tokenize(TEXT)
        t.decode(tokens[:-1])
        while len(tokens) < POSITIONS:
            tokens.append(int(np.argmax(t.decode(tokens[-1:])[-1])))
        t.truncate(0)
        rows_t = np.array(t.decode(tokens, all_logits=True), dtype=np.float32)
    with LlamaEngine(draft, cfg) as d:
        rows_d = np.array(d.decode(tokens, all_logits=True), dtype=np.float32)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("target", rows_t), ("draft", rows_d)):
        with tempfile.NamedTemporaryFile(dir=out, suffix=".npy", delete=False) as f:
            np.save(f, rows)
        os.replace(f.name, out / f"{name}.npy")
    meta = {"tokens": tokens, "target": target.name, "draft": draft.name}
    (out / "meta.json").write_text(json.dumps(meta))


def load_rows(target: Path, draft: Path) -> tuple[np.ndarray, np.ndarray, list[int]]:
    out = cache_dir() / "host_bench" / f"{target.stem}--{draft.stem}--{POSITIONS}"
    if not (out / "meta.json").exists():
        print(f"recording logits rows to {out} (once)", file=sys.stderr)
        record(target, draft, out)
    meta = json.loads((out / "meta.json").read_text())
    return np.load(out / "target.npy"), np.load(out / "draft.npy"), meta["tokens"]


# -- replay ------------------------------------------------------------------------------


class ReplayEngine:
    """An Engine whose decode returns the recorded rows at the positions evaluated."""

    def __init__(self, rows: np.ndarray, name: str) -> None:
        self.rows = rows
        self.name = name
        self.n_ctx, self.n_vocab = rows.shape
        self.vocab = VocabInfo(1, self.n_vocab, 2, 1, True, False)
        self.tokens: list[int] = []
        self.decode_s = 0.0  # replay time, excluded from host time
        self.rows_out = 0

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        raise NotImplementedError

    def token_bytes(self, token: int) -> bytes:
        return b"ab"

    def token_text(self, token: int) -> str:
        return "ab"

    def is_eog(self, token: int) -> bool:
        return False

    def decode(self, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        t0 = time.perf_counter()
        start = len(self.tokens)
        self.tokens.extend(tokens)
        end = len(self.tokens)
        out = self.rows[start:end] if all_logits else self.rows[end - 1 : end]
        self.rows_out += out.shape[0]
        self.decode_s += time.perf_counter() - t0
        return out

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    def close(self) -> None:
        pass


def run_once(rows_t, rows_d, prompt, k, params, seed, n_tokens) -> dict[str, float]:
    """One generation; host seconds per round, target side per row, draft side per row."""
    target = ReplayEngine(rows_t, "target")
    draft_engine = ReplayEngine(rows_d, "draft")
    drafter = ModelDrafter(draft_engine, params, target.n_vocab)
    config = GenerateConfig(max_tokens=n_tokens, params=params, ignore_eos=True, seed=seed)
    host = t_host = d_host = 0.0
    rows = d_rows = rounds = 0
    acc = drafted = 0
    last = (0.0, 0.0, 0)
    for ev in generate(target, drafter, prompt, config, FixedK(k)):
        if isinstance(ev, Step):
            t_dec = target.decode_s - last[0]
            d_dec = draft_engine.decode_s - last[1]
            n_rows = target.rows_out - last[2]
            last = (target.decode_s, draft_engine.decode_s, target.rows_out)
            dh = max(0.0, ev.draft_s - d_dec)
            host += ev.round_s - t_dec - d_dec
            d_host += dh
            t_host += ev.round_s - ev.draft_s - t_dec
            rows += n_rows
            d_rows += ev.k
            rounds += 1
        elif isinstance(ev, Done):
            acc, drafted = ev.stats.n_accepted, ev.stats.n_drafted
        else:  # Prefilled: the prompt's replay is not a round
            last = (target.decode_s, draft_engine.decode_s, target.rows_out)
    return {
        "round_ms": host / rounds * 1e3,
        "target_row_us": t_host / rows * 1e6,
        "draft_row_us": d_host / d_rows * 1e6 if d_rows else 0.0,
        "acceptance": acc / drafted if drafted else 0.0,
        "rounds": rounds,
    }


def loop_table(rows_t, rows_d, tokens, repeats: int) -> list[dict]:
    prompt = tokens[:12]
    n_tokens = POSITIONS - len(prompt) - max(KS) - 2
    configs = [(w, k) for w in WARPERS for k in KS]
    results: dict[tuple[str, int], list[dict]] = {c: [] for c in configs}
    for w, k in configs:  # warm-up
        run_once(rows_t, rows_d, prompt, k, WARPERS[w], 0, 24)
    for r in range(repeats):
        for w, k in configs:  # interleaved: slow drift of the machine hits all alike
            results[(w, k)].append(
                run_once(rows_t, rows_d, prompt, k, WARPERS[w], 1000 + r, n_tokens)
            )
    out = []
    for (w, k), rs in results.items():
        med = {key: statistics.median(x[key] for x in rs) for key in rs[0]}
        out.append({"warpers": w, "k": k, **med})
    return out


# -- ordinary decoding: specgen's sampling vs llama.cpp's sampler chain ----------------------


def ordinary_side_by_side(target: Path, tokens: list[int], n: int) -> dict[str, float]:
    import llama_cpp

    from specgen.llamacpp import EngineConfig, LlamaEngine

    params = WARPERS["default"]
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for s in (
        llama_cpp.llama_sampler_init_top_k(params.top_k),
        llama_cpp.llama_sampler_init_top_p(params.top_p, 1),
        llama_cpp.llama_sampler_init_min_p(params.min_p, 1),
        llama_cpp.llama_sampler_init_temp(params.temp),
        llama_cpp.llama_sampler_init_dist(1234),
    ):
        llama_cpp.llama_sampler_chain_add(chain, s)
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {"specgen": [], "llama.cpp": []}
    with LlamaEngine(target, EngineConfig(n_ctx=512, n_threads=0)) as t:
        ctx = t._ctx  # the live context: llama_sampler_sample reads its logits
        prompt = tokens[:12]
        t.decode(prompt[:-1])
        tok = prompt[-1]
        for i in range(n):
            if len(t.tokens) >= t.n_ctx - 1:
                t.truncate(len(prompt) - 1)
            row = t.decode([tok])[-1]
            # one sampler per token, each on a freshly decoded row, alternating
            t0 = time.perf_counter()
            if i % 2:
                tok = int(llama_cpp.llama_sampler_sample(chain, ctx, -1))
                times["llama.cpp"].append(time.perf_counter() - t0)
            else:
                tok = draw(*warp(row, params), rng)
                times["specgen"].append(time.perf_counter() - t0)
    llama_cpp.llama_sampler_free(chain)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


# -- report ------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    py, npv = platform.python_version(), np.__version__
    return f"{cpu}, {os.cpu_count()} CPUs, Python {py}, numpy {npv}"


def markdown(table: list[dict], ordinary: dict[str, float] | None, repeats: int) -> str:
    lines = [
        "| warpers | K | host ms/round | target µs/row | draft µs/row | acceptance |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in table:
        lines.append(
            f"| {r['warpers']} | {r['k']} | {r['round_ms']:.2f} | {r['target_row_us']:.0f}"
            f" | {r['draft_row_us']:.0f} | {r['acceptance']:.0%} |"
        )
    lines.append("")
    lines.append(
        f"Medians of {repeats} generations per row; greedy = temperature 0; default = temp"
        " 0.8, top-k 40, top-p 0.95, min-p 0.05; off = temp 0.8, top-k 0, top-p 1, min-p 0."
        f" Machine: {machine()}."
    )
    if ordinary:
        lines.append("")
        lines.append(
            "Ordinary decoding, sampling one token from a fresh 262,144-wide row (default"
            f" warpers): specgen {ordinary['specgen']:.3f} ms, llama.cpp's sampler chain"
            f" {ordinary['llama.cpp']:.3f} ms (median per token)."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("-m", "--target", type=Path, help="target GGUF (default: demo pair)")
    ap.add_argument("-md", "--draft", type=Path, help="draft GGUF (default: demo pair)")
    ap.add_argument("--ordinary-tokens", type=int, default=200, help="0 skips the comparison")
    ap.add_argument("--markdown", type=Path, help="also write the table here")
    args = ap.parse_args()
    if args.target is None or args.draft is None:
        args.target, args.draft = demo_pair()
    rows_t, rows_d, tokens = load_rows(args.target, args.draft)
    table = loop_table(rows_t, rows_d, tokens, args.repeats)
    ordinary = None
    if args.ordinary_tokens > 0:
        ordinary = ordinary_side_by_side(args.target, tokens, args.ordinary_tokens)
    text = markdown(table, ordinary, args.repeats)
    print(text, end="")
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
