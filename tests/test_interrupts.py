"""Ctrl-C (SIGINT) everywhere: while the models load and mid-run, `run`, `bench` and `verify`
exit 130 with no traceback and leave no partial output file. Real processes and real models:
the demo pair where loading must be caught under way, the tiny models elsewhere.

SIGINT is sent to the process only (it runs in its own session), the way a terminal's Ctrl-C
reaches a foreground process. Every wait is bounded, so a process that ignores the signal
fails the test instead of hanging the suite.

Catching a load under way without timing it: the child's stderr is a pipe shrunk to one page
and left undrained, so with ``--verbose`` the child blocks writing llama.cpp's log lines of
the target's load (metadata, hundreds of lines before any tensor is read). SIGINT is sent
once the pipe is full, then the pipe is drained: the signal is certain to arrive inside the
load. (`specgen.download`'s Ctrl-C test is in test_cli_models.py, against the local Hub.)
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIPE_PAGE = 4096
LINE_MAX = 1024  # longer than any llama.cpp load log line
TIMEOUT_S = 120  # waits for a marker (a loaded machine can be slow; never reached when well)
EXIT_TIMEOUT_S = 30  # after SIGINT: the process must be gone long before this

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="pipe sizes (F_SETPIPE_SZ) are Linux's"
)


class Child:
    """`python -m specgen ARGS` with stdout and stderr collected by threads (stderr's pipe
    can be held full, see the module docstring)."""

    def __init__(self, args: list[str], hold_stderr: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specgen", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.out = bytearray()
        self.err = bytearray()
        self._go = threading.Event()
        if hold_stderr:
            fcntl.fcntl(self.proc.stderr.fileno(), fcntl.F_SETPIPE_SZ, PIPE_PAGE)
        else:
            self._go.set()
        self._threads = [
            threading.Thread(target=self._drain, args=(self.proc.stdout, self.out, None)),
            threading.Thread(target=self._drain, args=(self.proc.stderr, self.err, self._go)),
        ]
        for t in self._threads:
            t.daemon = True
            t.start()

    @staticmethod
    def _drain(stream, buf: bytearray, go: threading.Event | None) -> None:
        if go is not None:
            go.wait()
        for chunk in iter(lambda: stream.read1(65536), b""):
            buf += chunk

    def wait_for(self, ready: Callable[[], bool], what: str) -> None:
        """Poll until `ready()`; fail if the process ends first or after TIMEOUT_S."""
        deadline = time.monotonic() + TIMEOUT_S
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._go.set()
                self.finish()
                pytest.fail(
                    f"never saw {what} (exit {self.proc.returncode})\n"
                    + self.err.decode("utf-8", "replace")[-3000:]
                )
            time.sleep(0.01)

    def stderr_pipe_full(self) -> bool:
        assert self.proc.stderr is not None
        n = bytearray(4)
        fcntl.ioctl(self.proc.stderr.fileno(), termios.FIONREAD, n)
        # A write of a whole log line is atomic (<= PIPE_BUF): the child blocks as soon as the
        # next line does not fit, which can leave up to a line's length unused. Log lines are
        # far shorter than LINE_MAX, and how full the page ends up depends on their lengths
        # (model paths appear in them).
        return int.from_bytes(n, sys.byteorder) >= PIPE_PAGE - LINE_MAX

    def interrupt(self) -> tuple[int, str, str]:
        """SIGINT, then (exit code, stdout, stderr) once the process has ended."""
        self.proc.send_signal(signal.SIGINT)
        self._go.set()
        return self.finish()

    def finish(self) -> tuple[int, str, str]:
        try:
            self.proc.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail("still running after SIGINT\n" + self.err.decode("utf-8", "replace"))
        finally:
            for t in self._threads:
                t.join(timeout=10)
        return (
            self.proc.returncode,
            self.out.decode("utf-8", "replace"),
            self.err.decode("utf-8", "replace"),
        )


def assert_clean_interrupt(code: int, err: str) -> None:
    assert code == 130, err[-3000:]
    assert "Traceback" not in err, err
    assert "Exception ignored" not in err, err  # nothing raised inside a ctypes callback
    assert "specgen: error" not in err, err


def no_files_but(directory: Path, *names: str) -> None:
    """Nothing in `directory` but `names`: no output file, no temporary file left over."""
    assert sorted(p.name for p in directory.iterdir()) == sorted(names)


# -- while the models load --------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "bench", "verify"])
def test_ctrl_c_while_the_models_load_cancels_the_load(command, demo_pair, tmp_path):
    t, d = demo_pair
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    extra = {
        "run": ["-n", "8", "Once upon a time"],
        "bench": ["--runs", "1", "-n", "8", "--json", str(out_dir / "b.json")],
        "verify": ["--check", "greedy"],
    }[command]
    child = Child([command, "-m", str(t), "-md", str(d), "--verbose", *extra], hold_stderr=True)
    child.wait_for(child.stderr_pipe_full, "llama.cpp's load log filling stderr")
    code, out, err = child.interrupt()
    assert_clean_interrupt(code, err)
    # llama.cpp's own word that the progress callback stopped the load
    assert "cancelled model load" in err
    assert "llama_context" not in err  # no context was created after the cancelled load
    assert out == ""
    no_files_but(out_dir)


# -- mid-run ----------------------------------------------------------------------------------


def test_ctrl_c_mid_run_keeps_the_text_and_exits_130(demo_pair):
    t, d = demo_pair
    child = Child(
        ["run", "-m", str(t), "-md", str(d), "-n", "2000", "--temp", "0", "--ignore-eos",
         "Write a very long story about a dragon."]
    )  # fmt: skip
    # text, not only whitespace: the first token here is "\n", and a signal that lands
    # right after a round of one token (a busy machine's fallback round) keeps only that
    child.wait_for(lambda: child.out.strip() != b"", "generated text on stdout")
    code, out, err = child.interrupt()
    assert_clean_interrupt(code, err)
    assert out.strip()  # the text so far stays


def test_ctrl_c_mid_run_json_reports_the_interrupted_generation(demo_pair, tmp_path):
    t, d = demo_pair
    trace = tmp_path / "run.jsonl"
    child = Child(
        ["run", "-m", str(t), "-md", str(d), "-n", "2000", "--temp", "0", "--ignore-eos",
         "--json", "--trace", str(trace), "Write a very long story about a dragon."]
    )  # fmt: skip
    child.wait_for(
        lambda: trace.exists() and '"type": "round"' in trace.read_text("utf-8"),
        "a round in the trace",
    )
    code, out, err = child.interrupt()
    assert_clean_interrupt(code, err)
    obj = json.loads(out)
    assert obj["finish_reason"] == "interrupted"
    assert 0 < len(obj["tokens"]) < 2000 and obj["stats"]["n_generated"] == len(obj["tokens"])


def test_ctrl_c_mid_bench_prints_what_was_finished_and_writes_no_file(
    tiny_target, tiny_draft, tmp_path
):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    trace = tmp_path / "bench.jsonl"
    prompts = tmp_path / "prompts.txt"  # short: the tiny models' context is 512
    prompts.write_text("the cat\na dog and\nonce upon\nwe the\n", encoding="utf-8")
    child = Child(
        ["bench", "-m", str(tiny_target), "-md", str(tiny_draft), "-c", "512", "-n", "400",
         "--runs", "5", "--draft-max", "4", "--prompts", str(prompts),
         "--json", str(out_dir / "b.json"), "--markdown", str(out_dir / "b.md"),
         "--trace", str(trace)]
    )  # fmt: skip

    def one_pair_measured() -> bool:
        # an ordinary and a speculative generation counted: a third has ended (the second's
        # end is in the trace before bench counts it, and a Ctrl-C between the two, more
        # likely on a loaded machine, left no pair and so no table)
        return trace.exists() and trace.read_text("utf-8").count('"type": "end"') >= 3

    child.wait_for(one_pair_measured, "a finished pair of generations in the trace")
    code, out, err = child.interrupt()
    assert_clean_interrupt(code, err)
    no_files_but(out_dir)
    assert out.startswith("incomplete: interrupted (Ctrl-C)"), out
    assert "speculative vs ordinary decoding" in out  # the table of what was finished
    assert re.search(r"interrupted \(Ctrl-C\) after \d+ of \d+ measured generations", err), err


def test_ctrl_c_mid_verify_exits_130(tiny_target, tiny_draft):
    child = Child(
        ["verify", "-m", str(tiny_target), "-md", str(tiny_draft), "-c", "512",
         "--samples", "20000", "--json"]
    )  # fmt: skip
    # the stage line is printed as the sampling check starts, which then runs 20,000
    # generations: the signal lands inside it whatever the machine's speed
    child.wait_for(lambda: b"sampling: prompt 1/" in child.err, "the sampling check starting")
    code, out, err = child.interrupt()
    assert_clean_interrupt(code, err)
    assert out == ""  # no report of a check that did not finish


# -- a long decode --------------------------------------------------------------------------


def test_ctrl_c_aborts_a_long_decode_and_leaves_the_cache_as_it_was(tiny_target):
    from specgen import llamacpp

    with llamacpp.LlamaEngine(tiny_target, llamacpp.EngineConfig(n_ctx=512)) as engine:
        engine.decode([1, 20, 30])
        # as the SIGINT handler of a long call does: the abort callback sees it at once
        llamacpp.signals._interrupted.set()
        with pytest.raises(KeyboardInterrupt):
            engine.decode(list(range(10, 10 + 200)))  # a prompt chunk: abortable
        assert any("ret = 2" in line for line in llamacpp.signals._recent_log)  # llama.cpp aborted
        assert engine.tokens == [1, 20, 30]
        engine.truncate(3)  # raises if the cache holds anything past the 3 tokens
        # the interrupt was delivered once: the engine goes on working
        assert engine.decode(list(range(10, 10 + 200))).shape == (1, engine.n_vocab)
        assert len(engine.tokens) == 203
