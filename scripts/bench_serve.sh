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
#
# then two tables of all five side by side (summary.md, `serve_summary_markdown` in
# specgen/bench/load/report.py): output tokens/s with specgen's ratio against the better
# llama-server configuration and against itself without a draft at each level; and the
# tails (TTFT p50/p99, TPOT p99) with SLO goodput (requests/s meeting TTFT <= SLO_TTFT and
# TPOT <= SLO_TPOT ms: the project's defaults on this CPU, 500 and 80).
#
#   scripts/bench_serve.sh [OUT_DIR]        (default: bench-serve)
#
# Environment: CONC (levels, default 1,2,4,8), TEMPS (default 0,0.8), N (tokens per request,
# default 128), NUM_PROMPTS (requests per level, default 16), NP (slots: llama-server -np,
# specgen serve --parallel; default 4), CTX (context per slot, default 2048), THREADS
# (default 2), K (the second --spec-draft-n-max, the K specgen's controller settles on;
# default 8), SLO_TTFT, SLO_TPOT (the SLO goodput bounds in ms, default 500 and 80),
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
SPECGEN=${SPECGEN:-specgen}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
NICE=${NICE:-nice -n 19}
VERSION=0.3.36
ROOT=$(pwd)
WORK=${SERVE_BUILD_DIR:-$ROOT/.serve-build}
SRC=$WORK/llama_cpp_python-$VERSION
BUILD=$WORK/build
LLAMA_SERVER=$BUILD/bin/llama-server
mkdir -p "$OUT" "$WORK"

# -- build llama-server (once) --------------------------------------------------------------
if [ ! -x "$LLAMA_SERVER" ]; then
  if [ ! -d "$SRC/vendor/llama.cpp" ]; then
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
      "llama-cpp-python==$VERSION" -d "$WORK"
    tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
  fi
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    # static: one self-contained binary; no web UI, no curl, no OpenSSL (loopback only)
    $NICE cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$WORK/configure.log"
  fi
  echo "== building llama-server (once; 10-14 minutes on 2 cores)"
  if ! $NICE cmake --build "$BUILD" -j "$JOBS" --target llama-server >"$WORK/build.log" 2>&1; then
    tail -40 "$WORK/build.log" >&2
    exit 1
  fi
fi

# -- the pair, the port, the machine --------------------------------------------------------
# the Python that runs specgen (the demo pair is built by it, in SPECGEN_CACHE)
PY=${PY:-$(dirname "$(command -v "$SPECGEN")")/python}
[ -x "$PY" ] || PY=python3
{ read -r TARGET; read -r DRAFT; } < <("$PY" -c '
from specgen.models.demo import ensure_demo_pair
print(*ensure_demo_pair(), sep="\n")')
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

{
  echo "== machine"
  (lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket)') || true
  echo "nproc: $(nproc)"
  echo "specgen: $("$SPECGEN" --version)"
  (free -g 2>/dev/null | sed -n 2p) || true
  uptime
  echo "llama-server: $("$LLAMA_SERVER" --version 2>&1 | tr '\n' ' ')"
  echo "target: $TARGET"
  echo "draft: $DRAFT"
  echo "slots $NP, context $CTX per slot, threads $THREADS, -n $N, $NUM_PROMPTS requests per level"
} | tee "$OUT/machine.txt"

PIDS=()
stop_servers() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap stop_servers EXIT
trap 'stop_servers; exit 130' INT TERM

wait_ready() { # URL PID: until GET /health answers 200 (both servers: 503 while loading)
  "$PY" - "$1/health" "$2" <<'PY'
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"the server (pid {pid}) exited before it was ready")
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(f"{url} not ready after 600 s")
PY
}

URLS=()
start() { # LABEL COMMAND...: one server on a port of its own, loaded before the next starts
  local label=$1 port
  shift
  port=$(free_port)
  echo "== loading $label on port $port"
  "$@" --port "$port" >"$OUT/$label.log" 2>&1 &
  PIDS+=("$!")
  wait_ready "http://127.0.0.1:$port" "$!"
  URLS+=(--url "http://127.0.0.1:$port" --label "$label")
}

# llama-server on the pair with the same slots, context and threads: -c is the whole cache,
# split between the -np slots, so NP x CTX gives each slot CTX
LLAMA=("$LLAMA_SERVER" -m "$TARGET" -np "$NP" -c $((NP * CTX)) -t "$THREADS" -ngl 0
  --host 127.0.0.1 --no-webui)
SERVE=("$SPECGEN" serve --parallel "$NP" -c "$CTX" -t "$THREADS")
# --spec-type draft-simple: without it this llama.cpp loads the draft and never uses it
start llama-draft3 "${LLAMA[@]}" -md "$DRAFT" -ngld 0 --spec-type draft-simple \
  --spec-draft-n-max 3
start "llama-draft$K" "${LLAMA[@]}" -md "$DRAFT" -ngld 0 --spec-type draft-simple \
  --spec-draft-n-max "$K"
start llama-nodraft "${LLAMA[@]}"
start specgen "${SERVE[@]}"
start specgen-nodraft "${SERVE[@]}" --draft none

echo "== measuring (servers alternating level by level)"
"$SPECGEN" bench "${URLS[@]}" --concurrency "$CONC" --temp "$TEMPS" -n "$N" \
  --num-prompts "$NUM_PROMPTS" --warmup 2 --slo "ttft=$SLO_TTFT,tpot=$SLO_TPOT" \
  --json "$OUT/all.json" --markdown "$OUT/all.md"
stop_servers

# -- all five side by side ------------------------------------------------------------------
"$PY" - "$OUT/all.json" "llama-draft3" "llama-draft$K" "llama-nodraft" "specgen" "specgen-nodraft" \
  <<'PY' | tee "$OUT/summary.md"
import json, sys
from specgen.bench.load.report import serve_summary_markdown
with open(sys.argv[1], encoding="utf-8") as f:
    print(serve_summary_markdown(json.load(f), sys.argv[2:]), end="")
PY
echo "== wrote $OUT/summary.md, $OUT/all.json and $OUT/all.md"
