#!/usr/bin/env bash
# The latency story of README "Beyond one machine": the demo pair with the target entirely
# on a loopback ggml-rpc-server, behind scripts/delay_relay.py at several one-way delays,
# and the draft local. One `specgen bench` per delay (ordinary vs speculative, interleaved).
#
#   scripts/bench_rpc.sh [OUT_DIR]          (default: bench-rpc; needs `make test-rpc` first)
#
# Environment: DELAYS (one-way ms, default "0 1 5"), LOCAL (1: also bench without RPC, the
# reference; default 1), KS (default 8,auto), N (tokens per generation, default 64), RUNS
# (default 2), THREADS (client and server, default 2), NGL (target layers on the server,
# default 99 = all and the output layer; 18 = Gemma 3 270M's blocks only, so the output
# layer runs here and only hidden states cross the link), VENV (default .venv-rpc).
# Both processes share this machine's cores; the server waits passively
# (OMP_WAIT_POLICY=passive) so its idle OpenMP threads do not spin on the cores the local
# draft needs. On two real machines that question does not arise.
set -euo pipefail

OUT=${1:-bench-rpc}
DELAYS=${DELAYS-0 1 5}
LOCAL=${LOCAL:-1}
NGL=${NGL:-99}
KS=${KS:-8,auto}
N=${N:-64}
RUNS=${RUNS:-2}
THREADS=${THREADS:-2}
VENV=${VENV:-.venv-rpc}
mkdir -p "$OUT"

PY="$VENV/bin/python"
{ read -r TARGET; read -r DRAFT; } < <("$PY" -c '
from specgen.models.demo import ensure_demo_pair
print(*ensure_demo_pair(), sep="\n")')
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

cat >"$OUT/prompts.txt" <<'EOF'
Once upon a time, in a small village by the sea, there lived an old fisherman who
The three most important ideas in computer science are
def fibonacci(n):
EOF

OMP_WAIT_POLICY=passive "$VENV/bin/ggml-rpc-server" -H 127.0.0.1 -p "$PORT" -t "$THREADS" \
  >"$OUT/server.log" 2>&1 &
SERVER=$!
RELAY=
cleanup() { kill $SERVER ${RELAY:+$RELAY} 2>/dev/null || true; }
trap cleanup EXIT
sleep 1

COMMON=(-m "$TARGET" -md "$DRAFT" -t "$THREADS" -c 1024 --prompts "$OUT/prompts.txt"
        --draft-max "$KS" --temp 0 --runs "$RUNS" -n "$N")
if [ "$LOCAL" = 1 ]; then
  echo "== local reference: no RPC"
  "$VENV/bin/specgen" bench "${COMMON[@]}" --json "$OUT/local.json" --markdown "$OUT/local.md"
fi

for d in $DELAYS; do
  coproc RELAYPROC { exec "$PY" scripts/delay_relay.py --to "127.0.0.1:$PORT" --delay-ms "$d"; }
  RELAY=$RELAYPROC_PID
  read -r line <&"${RELAYPROC[0]}"
  endpoint=${line##* }
  echo "== one-way delay $d ms (relay $endpoint)"
  "$VENV/bin/specgen" bench --rpc "$endpoint" -ngl "$NGL" "${COMMON[@]}" \
    --json "$OUT/delay-$d.json" --markdown "$OUT/delay-$d.md"
  kill "$RELAY"
  wait "$RELAY" 2>/dev/null || true
  RELAY=
done

"$PY" - "$OUT" $DELAYS <<'EOF'
import json, os, sys
out, delays = sys.argv[1], sys.argv[2:]
runs = [("local", "no RPC")] if os.path.exists(f"{out}/local.json") else []
runs += [(f"delay-{d}", f"{d} ms") for d in delays]
print("| target, one-way delay | K | ordinary tokens/s | speculative tokens/s | speedup [95% CI] | acceptance |")
print("|---:|---|---:|---:|---:|---:|")
for name, label in runs:
    res = json.load(open(f"{out}/{name}.json"))
    for c in res["configs"]:
        o = c["overall"]
        lo, hi = o["speedup_ci95"]
        print(f"| {label} | {c['draft_max']} | {o['ordinary']['tokens_per_s']:.1f} |"
              f" {o['speculative']['tokens_per_s']:.1f} | {o['speedup']:.2f}× [{lo:.2f}, {hi:.2f}] |"
              f" {o['acceptance_rate']:.0%} |")
EOF
