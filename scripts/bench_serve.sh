#!/usr/bin/env bash
# `specgen serve` against llama.cpp's own server on the demo pair, under load: the same
# prompts, schedule, slots, context per slot and sampling for every server, measured by
# one `specgen bench --url` run. All five servers are loaded at once, each on its own
# port, and measured in turn, level by level (at each level every server runs the same
# requests before the next level starts), so that each ratio comes from one run with the
# servers alternating, not from runs minutes apart. Only the server being measured has
# work: the others wait idle (two model processes computing on the same cores would slow
# each other 50-150x). The servers, in the order measured at each level:
#
#   llama-server with the draft, --spec-draft-n-max 3 (its default)   label llama-draft3
#   llama-server with the draft, --spec-draft-n-max $K                 label llama-draft$K
#   llama-server without a draft                                       label llama-nodraft
#   specgen serve (the draft, --draft-max auto)                        label specgen
#   specgen serve --draft none                                         label specgen-nodraft
#   specgen serve $ALT_ARGS (only when SERVERS names it)               label specgen-alt
#
# then two tables of all five side by side (summary.md, `serve_summary_markdown` in
# specgen/bench/load/report.py): output tokens/s with specgen's ratio against the better
# llama-server configuration and against itself without a draft at each level; and the
# tails (TTFT p50/p99, TPOT p99) with SLO goodput (requests/s meeting TTFT <= SLO_TTFT and
# TPOT <= SLO_TPOT ms: the project's defaults on this CPU, 500 and 80).
#
#   scripts/bench_serve.sh [OUT_DIR]        (default: bench-serve)
#
# With REPEAT=N the whole sweep runs N times over the same loaded servers (the
# alternations; seed 1..N), each into all-I.json, and the summary gives each figure's
# median over them (`median_of_runs`); SERVERS (comma-separated labels) starts only
# those of the five, or adds specgen-alt: specgen serve with ALT_ARGS too (an A/B of one
# setting in the same alternations, e.g. ALT_ARGS='--cache-ram 0'), in the tables' columns;
# ALT_SPECGEN makes it another specgen (an A/B of two commits: e.g. ALT_SPECGEN='env -C
# /tmp PYTHONPATH=/tmp/old /path/to/.venv/bin/python -m specgen' for a worktree of the
# older commit; the -C matters: `python -m` puts the working directory before PYTHONPATH,
# so run from this checkout it would import this checkout's code), and then ALT_ARGS may
# be empty.
#
# Environment: CONC (levels, default 1,2,4,8), TEMPS (default 0,0.8), N (tokens per request,
# default 128), NUM_PROMPTS (requests per level, default 16), NP (slots: llama-server -np,
# specgen serve --parallel; default 4), CTX (context per slot, default 2048), THREADS
# (default 2), K (the second --spec-draft-n-max, the K specgen's controller settles on;
# default 8), SLO_TTFT, SLO_TPOT (the SLO goodput bounds in ms, default 500 and 80),
# REPEAT (alternations, default 1), SERVERS (labels to start, default all five),
# SPECGEN (the command, default specgen), PYTHON (for the build's pip, default
# python3), JOBS (build jobs, default nproc), SERVE_BUILD_DIR (default .serve-build).
#
# The first run builds llama-server from the llama.cpp sources vendored in the
# llama-cpp-python 0.3.36 source archive, the same sources as the installed bindings
# (10-14 minutes on 2 cores; cached in $SERVE_BUILD_DIR). Run it on a quiet machine with
# memory for five servers at once (about 9 GB with the defaults).
set -euo pipefail

OUT=${1:-bench-serve}
CONC=${CONC:-1,2,4,8}
TEMPS=${TEMPS:-0,0.8}
N=${N:-128}
NUM_PROMPTS=${NUM_PROMPTS:-16}
NP=${NP:-4}
CTX=${CTX:-2048}
THREADS=${THREADS:-2}
K=${K:-8}
SLO_TTFT=${SLO_TTFT:-500}
SLO_TPOT=${SLO_TPOT:-80}
REPEAT=${REPEAT:-1}
SERVERS=${SERVERS:-llama-draft3,llama-draft$K,llama-nodraft,specgen,specgen-nodraft}
SPECGEN=${SPECGEN:-specgen}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
NICE=${NICE:-nice -n 19}
ROOT=$(pwd)
mkdir -p "$OUT"
# shellcheck source=scripts/serve_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/serve_common.sh"

