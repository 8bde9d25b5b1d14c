# Sourced by scripts/bench_serve.sh and scripts/bench_structured.sh (not run on its own):
# llama-server built from the llama.cpp sources vendored in the llama-cpp-python 0.3.36
# source archive (the same sources as the installed bindings), the demo pair, and servers
# started on ports of their own, each loaded before the next, all stopped on exit.
#
# Reads: ROOT, OUT, SPECGEN, PYTHON (for the build's pip), JOBS, NICE, SERVE_BUILD_DIR.
# Defines: LLAMA_SERVER, PY, TARGET, DRAFT, LLAMA_REPACK (llama-server's flags for what
# specgen does with llama.cpp's weight repacking), URLS (--url/--label pairs of the servers
# started, in order), and the functions below.

VERSION=0.3.36
WORK=${SERVE_BUILD_DIR:-$ROOT/.serve-build}
SRC=$WORK/llama_cpp_python-$VERSION
BUILD=$WORK/build
LLAMA_SERVER=$BUILD/bin/llama-server

build_llama_server() { # once: 10-14 minutes on 2 cores; cached in $SERVE_BUILD_DIR
  [ -x "$LLAMA_SERVER" ] && return 0
  mkdir -p "$WORK"
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
    return 1
  fi
}

demo_pair() { # PY (the Python that runs specgen), TARGET, DRAFT (built in SPECGEN_CACHE)
  PY=${PY:-$(dirname "$(command -v "$SPECGEN")")/python}
  [ -x "$PY" ] || PY=python3
  { read -r TARGET; read -r DRAFT; } < <("$PY" -c '
from specgen.models.demo import ensure_demo_pair
print(*ensure_demo_pair(), sep="\n")')
  # on a CPU with AMX specgen loads without llama.cpp's extra buffers (their AMX kernels
  # crash: specgen.llamacpp.loading.extra_buffers_safe); llama-server must do the same,
  # or it crashes too and the two would not run the same kernels
  LLAMA_REPACK=()
  if ! "$PY" -c 'import sys; from specgen.llamacpp.loading import extra_buffers_safe
sys.exit(0 if extra_buffers_safe() else 1)'; then
    LLAMA_REPACK=(--no-repack)
  fi
}

machine_info() { # the machine, the versions, the pair; extra lines from the arguments
  echo "== machine"
  (lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket)') || true
  echo "nproc: $(nproc)"
  echo "specgen: $("$SPECGEN" --version)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  (free -g 2>/dev/null | sed -n 2p) || true
  uptime
  echo "llama-server: $("$LLAMA_SERVER" --version 2>&1 | tr '\n' ' ')"
  echo "target: $TARGET"
  echo "draft: $DRAFT"
  echo "llama.cpp weight repacking: ${LLAMA_REPACK[*]:-on} (off on a CPU with AMX)"
  for line in "$@"; do echo "$line"; done
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

PIDS=()
URLS=()
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
