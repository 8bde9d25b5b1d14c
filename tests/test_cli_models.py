"""`specgen download` and `specgen models` through Typer, against the local Hub server."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hubserver import HubServer, hub_env, isolate_env, tiny_gguf
from typer.testing import CliRunner

from specgen.cli.app import app
from specgen.errors import SpecgenError


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate_env(monkeypatch, tmp_path)
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "demo-cache"))
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def hub(monkeypatch):
    server = HubServer().start()
    hub_env(monkeypatch, HF_ENDPOINT=server.url)
    yield server
    server.stop()


@pytest.fixture
def reg_file(tmp_path, hub) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": tiny_gguf(src / "t.gguf", 8192, 1)})
    hub.add_repo("org/draft-GGUF", {"draft-q4_0.gguf": tiny_gguf(src / "d.gguf", 1024, 2)})
    f = tmp_path / "reg.yaml"
    f.write_text("""
models:
  tgt: {repo: org/target-GGUF, file: target-q8_0.gguf, quant: Q8_0, size_gb: 0.01}
  drf: {repo: org/draft-GGUF, file: "draft-*.gguf"}
  typo: {repo: org/draft-GGUF, file: draft-q8_0.gguf}
pairs:
  tiny: {target: tgt, draft: drf, draft_max: 4, note: a test pair}
