"""GGUF files other tools already keep (`specgen models --local`, `-md auto`): fixture folders
laid out as the Hugging Face cache, llama.cpp's cache, LM Studio and Ollama lay them out, with
tiny synthetic models (their headers are read, nothing is loaded but in the last test)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tinymodels as gguf_tools
from hubserver import isolate_env, tiny_gguf

from specgen.models import local
from specgen.models.header import read_vocab


def _write(path: Path, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    gguf_tools.write_tiny_llama(path, **kw)
    return path


@pytest.fixture
def machine(tmp_path, monkeypatch) -> dict[str, Path]:
    """A home directory holding models from four tools; returns the interesting paths."""
    isolate_env(monkeypatch, tmp_path)
    for var in ("LLAMA_CACHE", "OLLAMA_MODELS", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    src = tmp_path / "src"
    # Hugging Face: the target, as a blob linked from two snapshots (listed once)
    target = _write(src / "target.gguf", seed=0)  # 2 blocks, width 64: ~473 kB
    repo = tmp_path / "hf" / "hub" / "models--org--tiny-GGUF"
    blob = repo / "blobs" / "0123abcd"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(target.read_bytes())
    for commit in ("a" * 40, "b" * 40):
        snap = repo / "snapshots" / commit / "tiny-f32.gguf"
        snap.parent.mkdir(parents=True)
        snap.symlink_to(os.path.relpath(blob, snap.parent))
    # llama.cpp's cache: a small draft of the same family, flat, beside its etag file
    lcpp = home / ".cache" / "llama.cpp"
    small = _write(lcpp / "org_tiny-GGUF_tiny-small.gguf", seed=0, n_layer=1, n_embd=32)
    (lcpp / "org_tiny-GGUF_tiny-small.gguf.json").write_text("{}")
    # LM Studio: one token renamed (another tokenizer), a projector without one, a split set
    lms = home / ".lmstudio" / "models"
    mismatch = lms / "pub" / "odd-GGUF" / "odd.gguf"
    mismatch.parent.mkdir(parents=True)
    gguf_tools.replace_token(small, mismatch, 262, "▁zzz")
    tiny_gguf(_mkdir(lms / "pub" / "vision-GGUF") / "mmproj.gguf")
    shard1 = _write(lms / "pub" / "split-GGUF" / "split-00001-of-00002.gguf", seed=3)
    shard2 = lms / "pub" / "split-GGUF" / "split-00002-of-00002.gguf"
    tiny_gguf(shard2)
    # Ollama: a manifest naming its model blob (and a template layer that is not GGUF)
    om = home / ".ollama" / "models"
    smallest = _write(src / "smallest.gguf", seed=0, n_layer=1, n_embd=16)
    digest = "f" * 64
    (om / "blobs").mkdir(parents=True)
    (om / "blobs" / f"sha256-{digest}").write_bytes(smallest.read_bytes())
    (om / "blobs" / f"sha256-{'e' * 64}").write_text("{{ .Prompt }}")
    manifest = om / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}"},
        {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{'e' * 64}"},
    ]}))  # fmt: skip
    return {
        "target": repo / "snapshots" / ("a" * 40) / "tiny-f32.gguf",
        "small": small,
        "smallest": om / "blobs" / f"sha256-{digest}",
        "mismatch": mismatch,
        "shard1": shard1,
        "shard2": shard2,
    }


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def _ours(models, tmp_root: Path):
    # /usr/share/ollama (the Linux service's store) is searched too; keep to the fixture
    return [m for m in models if str(m.path).startswith(str(tmp_root))]


def test_each_tools_layout_is_found_and_named_as_the_tool_names_it(machine, tmp_path):
    found = {m.name: m for m in _ours(local.find_local(), tmp_path)}
    assert set(found) == {
        "org/tiny-GGUF/tiny-f32.gguf",
        "org_tiny-GGUF_tiny-small.gguf",
        "pub/odd-GGUF/odd.gguf",
        "pub/vision-GGUF/mmproj.gguf",
        "pub/split-GGUF/split-00001-of-00002.gguf",
        "tiny:latest",
    }  # the second snapshot's link, the blob itself, shard 2 and the template: not models
    assert found["org/tiny-GGUF/tiny-f32.gguf"].source == local.HUGGING_FACE
    assert found["org_tiny-GGUF_tiny-small.gguf"].source == local.LLAMA_CPP
    assert found["pub/odd-GGUF/odd.gguf"].source == local.LM_STUDIO
    assert found["tiny:latest"].source == local.OLLAMA
    assert found["tiny:latest"].path == machine["smallest"]
    split = found["pub/split-GGUF/split-00001-of-00002.gguf"]
    assert split.size_bytes == machine["shard1"].stat().st_size + machine["shard2"].stat().st_size
    assert found["org/tiny-GGUF/tiny-f32.gguf"].size_bytes == machine["target"].stat().st_size
    assert found["pub/vision-GGUF/mmproj.gguf"].vocab is None


def test_environment_overrides_move_the_search(machine, tmp_path, monkeypatch):
    moved = tmp_path / "elsewhere"
    monkeypatch.setenv("OLLAMA_MODELS", str(moved / "ollama"))
    monkeypatch.setenv("LLAMA_CACHE", str(moved / "llama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(moved / "hub"))
    monkeypatch.setenv("SPECGEN_CACHE", str(moved / "specgen"))
    roots = dict((tool, p) for tool, p in local.search_roots() if tool != local.LM_STUDIO)
    assert roots == {
        local.HUGGING_FACE: moved / "hub",
        local.LLAMA_CPP: moved / "llama",
        local.SPECGEN: moved / "specgen",
        local.OLLAMA: moved / "ollama",
    }
    names = {m.name for m in _ours(local.find_local(), tmp_path)}
    assert "tiny:latest" not in names and "org/tiny-GGUF/tiny-f32.gguf" not in names


def test_models_are_grouped_by_the_vocabulary_checks_rules(machine, tmp_path):
    groups = local.group_by_tokenizer(_ours(local.find_local(), tmp_path))
    names = [[m.name for m in g.models] for g in groups]
    # one family, largest first (the split set's seed differs: weights, not tokens); one
    # renamed token is another tokenizer; no tokenizer last
    assert names == [
        ["pub/split-GGUF/split-00001-of-00002.gguf", "org/tiny-GGUF/tiny-f32.gguf",
         "org_tiny-GGUF_tiny-small.gguf", "tiny:latest"],
        ["pub/odd-GGUF/odd.gguf"],
        ["pub/vision-GGUF/mmproj.gguf"],
    ]  # fmt: skip
    v = groups[0].vocab
    assert (v.vocab_type, v.n_vocab, v.bos, v.eos, v.add_bos, v.add_eos) == (
        1,
        272,
        1,
        2,
        True,
        False,
    )
    assert groups[-1].vocab is None


def test_the_draft_is_the_smallest_compatible_file_at_most_half_the_target(machine, tmp_path):
    models = _ours(local.find_local(), tmp_path)
    best, fits = local.draft_for(machine["target"], models)
    assert best is not None and best.name == "tiny:latest"
    assert [m.name for m in fits] == ["tiny:latest", "org_tiny-GGUF_tiny-small.gguf"]
    # nothing is half the size of the smallest file
    assert local.draft_for(machine["smallest"], models) == (None, [])


def test_models_local_lists_the_groups_with_sizes(machine, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specgen.cli.app import app

    monkeypatch.delenv("COLUMNS", raising=False)
    out = CliRunner().invoke(app, ["models", "--local"]).output
    # two groups of one kind and size, told apart by number (their tokens differ)
    assert "tokenizer 1: SentencePiece 272 · BOS 1 · EOS 2" in out
    assert "tokenizer 2: SentencePiece 272 · BOS 1 · EOS 2" in out and "no tokenizer" in out
    row = next(line for line in out.splitlines() if "tiny:latest" in line)
    assert "Ollama" in row and str(machine["smallest"]) in row and " kB" in row
    assert "-md auto" in out and "looked in: Hugging Face" in out
    data = json.loads(CliRunner().invoke(app, ["models", "--local", "--json"]).output)
    first = data["groups"][0]
    assert first["tokenizer"]["n_vocab"] == 272
    assert "tiny:latest" in [m["name"] for m in first["models"]]
    assert data["groups"][-1]["tokenizer"] is None


def test_run_without_a_draft_names_the_local_one_and_auto_uses_it(machine, capsys):
    from specgen.cli.app import main

    def run(*argv: str) -> int:
        with pytest.raises(SystemExit) as exc:
            main(["run", "-m", str(machine["target"]), *argv])
        return int(exc.value.code or 0)

    assert run("x") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--target needs --draft too" in err
    assert "tiny:latest (Ollama" in err and "-md auto uses it" in err
    code = run("-md", "auto", "--json", "-n", "4", "-c", "256", "--temp", "0", "the cat")
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["draft"] == machine["smallest"].name  # the Ollama blob
    assert f"note: -md auto chose {machine['smallest'].name}" in out.err  # said, not silent


def test_auto_with_nothing_on_disk_says_where_it_looked(tmp_path, monkeypatch, capsys):
    from specgen.cli.app import main

    isolate_env(monkeypatch, tmp_path)
    target = _write(tmp_path / "t.gguf", seed=0)
    with pytest.raises(SystemExit) as exc:
        main(["run", "-m", str(target), "-md", "auto", "x"])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.count("\n") == 1 and "-md auto: no GGUF on disk" in err


def test_the_header_reader_agrees_with_the_gguf_package(tiny_target):
    import gguf

    v = read_vocab(tiny_target)
    reader = gguf.GGUFReader(str(tiny_target))
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]) for i in field.data]
    assert list(v.tokens) == tokens and v.architecture == "llama"
