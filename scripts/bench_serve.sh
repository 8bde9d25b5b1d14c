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
# then one table of all five side by side (summary.md), with specgen's ratio against the
# better llama-server configuration and against itself without a draft at each level.
#
#   scripts/bench_serve.sh [OUT_DIR]        (default: bench-serve)
#
# Environment: CONC (levels, default 1,2,4,8), TEMPS (default 0,0.8), N (tokens per request,
# default 128), NUM_PROMPTS (requests per level, default 16), NP (slots: llama-server -np,
# specgen serve --parallel; default 4), CTX (context per slot, default 2048), THREADS
# (default 2), K (the second --spec-draft-n-max, the K specgen's controller settles on;
# default 8), SPECGEN (the command, default specgen), PYTHON (for the build's pip, default
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
  --num-prompts "$NUM_PROMPTS" --warmup 2 --json "$OUT/all.json" --markdown "$OUT/all.md"
stop_servers

# -- all five side by side ------------------------------------------------------------------
"$PY" - "$OUT/all.json" "llama-draft3" "llama-draft$K" "llama-nodraft" "specgen" "specgen-nodraft" \
  <<'PY' | tee "$OUT/summary.md"
import json, sys
path, labels = sys.argv[1], sys.argv[2:]
runs, cpu = {}, []
for r in json.load(open(path))["runs"]:
    label = r["label"]
    runs[(r["level"]["temp"], r["level"]["name"], label)] = r["summary"]
    if r.get("client_cpu_percent") is not None:
        cpu.append((r["client_cpu_percent"], label, r["level"]["temp"], r["level"]["name"]))
levels = list(dict.fromkeys((t, n) for t, n, _ in runs))
def cell(s):
    tpot = s["tpot"]["p99"]
    fail = f", {s['n_requests'] - s['n_completed']} failed" if s["n_completed"] < s["n_requests"] else ""
    tp = "–" if tpot is None else f"{tpot:.0f}"
    return f"{s['output_throughput']:.1f} ({s['ttft']['p50']:.0f} / {tp}{fail})"
print("Output tokens/s over all streams (TTFT p50 ms / TPOT p99 ms).\n")
print("| temp | load | " + " | ".join(labels) + " | specgen / best llama-server | specgen / specgen --draft none |")
print("|---:|---|" + "---:|" * (len(labels) + 2))
for t, n in levels:
    got = {l: runs.get((t, n, l)) for l in labels}
    best = max((got[l]["output_throughput"] for l in labels if l.startswith("llama") and got[l]), default=None)
    spec, nod = got.get("specgen"), got.get("specgen-nodraft")
    r1 = f"{spec['output_throughput'] / best:.2f}×" if spec and best else "–"
    r2 = f"{spec['output_throughput'] / nod['output_throughput']:.2f}×" if spec and nod and nod["output_throughput"] else "–"
    cells = [cell(got[l]) if got[l] else "–" for l in labels]
    print(f"| {t:g} | {n} | " + " | ".join(cells) + f" | {r1} | {r2} |")
if cpu:
    top = max(cpu)
    print(f"\nThe load client's own CPU: at most {top[0]:.1f}% of one core in a level"
          f" ({top[1]}, temp {top[2]:g}, {top[3]}).")
PY
echo "== wrote $OUT/summary.md, $OUT/all.json and $OUT/all.md"