""")
    return f


def invoke(*args: str):
    """Run a command of the app; SpecgenError becomes exit 1 and one line, as in cli.app.main."""
    result = CliRunner().invoke(app, list(args))
    if isinstance(result.exception, SpecgenError):
        result.exit_code = 1
        result.message = str(result.exception)
    return result


def test_models_lists_the_packaged_registry():
    result = invoke("models")
    assert result.exit_code == 0, result.output
    for name in ("demo", "qwen2.5-coder-7b", "qwen2.5-coder-14b-q8", "gemma3-270m-f32"):
        assert name in result.output
    assert "not verified" in result.output


def test_download_a_pair_then_models_shows_it(reg_file, hub, monkeypatch):
    before = json.loads(invoke("models", "--json", "--models", str(reg_file)).output)
    assert not any(p["ready"] for p in before["pairs"] if p["name"] == "tiny")
    result = invoke("download", "tiny", "--models", str(reg_file))
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["tgt", "drf"]
    paths = [Path(line.split("\t")[1]) for line in lines]
    assert all(p.read_bytes().startswith(b"GGUF") for p in paths)

    after = json.loads(invoke("models", "--json", "--models", str(reg_file)).output)
    rows = {r["name"]: r for r in after["models"]}
    assert rows["tgt"]["downloaded"] and rows["tgt"]["path"] == str(paths[0])
    assert rows["tgt"]["bytes_on_disk"] == paths[0].stat().st_size
    assert not rows["typo"]["downloaded"] and rows["typo"]["path"] is None
    assert [p["ready"] for p in after["pairs"] if p["name"] == "tiny"] == [True]
    monkeypatch.setenv("COLUMNS", "400")
    table = invoke("models", "--models", str(reg_file)).output
    assert str(paths[1]) in table and "a test pair" in table

    again = invoke("download", "tgt", "--models", str(reg_file))
    assert again.exit_code == 0 and len(hub.file_gets()) == 2


def test_dry_run_fetches_nothing(reg_file, hub):
    result = invoke("download", "tiny", "--dry-run", "--models", str(reg_file))
    assert result.exit_code == 0, result.output
    assert "target-GGUF/target-q8_0.gguf" in result.stdout
    assert "draft-GGUF/draft-q4_0.gguf" in result.stdout
    assert result.stdout.count("to download") == 2
    assert hub.file_gets() == []


def test_dry_run_offline_shows_what_the_registry_knows_and_what_it_did_not_check(
    reg_file, hub, monkeypatch
):
    hub_env(monkeypatch, HF_HUB_OFFLINE="1")
    result = invoke("download", "tiny", "--dry-run", "--models", str(reg_file))
    assert result.exit_code == 0, result.output  # the plan is what a dry run is for
    assert result.stdout.splitlines() == [
        "tgt\torg/target-GGUF/target-q8_0.gguf\t~0.01 GB\tnot checked",
        "drf\torg/draft-GGUF/draft-*.gguf\tsize unknown\tnot checked",
    ]
    (line,) = result.stderr.splitlines()
    assert line.startswith("specgen: note: HF_HUB_OFFLINE is set: ") and "not checked" in line
    assert hub.requests == []


@pytest.mark.parametrize("file", ["m-q8_0.gguf", "m-*.gguf"])
def test_dry_run_without_a_network_shows_the_plan_fast_and_quietly(tmp_path, monkeypatch, file):
    # a glob needs the repository's listing, which huggingface_hub's paging retried 5 times
    # (24 s of "Retrying in 8s [Retry 5/5]") where an exact name failed at once (issue 22)
    import time

    sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", sleeps.append)  # a retry waits first: none may
    reg = tmp_path / "reg.yaml"  # HF_ENDPOINT is a closed port (isolate_env)
    reg.write_text(f"models:\n  m: {{repo: org/m-GGUF, file: '{file}', size_gb: 4.7}}\n")
    result = invoke("download", "m", "--dry-run", "--models", str(reg))
    assert result.exit_code == 0, result.output
    assert result.stdout == f"m\torg/m-GGUF/{file}\t~4.7 GB\tnot checked\n"
    (line,) = result.stderr.splitlines()  # one note: no retry lines, no traceback
    assert line.startswith("specgen: note: cannot reach http://127.0.0.1:9 (")
    assert "nothing was downloaded" in line and "HF_HUB_OFFLINE" not in line
    assert sleeps == []


def test_embedded_pair_dry_run_downloads_nothing():
    result = invoke("download", "demo", "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("embedded demo model") == 2


def test_errors_are_one_line(reg_file):
    result = invoke("download", "nope", "--models", str(reg_file))
    assert result.exit_code == 1 and "neither a pair nor a model" in result.message
    result = invoke("download", "typo", "--models", str(reg_file))
    assert result.exit_code == 1 and "its .gguf files: draft-q4_0.gguf" in result.message
    assert "\n" not in result.message
    result = invoke("download", "tiny", "--revision", "v1", "--models", str(reg_file))
    assert result.exit_code == 1 and "--revision applies to one model" in result.message


def test_bad_models_file_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  m: {repo: o/r, file: x.gguf, colour: red}\n")
    result = invoke("models", "--models", str(bad))
    assert result.exit_code == 1
    assert result.message.startswith(f"{bad}: models.m.colour: unknown key")


def test_the_real_cli_registers_these_commands(reg_file, capsys):
    cli = pytest.importorskip("specgen.cli.app")
    with pytest.raises(SystemExit) as code:
        cli.main(["download", "typo", "--models", str(reg_file)])
    assert code.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("specgen: error: org/draft-GGUF has no file matching")
    assert err.count("\n") == 1


def test_a_download_that_failed_its_checksum_shows_as_failed_and_is_not_run(
    tmp_path, hub, monkeypatch, capsys
):
    src = tmp_path / "src"
    src.mkdir()
    good = tiny_gguf(src / "t.gguf", 8192, 1)
    bad = good[:-1] + bytes([good[-1] ^ 1])
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": bad})
    reg = tmp_path / "reg.yaml"
    sha = hashlib.sha256(good).hexdigest()
    reg.write_text(
        f"models:\n  tgt: {{repo: org/target-GGUF, file: target-q8_0.gguf, sha256: {sha}}}\n"
    )
    result = invoke("download", "tgt", "--models", str(reg))
    assert result.exit_code == 1 and "SHA-256 mismatch" in result.message

    [row] = [
        r
        for r in json.loads(invoke("models", "--json", "--models", str(reg)).output)["models"]
        if r["name"] == "tgt"
    ]
    assert (row["status"], row["downloaded"]) == ("failed SHA-256", False)
    assert row["path"] and "specgen download tgt --force" in row["problem"]
    monkeypatch.setenv("COLUMNS", "400")
    table = invoke("models", "--models", str(reg)).output
    assert "failed SHA-256" in table and "specgen download tgt --force" in table

    cli = pytest.importorskip("specgen.cli.app")
    with pytest.raises(SystemExit) as code:
        cli.main(["run", "-m", "tgt", "-md", "none", "--models", str(reg), "-n", "1", "hi"])
    assert code.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("specgen: error: tgt failed its SHA-256 check")
    assert "specgen download tgt --force" in err and err.count("\n") == 1


def test_ctrl_c_during_a_download_exits_130_and_keeps_the_partial_file_to_resume(tmp_path, hub):
    import os
    import signal
    import subprocess
    import sys
    import time

    from specgen.models.download import download_model
    from specgen.models.hub import find_cached
    from specgen.models.registry import load_registry

    src = tmp_path / "src"
    src.mkdir()
    data = tiny_gguf(src / "t.gguf", 64 * 1024, 1)  # 256 KiB: 64 slow pieces, 6 s in all
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": data})
    hub.slow_down(data, 0.1)
    reg = tmp_path / "reg.yaml"
    reg.write_text("models:\n  tgt: {repo: org/target-GGUF, file: target-q8_0.gguf}\n")
    blobs = tmp_path / "hf" / "hub" / "models--org--target-GGUF" / "blobs"
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgen", "download", "tgt", "--models", str(reg)],
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300  # never reached when well: a wait, not a bound
        while not any(p.stat().st_size for p in blobs.glob("*.incomplete")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert b"Traceback" not in err and out == b""
    [partial] = blobs.glob("*.incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < len(data) and data.startswith(partial.read_bytes())
    entry = load_registry(reg).model("tgt")
    assert find_cached(entry) is None  # nothing where a model is loaded from
    assert sorted(p.name for p in blobs.iterdir()) == [partial.name]

    hub.slow.clear()
    result = download_model(entry)
    assert result.path.read_bytes() == data and result.transferred_bytes == len(data) - kept
    assert hub.file_gets()[-1].range == f"bytes={kept}-"


def test_models_shows_which_pairs_chat(monkeypatch):
    pairs = {p["name"]: p for p in json.loads(invoke("models", "--json").output)["pairs"]}
    assert pairs["llama3.1-8b"]["chat"] is True and pairs["demo"]["chat"] is False
    monkeypatch.setenv("COLUMNS", "200")
    lines = invoke("models").output.splitlines()
    header = next(line for line in lines if " chat " in line and "ready" in line)
    col = header.index(" chat ") + 1
    assert (
        next(line for line in lines if line.strip().startswith("gemma3-4b "))[col : col + 3]
        == "yes"
    )
    assert (
        next(line for line in lines if line.strip().startswith("demo "))[col : col + 3].strip()
        == ""
    )


def test_models_into_a_file_keeps_every_cell_whole(monkeypatch):
    # `specgen models > file`: no terminal, so no 80-column wrapping (issue 22 saw "good for"
    # cut into 7-character pieces)
    monkeypatch.delenv("COLUMNS", raising=False)
    from specgen.models.registry import load_registry

    out = invoke("models").output
    for pair in load_registry().pairs.values():
        row = next(line for line in out.splitlines() if line.strip().startswith(pair.name + " "))
        assert pair.note in row


def test_a_reader_that_went_away_is_not_an_error(tmp_path):
    """`specgen models | head -1`: the reader closes the pipe before the listing is written;
    what it read was what it wanted, so the exit status is 0 and stderr stays empty (it
    was 1, with nothing said). The read end is closed before the process starts writing."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPECGEN_CACHE": str(tmp_path)}
    p = subprocess.Popen(
        [sys.executable, "-m", "specgen", "models"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0 and err == b"", err


@pytest.mark.parametrize("content", [None, "models: [unclosed"])
def test_a_models_file_is_read_even_for_the_demo_pair(tmp_path, content):
    """`specgen run --models FILE` with no -m runs the embedded demo pair, which needs no
    name from FILE: a missing or broken FILE is still refused, as with -m NAME (it was
    never read)."""
    from specgen.models.resolve import resolve_models

    f = tmp_path / "reg.yaml"
    if content is not None:
        f.write_text(content)
    with pytest.raises(SpecgenError, match=str(f)):
        resolve_models(None, None, None, f)
    result = invoke("run", "--models", str(f), "-n", "1", "hi")
    assert result.exit_code == 1 and str(f) in result.message
