#!/usr/bin/env bash
# Regenerate the README's benchmark table on the embedded demo pair (Gemma 3 270M: F32
# target, Q4_K_M draft), and check bench's speedup against whole-process timings of
# `specgen run` with and without a draft. Uses only specgen, bash and coreutils.
#
#   scripts/bench_demo.sh [OUT_DIR]        (default: bench-demo)
#
# Environment: N (tokens per generation, default 128), RUNS (default 1), TEMPS (default
# 0,0.8), KS (default 4,8,auto), CHECK_N (tokens for the whole-process check, default 256),
# CHECK_REPS (default 3), SPECGEN (the command, default specgen).
# Run it on a quiet machine: other load changes the figures. Takes several minutes on two
# CPU cores.
set -euo pipefail

OUT=${1:-bench-demo}
N=${N:-128}
RUNS=${RUNS:-1}
TEMPS=${TEMPS:-0,0.8}
KS=${KS:-4,8,auto}
CHECK_N=${CHECK_N:-256}
CHECK_REPS=${CHECK_REPS:-3}
SPECGEN=${SPECGEN:-specgen}
mkdir -p "$OUT"

echo "== machine" | tee "$OUT/machine.txt"
{
  (lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket)') || sysctl -n machdep.cpu.brand_string
  echo "nproc: $(nproc 2>/dev/null || sysctl -n hw.ncpu)"
  (free -g 2>/dev/null | sed -n 2p) || true
  uptime
} | tee -a "$OUT/machine.txt"

echo "== table: temps $TEMPS, block sizes $KS, -n $N, runs $RUNS"
"$SPECGEN" bench --temp "$TEMPS" --draft-max "$KS" --runs "$RUNS" -n "$N" \
  --json "$OUT/bench.json" --markdown "$OUT/bench.md"

# -- whole-process check --------------------------------------------------------------------
# One prompt, greedy, the adaptive block size (run's default), fixed work (--ignore-eos).
PROMPT="Once upon a time, in a small village by the sea, there lived an old fisherman who"
printf '%s\n' "$PROMPT" >"$OUT/check-prompt.txt"
echo "== check: bench on the same prompt, --temp 0 --draft-max auto -n $CHECK_N, $CHECK_REPS runs"
"$SPECGEN" bench --prompts "$OUT/check-prompt.txt" --temp 0 --draft-max auto \
  --runs "$CHECK_REPS" -n "$CHECK_N" --json "$OUT/check.json" >/dev/null

TIMEFORMAT=%R
wall() { # wall seconds of one whole `specgen run` process
  { time "$SPECGEN" run --no-live --temp 0 --seed 1 --ignore-eos "$@" "$PROMPT" >/dev/null; } 2>&1
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

"$SPECGEN" run --no-live --temp 0 -n 4 "$PROMPT" >/dev/null # warm the page cache
: >"$OUT/wall.txt"
for _ in $(seq "$CHECK_REPS"); do # alternate the two modes
  echo "ordinary $(wall --draft none -n "$CHECK_N")" >>"$OUT/wall.txt"
  echo "speculative $(wall -n "$CHECK_N")" >>"$OUT/wall.txt"
  echo "ordinary_n1 $(wall --draft none -n 1)" >>"$OUT/wall.txt"
  echo "speculative_n1 $(wall -n 1)" >>"$OUT/wall.txt"
done
m() { awk -v k="$1" '$1 == k {print $2}' "$OUT/wall.txt" | median; }
ORD=$(m ordinary)
SPEC=$(m speculative)
ORD1=$(m ordinary_n1)
SPEC1=$(m speculative_n1)
num() { grep -m1 "\"$1\":" "$OUT/check.json" | sed -E 's/.*: *([0-9.]+).*/\1/'; }
BENCH=$(num speedup)
BENCH_E2E=$(num speedup_e2e)
{
  echo "== whole-process check (-n $CHECK_N, medians of $CHECK_REPS)"
  echo "specgen run --draft none: ${ORD} s   with the draft: ${SPEC} s"
  echo "the same with -n 1 (load, prefill, start-up): ${ORD1} s / ${SPEC1} s"
  awk -v o="$ORD" -v s="$SPEC" -v o1="$ORD1" -v s1="$SPEC1" -v b="$BENCH" -v e="$BENCH_E2E" 'BEGIN {
    raw = o / s; net = (o - o1) / (s - s1)
    printf "whole-process ratio:              %.2fx\n", raw
    printf "whole-process ratio minus -n 1:   %.2fx\n", net
    printf "bench speedup (decode tokens/s):  %.2fx (prefill included: %.2fx)\n", b, e
    printf "bench vs whole-process minus -n 1: %+.1f%%\n", (b / net - 1) * 100
  }'
} | tee "$OUT/check.txt"

echo "== README table ($OUT/bench.md)"
cat "$OUT/bench.md"