# llama-server is built only when one of its configurations is measured (an A/B of two
# specgen commits, SERVERS=specgen,specgen-alt, needs none)
if [[ ",$SERVERS," == *",llama-"* ]]; then build_llama_server; fi
demo_pair
machine_info "slots $NP, context $CTX per slot, threads $THREADS, -n $N, $NUM_PROMPTS requests per level" \
  | tee "$OUT/machine.txt"

# llama-server on the pair with the same slots, context and threads: -c is the whole cache,
# split between the -np slots, so NP x CTX gives each slot CTX
LLAMA=("$LLAMA_SERVER" -m "$TARGET" -np "$NP" -c $((NP * CTX)) -t "$THREADS" -ngl 0
  --host 127.0.0.1 --no-webui "${LLAMA_REPACK[@]}")
SERVE=("$SPECGEN" serve --parallel "$NP" -c "$CTX" -t "$THREADS")
wanted() { [[ ",$SERVERS," == *",$1,"* ]]; }
# --spec-type draft-simple: without it this llama.cpp loads the draft and never uses it
LABELS=()
if wanted llama-draft3; then
  start llama-draft3 "${LLAMA[@]}" -md "$DRAFT" -ngld 0 --spec-type draft-simple \
    --spec-draft-n-max 3
  LABELS+=(llama-draft3)
fi
if wanted "llama-draft$K"; then
  start "llama-draft$K" "${LLAMA[@]}" -md "$DRAFT" -ngld 0 --spec-type draft-simple \
    --spec-draft-n-max "$K"
  LABELS+=("llama-draft$K")
fi
if wanted llama-nodraft; then start llama-nodraft "${LLAMA[@]}"; LABELS+=(llama-nodraft); fi
if wanted specgen; then start specgen "${SERVE[@]}"; LABELS+=(specgen); fi
if wanted specgen-nodraft; then
  start specgen-nodraft "${SERVE[@]}" --draft none
  LABELS+=(specgen-nodraft)
fi
if wanted specgen-alt; then
  [ -n "${ALT_ARGS:-}${ALT_SPECGEN:-}" ] || { echo "specgen-alt needs ALT_ARGS or ALT_SPECGEN" >&2; exit 2; }
  # shellcheck disable=SC2206  # ALT_SPECGEN, ALT_ARGS: words, split on spaces on purpose
  ALT_SERVE=(${ALT_SPECGEN:-$SPECGEN} "${SERVE[@]:1}")
  # shellcheck disable=SC2206
  start specgen-alt "${ALT_SERVE[@]}" ${ALT_ARGS:-}
  LABELS+=(specgen-alt)
fi

JSONS=()
for i in $(seq 1 "$REPEAT"); do
  echo "== measuring, alternation $i of $REPEAT (servers alternating level by level)"
  "$SPECGEN" bench "${URLS[@]}" --concurrency "$CONC" --temp "$TEMPS" -n "$N" \
    --num-prompts "$NUM_PROMPTS" --warmup 2 --slo "ttft=$SLO_TTFT,tpot=$SLO_TPOT" \
    --seed "$i" --json "$OUT/all-$i.json" --markdown "$OUT/all-$i.md"
  JSONS+=("$OUT/all-$i.json")
done
stop_servers

# -- the servers side by side (medians over the alternations) ---------------------------------
"$PY" - "${#JSONS[@]}" "${JSONS[@]}" "${LABELS[@]}" <<'PY' | tee "$OUT/summary.md"
import json, sys
from specgen.bench.load.report import median_of_runs, serve_summary_markdown
n = int(sys.argv[1])
docs = []
for path in sys.argv[2 : 2 + n]:
    with open(path, encoding="utf-8") as f:
        docs.append(json.load(f))
if n > 1:
    print(f"Medians over {n} alternations (each figure's median; counts summed).\n")
print(serve_summary_markdown(median_of_runs(docs), sys.argv[2 + n :]), end="")
PY
echo "== wrote $OUT/summary.md and $OUT/all-*.json, $OUT/all-*.md"
