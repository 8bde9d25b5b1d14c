#!/usr/bin/env bash
# Structured output: `specgen serve` against llama.cpp's own server on the demo pair, the
# same JSON Schema per request on both (issue 36's side-by-side goal). Eight prompts asking
# for structured records (scripts/grammar_bench.py's: nested objects, enums, arrays,
# numbers), each with its schema as the request's `json_schema` field, through
# /v1/completions, at most $N tokens (a record ends where its schema does), one stream and
# four, greedy and temperature 0.8. All four servers are loaded at once (one at a time
# computes: the others wait idle) and measured in turn at each level by one
# `specgen bench --url` run per alternation, in this order:
#
#   llama-server without a draft                                      label llama-nodraft
#   llama-server with the draft, --spec-draft-n-max $K                label llama-draft$K
#   specgen serve (the draft, --draft-max auto)                       label specgen
#   specgen serve --draft none                                        label specgen-nodraft
#
# REPS alternations of the constrained prompts (schema-N.json), the first FREE_REPS of them
# each followed by the same prompts without a schema, at FREE_CONC streams, on the two
# servers with a draft, for the acceptance comparison (free-N.json). scripts/bench_structured.py then checks every
# constrained output against its schema and writes summary.md: output tokens/s (medians
# over the alternations), specgen's ratios against the better llama-server configuration
# and against itself without a draft, draft acceptance and tokens per target pass with and
# without the schema, the share of tokens the grammar forced.
#
#   scripts/bench_structured.sh [OUT_DIR]        (default: bench-structured)
#
# Environment: REPS (default 3), FREE_REPS (default 1), CONC (default 1,4), FREE_CONC
# (default 1), TEMPS (default 0,0.8), DRAFT_TEMPS (those of TEMPS at which llama-server with
# its draft is measured, default all), N (default 160), NP (slots, default 4), CTX (context
# per slot, default 2048), THREADS (default 2), K (llama-server's --spec-draft-n-max,
# default 8), SPECGEN, PYTHON, JOBS, NICE, SERVE_BUILD_DIR: as scripts/bench_serve.sh
# (serve_common.sh builds llama-server on the first run).
set -euo pipefail

OUT=${1:-bench-structured}
REPS=${REPS:-3}
FREE_REPS=${FREE_REPS:-1}
CONC=${CONC:-1,4}
FREE_CONC=${FREE_CONC:-1}
TEMPS=${TEMPS:-0,0.8}
DRAFT_TEMPS=${DRAFT_TEMPS:-$TEMPS}
N=${N:-160}
NP=${NP:-4}
CTX=${CTX:-2048}
THREADS=${THREADS:-2}
K=${K:-8}
SPECGEN=${SPECGEN:-specgen}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
NICE=${NICE:-nice -n 19}
ROOT=$(pwd)
HERE=$(dirname "${BASH_SOURCE[0]}")
mkdir -p "$OUT"
# shellcheck source=scripts/serve_common.sh
source "$HERE/serve_common.sh"

build_llama_server
demo_pair
machine_info "slots $NP, context $CTX per slot, threads $THREADS, -n $N, K $K," \
  "streams $CONC, temperatures $TEMPS, $REPS alternations (+ $FREE_REPS unconstrained)" \
  | tee "$OUT/machine.txt"
"$PY" "$HERE/bench_structured.py" prompts "$OUT"

LLAMA=("$LLAMA_SERVER" -m "$TARGET" -np "$NP" -c $((NP * CTX)) -t "$THREADS" -ngl 0
  --host 127.0.0.1 --no-webui "${LLAMA_REPACK[@]}")
SERVE=("$SPECGEN" serve --parallel "$NP" -c "$CTX" -t "$THREADS")
start llama-nodraft "${LLAMA[@]}"
# --spec-type draft-simple: without it this llama.cpp loads the draft and never uses it
start "llama-draft$K" "${LLAMA[@]}" -md "$DRAFT" -ngld 0 --spec-type draft-simple \
  --spec-draft-n-max "$K"
start specgen "${SERVE[@]}"
start specgen-nodraft "${SERVE[@]}" --draft none
DRAFTED=("${URLS[@]:4:4}" "${URLS[@]:8:4}") # llama-draft$K and specgen

# one request per prompt and level: the 8 records, each once, in an order seeded per level;
# llama-server's draft only at the temperatures in DRAFT_TEMPS (under a schema at 0.8 its
# requests fell to 0.04-0.8 tokens/s on this CPU and a level did not end in four minutes)
n_prompts=$(wc -l <"$OUT/schema.jsonl")
IFS=, read -ra temps <<<"$TEMPS"
for rep in $(seq 1 "$REPS"); do
  for t in "${temps[@]}"; do
    urls=("${URLS[@]}") drafted=("${DRAFTED[@]}")
    if [[ ",$DRAFT_TEMPS," != *",$t,"* ]]; then
      urls=("${URLS[@]:0:4}" "${URLS[@]:8}") drafted=("${URLS[@]:8:4}")
    fi
    echo "== alternation $rep of $REPS, temperature $t, under the schema"
    "$SPECGEN" bench "${urls[@]}" --prompts "$OUT/schema.jsonl" --concurrency "$CONC" \
      --temp "$t" -n "$N" --num-prompts "$n_prompts" --warmup $((rep == 1)) \
      --seed "$rep" --json "$OUT/schema-t$t-$rep.json" --markdown "$OUT/schema-t$t-$rep.md"
    if [ "$rep" -le "$FREE_REPS" ]; then
      echo "== unconstrained $rep of $FREE_REPS, temperature $t"
      "$SPECGEN" bench "${drafted[@]}" --prompts "$OUT/free.jsonl" --concurrency "$FREE_CONC" \
        --temp "$t" -n "$N" --num-prompts "$n_prompts" --warmup 0 --seed "$rep" \
        --json "$OUT/free-t$t-$rep.json" --markdown "$OUT/free-t$t-$rep.md"
    fi
  done
done
stop_servers

"$PY" "$HERE/bench_structured.py" report "$OUT" | tee "$OUT/summary.md"
echo "== wrote $OUT/summary.md and the runs' JSON in $OUT"
