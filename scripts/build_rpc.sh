#!/usr/bin/env bash
# Build an RPC-enabled llama-cpp-python and ggml-rpc-server from ONE compile of the same
# llama.cpp sources (the vendored copy in llama-cpp-python's source archive), into its own
# virtual environment. Used by `make test-rpc`; re-runs reuse the cached build.
#
#   scripts/build_rpc.sh [VENV]        (default .venv-rpc; build outputs under .rpc-build/)
#
# Why not `CMAKE_ARGS="-DGGML_RPC=on" pip install llama-cpp-python`: that compiles llama.cpp
# but does not build the server, and compiling a second time for the server doubles the
# build (about 5 minutes each on 2 cores). Here cmake builds libllama, libggml* and
# ggml-rpc-server once; the bindings are installed without compiling (LLAMA_BUILD=OFF) and
# the shared libraries are copied next to them, where llama_cpp looks (llama_cpp/lib).
set -euo pipefail

VERSION=0.3.36
PYTHON=${PYTHON:-python3}
VENV=${1:-.venv-rpc}
ROOT=$(pwd)
WORK=${RPC_BUILD_DIR:-$ROOT/.rpc-build}
SRC=$WORK/llama_cpp_python-$VERSION
BUILD=$WORK/build
JOBS=${JOBS:-$(nproc)}
NICE=${NICE:-nice -n 19}

mkdir -p "$WORK"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi

if [ ! -d "$SRC/vendor/llama.cpp" ]; then
    "$VENV/bin/pip" download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$VERSION" -d "$WORK"
    tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    # $ORIGIN rpath: the copied libraries and the server find their siblings wherever
    # they are put. Tools need the common library at configure time only.
    $NICE cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON \
        -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' >/dev/null
fi
# The compiler's warnings go to a log; its tail is shown if the build fails.
if ! $NICE cmake --build "$BUILD" -j "$JOBS" --target llama ggml-rpc-server >"$WORK/build.log" 2>&1; then
    tail -40 "$WORK/build.log" >&2
    exit 1
fi

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -f "$SITE/llama_cpp/__init__.py" ]; then
    # The Python package only: no compile (LLAMA_BUILD=OFF); libraries come from $BUILD.
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$VENV/bin/pip" install --quiet \
        --no-cache-dir "$SRC"
fi
mkdir -p "$SITE/llama_cpp/lib"
cp -fP "$BUILD"/bin/lib*.so* "$SITE/llama_cpp/lib/"
cp -f "$BUILD/bin/ggml-rpc-server" "$SITE/llama_cpp/lib/"
ln -sf "$SITE/llama_cpp/lib/ggml-rpc-server" "$VENV/bin/ggml-rpc-server"
# specgen and its test tools; llama-cpp-python 0.3.36 is already satisfied, so not rebuilt.
"$VENV/bin/pip" install --quiet -e "$ROOT[dev]"

"$VENV/bin/python" - <<'PY'
import llama_cpp
assert llama_cpp.llama_supports_rpc(), "llama_supports_rpc() is false after the RPC build"
print(f"llama-cpp-python {llama_cpp.__version__} with RPC: ok")
PY
