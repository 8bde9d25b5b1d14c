"""`specgen bench --url` end to end against the stub server (tests/openai_stub.py): the tables,
the files, --compare, bad input as one line, and Ctrl-C mid-sweep (exit 130, the finished
levels headed incomplete)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from openai_stub import Stub, StubConfig

ROOT = Path(__file__).resolve().parent.parent


def _main(argv: list[str]) -> int:
    from specgen.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0)


def test_a_sweep_side_by_side_with_files_and_compare(tmp_path: Path, capsys) -> None:
    first, second, md = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "a.md"
    with Stub(StubConfig(spec="timings")) as a, Stub() as b:
        base = ["bench", "--url", a.url, "--label", "llama", "--url", b.url, "--label", "spec",
                "--concurrency", "1,2", "--num-prompts", "4", "-n", "8", "--slo", "ttft=60000"]  # fmt: skip
        assert _main([*base, "--json", str(first), "--markdown", str(md)]) == 0
        out = capsys.readouterr().out
        assert _main([*base, "--json", str(second), "--compare", str(first)]) == 0
        err = capsys.readouterr().err
    assert "servers under load" in out and "2 streams" in out and "llama" in out
    data = json.loads(first.read_text())
    assert data["format"] == "specgen-bench-load/1"
    assert [(r["label"], r["level"]["concurrency"]) for r in data["runs"]] == [
        ("llama", 1), ("spec", 1), ("llama", 2), ("spec", 2)
    ]  # fmt: skip
    assert data["runs"][0]["summary"]["acceptance_rate"] == pytest.approx(0.25)
    assert data["runs"][1]["vs"] == "llama" and data["runs"][1]["ratio"]["n_pairs"] == 4
    assert data["record"]["servers"][0]["models"]["data"][0]["id"] == "stub-model"
    assert data["record"]["settings"]["endpoint"] == "completions"
    # the client's machine as bench's own record describes one (without llama.cpp's view)
    assert set(data["record"]["machine"]) == {
        "cpu",
        "cpu_count",
        "memory_bytes",
        "os",
        "python",
        "gpus",
    }
    assert "api_key" not in json.dumps(data["record"])
    assert "| 0 | 2 streams | spec |" in md.read_text() and "vLLM's definition" in md.read_text()
    assert "compared with" in err and "not comparable" not in err and "tok/s (" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "ftp://x"], "--url needs http://"),
        (["--url", "http://127.0.0.1:9", "-m", "x.gguf"], "-m chooses models"),
        (["--url", "http://127.0.0.1:9", "--slo", "fast"], "--slo"),
        (["--url", "http://127.0.0.1:9", "--concurrency", "0"], "--concurrency"),
        (["--url", "http://127.0.0.1:9", "--request-rate", "1", "--concurrency", "1,2"], "one cap"),
        (["--url", "http://127.0.0.1:9", "--endpoint", "rest"], "--endpoint"),
        (["--url", "http://127.0.0.1:9", "--kind", "poems"], "--kind"),
        (["--url", "http://127.0.0.1:9"], "cannot reach the server"),  # nothing listens on 9
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str, capsys) -> None:
    assert _main(["bench", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_compare_refuses_a_file_that_is_not_a_load_result(tmp_path: Path, capsys) -> None:
    other = tmp_path / "bench.json"
    other.write_text(json.dumps({"format": "specgen-bench/1"}))
    assert _main(["bench", "--url", "http://127.0.0.1:9", "--compare", str(other)]) == 1
    assert "not a specgen bench --url JSON file" in capsys.readouterr().err


def test_ctrl_c_mid_sweep_shows_the_finished_levels_as_incomplete(tmp_path: Path) -> None:
    # warm-up 1 + level one 3 requests; the 5th request (level two) waits for the release,
    # so the signal provably lands while level two is in flight
    with Stub(StubConfig(hold_after=4)) as stub:
        out = tmp_path / "r.json"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specgen",
                "bench",
                "--url",
                stub.url,
                "--concurrency",
                "1,2",
                "--num-prompts",
                "3",
                "-n",
                "8",
                "--json",
                str(out),
            ],  # fmt: skip
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            assert stub.wait_served(5), "the child never reached level two"
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, stderr.decode()
    text = stdout.decode()
    assert "incomplete: interrupted (Ctrl-C); no file written" in text
    assert "1 stream" in text and "2 streams" not in text
    assert not out.exists() and b"Traceback" not in stderr
