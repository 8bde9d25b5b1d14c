#!/usr/bin/env bash
# Regenerate the README's benchmark table on the embedded demo pair (Gemma 3 270M: F32
# target, Q4_K_M draft), and check bench's speedup against whole-process timings of
# `specgen run` with and without a draft. Uses only specgen, bash and coreutils.
#
#   scripts/bench_demo.sh [OUT_DIR]        (default: bench-demo)
#
# Environment: N (tokens per generation, default 128), RUNS (default 1), TEMPS (default
# 0,0.8), KS (default 4,8,auto), CHECK_N (tokens for the whole-process check, default 256),
# CHECK_REPS (repetitions of the check, default 7), CHECK_RUNS (bench runs per repetition,
# default 3), TABLE (0: only the whole-process check), SPECGEN (the command, default
# specgen).
# Run it on a quiet machine: other load changes the figures. Takes several minutes on two
# CPU cores.
set -euo pipefail

OUT=${1:-bench-demo}
N=${N:-128}
RUNS=${RUNS:-1}
TEMPS=${TEMPS:-0,0.8}
KS=${KS:-4,8,auto}
CHECK_N=${CHECK_N:-256}
CHECK_REPS=${CHECK_REPS:-7}
CHECK_RUNS=${CHECK_RUNS:-3}
SPECGEN=${SPECGEN:-specgen}
TABLE=${TABLE:-1}
mkdir -p "$OUT"

echo "== machine" | tee "$OUT/machine.txt"
{
  (lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket)') || sysctl -n machdep.cpu.brand_string
  echo "nproc: $(nproc 2>/dev/null || sysctl -n hw.ncpu)"
  (free -g 2>/dev/null | sed -n 2p) || true
  uptime
} | tee -a "$OUT/machine.txt"

if [ "$TABLE" != 0 ]; then
  echo "== table: temps $TEMPS, block sizes $KS, -n $N, runs $RUNS"
  "$SPECGEN" bench --temp "$TEMPS" --draft-max "$KS" --runs "$RUNS" -n "$N" \
    --json "$OUT/bench.json" --markdown "$OUT/bench.md"
fi

# -- whole-process check --------------------------------------------------------------------
# One prompt, greedy, the adaptive block size (run's default), fixed work (--ignore-eos).
# Each repetition runs bench on the prompt and, right after it, the four whole processes,
# so both methods see the machine in the same state (its speed drifts by 20-30% over an
# afternoon on a shared host); the figures compared are medians over the repetitions.
PROMPT="Once upon a time, in a small village by the sea, there lived an old fisherman who"
printf '%s\n' "$PROMPT" >"$OUT/check-prompt.txt"

TIMEFORMAT=%R
wall() { # wall seconds of one whole `specgen run` process
  { time "$SPECGEN" run --no-live --temp 0 --seed 1 --ignore-eos "$@" "$PROMPT" >/dev/null; } 2>&1
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
num() { grep -m1 "\"$1\":" "$2" | sed -E 's/.*: *([0-9.]+).*/\1/'; }

echo "== check: bench vs whole processes, --temp 0 -n $CHECK_N, $CHECK_REPS repetitions"
"$SPECGEN" run --no-live --temp 0 -n 4 "$PROMPT" >/dev/null # warm the page cache
: >"$OUT/check-reps.txt"
for r in $(seq "$CHECK_REPS"); do
  "$SPECGEN" bench --prompts "$OUT/check-prompt.txt" --temp 0 --draft-max auto --runs "$CHECK_RUNS" \
    -n "$CHECK_N" --json "$OUT/check-$r.json" >/dev/null 2>&1
  o=$(wall --draft none -n "$CHECK_N")
  s=$(wall -n "$CHECK_N")
  o1=$(wall --draft none -n 1)
  s1=$(wall -n 1)
  b=$(num speedup "$OUT/check-$r.json")
  e=$(num speedup_e2e "$OUT/check-$r.json")
  net=$(awk -v o="$o" -v s="$s" -v o1="$o1" -v s1="$s1" 'BEGIN {printf "%.3f", (o - o1) / (s - s1)}')
  echo "$r $b $e $o $s $o1 $s1 $net" | tee -a "$OUT/check-reps.txt"
done
col() { awk -v c="$1" '{print $c}' "$OUT/check-reps.txt" | median; }
{
  echo "== whole-process check (-n $CHECK_N, medians of $CHECK_REPS repetitions)"
  echo "columns: repetition, bench speedup, bench speedup with prefill, seconds of"
  echo "run --draft none and of run (-n $CHECK_N), the same at -n 1, whole-process ratio minus -n 1"
  cat "$OUT/check-reps.txt"
  awk -v b="$(col 2)" -v e="$(col 3)" -v o="$(col 4)" -v s="$(col 5)" -v o1="$(col 6)" \
    -v s1="$(col 7)" 'BEGIN {
    raw = o / s; net = (o - o1) / (s - s1)
    printf "specgen run --draft none: %.2f s   with the draft: %.2f s\n", o, s
    printf "the same with -n 1 (load, prefill, start-up): %.2f s / %.2f s\n", o1, s1
    printf "whole-process ratio:               %.2fx\n", raw
    printf "whole-process ratio minus -n 1:    %.2fx\n", net
    printf "bench speedup (decode tokens/s):   %.2fx (prefill included: %.2fx)\n", b, e
    printf "bench vs whole-process minus -n 1: %+.1f%%\n", (b / net - 1) * 100
  }'
} | tee "$OUT/check.txt"

if [ "$TABLE" != 0 ]; then
  echo "== README table ($OUT/bench.md)"
  cat "$OUT/bench.md"
fi
