"""Downloads for real, against a local server speaking the Hub's file protocol."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hubserver import HubServer, hub_env, isolate_env, tiny_gguf

from specgen.errors import ConfigError, DownloadError, ModelFileError
from specgen.models import hub as hub_api
from specgen.models.download import download_model, plan_download
from specgen.models.hub import blob_and_lock, find_cached
from specgen.models.registry import load_registry
from specgen.models.resolve import resolve_model, resolve_pair


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate_env(monkeypatch, tmp_path)


@pytest.fixture
def hub(monkeypatch):
    server = HubServer().start()
    hub_env(monkeypatch, HF_ENDPOINT=server.url)
    yield server
    server.stop()


@pytest.fixture
def ggufs(tmp_path) -> dict[str, bytes]:
    d = tmp_path / "src"
    d.mkdir()
    files = {
        "target": tiny_gguf(d / "t.gguf", 64 * 1024, seed=1),
        "draft": tiny_gguf(d / "d.gguf", 2048, seed=2),
    }
    for i in range(1, 4):
        files[f"shard{i}"] = tiny_gguf(
            d / f"s{i}.gguf", 4096, seed=10 + i, extra={"split.no": i - 1, "split.count": 3}
        )
    return files


def registry(tmp_path: Path, text: str):
    f = tmp_path / "reg.yaml"
    f.write_text(text)
    return load_registry(f)


PAIR_YAML = """
models:
  tgt: {repo: org/target-GGUF, file: target-q8_0.gguf}
  drf: {repo: org/draft-GGUF, file: "draft-*.gguf"}
pairs:
  tiny: {target: tgt, draft: drf, draft_max: 4}
"""


def test_pair_download_then_resolve(hub, ggufs, tmp_path):
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"], "README.md": b"hi"})
    hub.add_repo("org/draft-GGUF", {"draft-q4_0.gguf": ggufs["draft"]})
    reg = registry(tmp_path, PAIR_YAML)
    with pytest.raises(ConfigError, match="specgen download tiny"):
        resolve_pair(reg, "tiny")
    seen: dict[str, int] = {}
    results = [
        download_model(m, progress=lambda f, n, t: seen.__setitem__(f, n))
        for m in reg.models_for("tiny")
    ]
    assert [r.path.read_bytes() for r in results] == [ggufs["target"], ggufs["draft"]]
    assert seen == {
        "target-q8_0.gguf": len(ggufs["target"]),
        "draft-q4_0.gguf": len(ggufs["draft"]),
    }
    assert all(str(r.path).startswith(str(tmp_path / "hf" / "hub")) for r in results)
    target, draft, k = resolve_pair(reg, "tiny")
    assert (target, draft, k) == (results[0].path, results[1].path, 4)
    assert len(hub.file_gets()) == 2
    # the Hub's CDN is another host: the token never goes there
    assert all(r.auth is None for r in hub.file_gets())


def test_cached_model_is_not_transferred_again(hub, ggufs, tmp_path):
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"]})
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    first = download_model(entry)
    assert first.transferred_bytes == len(ggufs["target"])
    second = download_model(entry)
    assert second.paths == first.paths and second.transferred_bytes == 0
    assert len(hub.file_gets()) == 1
    assert plan_download(entry)[0].cached is True


def test_dry_run_plan_transfers_nothing(hub, ggufs, tmp_path):
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"]})
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    [plan] = plan_download(entry)
    assert (plan.filename, plan.size_bytes, plan.cached) == (
        "target-q8_0.gguf",
        len(ggufs["target"]),
        False,
    )
    assert hub.file_gets() == [] and find_cached(entry) is None


def test_server_cut_half_way_is_resumed_with_a_range(hub, ggufs, tmp_path):
    data = ggufs["target"]
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": data})
    hub.cut_next(data)
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    result = download_model(entry)
    assert result.path.read_bytes() == data
    first, second = hub.file_gets()
    assert first.range is None
    # every byte that arrived before the cut is kept, as it arrives
    assert second.range == f"bytes={len(data) // 2}-"


def test_interrupted_download_leaves_no_final_file_and_next_run_resumes(hub, ggufs, tmp_path):
    data = ggufs["target"]
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": data})
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")

    def ctrl_c_half_way(name: str, done: int, total: int | None) -> None:
        if done > len(data) // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        download_model(entry, progress=ctrl_c_half_way)
    assert find_cached(entry) is None
    blobs = tmp_path / "hf" / "hub" / "models--org--target-GGUF" / "blobs"
    [partial] = blobs.iterdir()
    assert partial.name.endswith(".incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < len(data) and data.startswith(partial.read_bytes())

    result = download_model(entry)
    assert result.path.read_bytes() == data
    assert result.transferred_bytes == len(data) - kept
    assert hub.file_gets()[-1].range == f"bytes={kept}-"
    assert not partial.exists()


def test_a_server_that_ignores_the_range_gets_the_whole_file_again(hub, ggufs, tmp_path):
    data = ggufs["target"]
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": data})
    hub.cut_next(data)
    hub.ignore_range = True
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    result = download_model(entry)
    assert result.path.read_bytes() == data
    first, second = hub.file_gets()
    assert (first.range, second.range) == (None, f"bytes={len(data) // 2}-")
    assert result.transferred_bytes == len(data)  # counted from where it started again


def test_corrupted_bytes_are_caught_by_sha256_and_kept(hub, ggufs, tmp_path):
    good = ggufs["target"]
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": bytes(bad)})
    sha = hashlib.sha256(good).hexdigest()
    reg = registry(
        tmp_path,
        f"""
models:
  tgt: {{repo: org/target-GGUF, file: target-q8_0.gguf, sha256: {sha}}}
""",
    )
    with pytest.raises(ModelFileError, match="SHA-256 mismatch") as err:
        download_model(reg.model("tgt"))
    assert "--force" in str(err.value) and "kept" in str(err.value)
    [kept] = find_cached(reg.model("tgt"))
    assert kept.read_bytes() == bytes(bad)  # nothing deleted silently


def test_not_gguf_is_refused(hub, tmp_path):
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": b"<html>not a model</html>"})
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        download_model(entry)


def test_missing_file_lists_the_repository_ggufs(hub, ggufs, tmp_path):
    hub.add_repo(
        "org/target-GGUF",
        {
            "target-Q4_K_M.gguf": ggufs["target"],
            "target-Q8_0.gguf": ggufs["target"],
            "README.md": b"x",
        },
    )
    reg = registry(
        tmp_path,
        """
models:
  exact: {repo: org/target-GGUF, file: target-q8_0.gguf}
  glob: {repo: org/target-GGUF, file: "*f16*.gguf"}
""",
    )
    for name in ("exact", "glob"):
        with pytest.raises(DownloadError, match="HTTP 404") as err:
            download_model(reg.model(name))
        assert "target-Q4_K_M.gguf, target-Q8_0.gguf" in str(err.value)
        assert "README" not in str(err.value)


def test_split_set_downloads_every_shard_and_loads_the_first(hub, ggufs, tmp_path):
    shards = {f"big-q4_k_m-0000{i}-of-00003.gguf": ggufs[f"shard{i}"] for i in (1, 2, 3)}
    hub.add_repo("org/big-GGUF", {**shards, "big-q8_0.gguf": ggufs["draft"]})
    reg = registry(
        tmp_path,
        """
models:
  big: {repo: org/big-GGUF, file: "big-q4_k_m*.gguf"}
  one: {repo: org/big-GGUF, file: big-q4_k_m-00002-of-00003.gguf}
  both: {repo: org/big-GGUF, file: "big-*.gguf"}
""",
    )
    result = download_model(reg.model("big"))
    assert [p.name for p in result.paths] == sorted(shards)
    assert [p.read_bytes() for p in result.paths] == [shards[n] for n in sorted(shards)]
    assert resolve_model(reg, "big") == result.paths[0]
    # an exact shard name stands for its set, without a listing
    assert download_model(reg.model("one")).paths == result.paths
    with pytest.raises(ModelFileError, match="matches 4 files"):
        download_model(reg.model("both"))


def test_incomplete_split_set_is_refused(hub, ggufs, tmp_path):
    hub.add_repo(
        "org/big-GGUF",
        {"big-00001-of-00003.gguf": ggufs["shard1"], "big-00003-of-00003.gguf": ggufs["shard3"]},
    )
    reg = registry(tmp_path, "models:\n  big: {repo: org/big-GGUF, file: 'big*.gguf'}\n")
    with pytest.raises(ModelFileError, match="missing big-00002-of-00003.gguf"):
        download_model(reg.model("big"))
    one = registry(tmp_path, "models:\n  b: {repo: org/big-GGUF, file: big-00001-of-00003.gguf}\n")
    with pytest.raises(DownloadError, match="HTTP 404"):
        download_model(one.model("b"))
    assert find_cached(reg.model("big")) is None


def test_offline_mode_uses_the_cache_and_never_the_network(hub, ggufs, tmp_path, monkeypatch):
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"]})
    hub.add_repo("org/draft-GGUF", {"draft-q4_0.gguf": ggufs["draft"]})
    reg = registry(tmp_path, PAIR_YAML)
    online = download_model(reg.model("tgt"))
    before = len(hub.requests)
    hub_env(monkeypatch, HF_HUB_OFFLINE="1")
    assert download_model(reg.model("tgt")).paths == online.paths
    assert plan_download(reg.model("tgt"))[0].cached
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE is set.*specgen download drf"):
        download_model(reg.model("drf"))
    assert len(hub.requests) == before


def test_gated_repository_asks_for_a_token_then_works_with_hf_token(
    hub, ggufs, tmp_path, monkeypatch
):
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"]}, gated_token="hf_ok")
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    with pytest.raises(DownloadError, match=r"gated or private \(HTTP 401\).*export HF_TOKEN"):
        download_model(entry)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(DownloadError, match=r"HTTP 403.*HF_TOKEN.*refused"):
        download_model(entry)
    monkeypatch.setenv("HF_TOKEN", "hf_ok")
    assert download_model(entry).path.read_bytes() == ggufs["target"]
    assert all(r.auth is None for r in hub.file_gets())  # not sent to the CDN host


def test_unknown_repository_and_revision(hub, ggufs, tmp_path):
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"]})
    reg = registry(
        tmp_path,
        """
models:
  gone: {repo: org/nothing-here, file: x.gguf}
  tgt: {repo: org/target-GGUF, file: target-q8_0.gguf}
""",
    )
    with pytest.raises(DownloadError, match="repository org/nothing-here not found"):
        download_model(reg.model("gone"))
    with pytest.raises(DownloadError, match="no revision 'v9'"):
        download_model(reg.model("tgt"), revision="v9")


def test_no_network_is_one_clear_error(tmp_path):
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    with pytest.raises(DownloadError, match="cannot reach http://127.0.0.1:9.*HF_HUB_OFFLINE"):
        download_model(entry)


def test_full_disk_is_refused_before_transfer(hub, ggufs, tmp_path, monkeypatch):
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"]})
    monkeypatch.setattr(hub_api, "_free_bytes", lambda folder: 1000)
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    with pytest.raises(DownloadError, match="not enough disk space.*HF_HOME"):
        download_model(entry)
    assert hub.file_gets() == []


def test_embedded_models_are_not_downloadable(tmp_path):
    reg = load_registry()
    with pytest.raises(ConfigError, match="embedded"):
        download_model(reg.model("gemma3-270m-q4"))


def test_a_corrupted_cache_is_reported_then_force_downloads_again(hub, ggufs, tmp_path):
    good = ggufs["target"]
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": good})
    sha = hashlib.sha256(good).hexdigest()
    entry = registry(
        tmp_path,
        f"""
models:
  tgt: {{repo: org/target-GGUF, file: target-q8_0.gguf, sha256: {sha}}}
""",
    ).model("tgt")
    path = download_model(entry).path
    blob = path.resolve()
    blob.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # bit rot in the cache
    with pytest.raises(ModelFileError, match="SHA-256 mismatch.*--force"):
        download_model(entry)
    assert download_model(entry, force=True).path.read_bytes() == good
    assert len(hub.file_gets()) == 2


def test_a_file_that_failed_its_checksum_is_never_loaded(hub, ggufs, tmp_path):
    good = ggufs["target"]
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": bytes(bad)})
    sha = hashlib.sha256(good).hexdigest()
    text = "models:\n  tgt: {repo: org/target-GGUF, file: target-q8_0.gguf, sha256: %s}\n"
    reg = registry(tmp_path, text % sha)
    with pytest.raises(ModelFileError, match="SHA-256 mismatch"):
        download_model(reg.model("tgt"))
    [kept] = find_cached(reg.model("tgt"))
    assert kept.read_bytes() == bytes(bad)  # still on disk, not deleted silently
    for attempt in range(2):  # refused when resolved, and again after a plain download
        with pytest.raises(ModelFileError, match="failed its SHA-256 check") as err:
            resolve_model(reg, "tgt")
        assert "specgen download tgt --force" in str(err.value) and str(kept) in str(err.value)
        if attempt == 0:
            with pytest.raises(ModelFileError, match="SHA-256 mismatch"):
                download_model(reg.model("tgt"))
    # the user says so: the registry now expects the digest the file has
    got = hashlib.sha256(bytes(bad)).hexdigest()
    assert resolve_model(registry(tmp_path, text % got), "tgt") == kept
    # or the file is replaced: `--force` downloads good bytes, which load again
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": good})
    fixed = download_model(reg.model("tgt"), force=True)
    assert fixed.path.read_bytes() == good
    assert resolve_model(reg, "tgt") == fixed.path


def test_registry_modules_import_nothing_heavy():
    import subprocess
    import sys

    code = (
        "import sys, specgen.models.registry, specgen.models.hub, specgen.models.files;"
        "print(sorted(m for m in ('huggingface_hub', 'yaml', 'rich', 'typer', 'llama_cpp')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- what hub.py relies on in huggingface_hub (these fail when upstream changes it) -----------


def test_upstream_hf_hub_download_does_not_resume_so_hub_transfer_does(hub, ggufs, tmp_path):
    """hub._transfer exists because an interrupted hf_hub_download keeps no partial file.
    If this fails, upstream resumes again: replace hub._transfer with hf_hub_download."""
    from huggingface_hub import hf_hub_download
    from tqdm.auto import tqdm

    data = ggufs["target"]
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": data})
    hub.slow_down(data, 0.001)  # several reads, so the bar sees progress before the end

    class CtrlC(tqdm):
        def update(self, n=1):
            super().update(n)
            if self.n > len(data) // 4:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hf_hub_download("org/target-GGUF", "target-q8_0.gguf", tqdm_class=CtrlC)
    blobs = tmp_path / "hf" / "hub" / "models--org--target-GGUF" / "blobs"
    assert list(blobs.iterdir()) == []


def test_upstream_blob_layout_is_what_resuming_writes_to(hub, ggufs):
    """hub.blob_and_lock names the blob hf_hub_download links; hub.fetch puts bytes there."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"]})
    path = hf_hub_download("org/target-GGUF", "target-q8_0.gguf")
    meta = get_hf_file_metadata(hf_hub_url("org/target-GGUF", "target-q8_0.gguf"))
    blob, lock = blob_and_lock("org/target-GGUF", meta.etag)
    assert Path(path).resolve() == blob.resolve() and blob.read_bytes() == ggufs["target"]
    assert lock.is_file()  # the lock hf_hub_download took for this blob


def test_upstream_http_client_is_httpx2():
    """hub.py streams with get_session() and catches httpx2.TransportError."""
    import httpx2
    from huggingface_hub.utils import get_session

    assert isinstance(get_session(), httpx2.Client)


def test_a_hub_etag_that_is_not_a_digest_writes_nothing_outside_the_cache(hub, ggufs, tmp_path):
    """The ETag names the blob's file: "../../x" replaced x with the server's bytes (and
    --force deleted it first), from any HF_ENDPOINT mirror or proxy (2026-12-07)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"]})
    hub.linked_etag = "../" * 12 + str(victim).lstrip("/")
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    for force in (False, True):
        with pytest.raises(DownloadError, match="not a hex digest"):
            download_model(entry, force=force)
        assert victim.read_text() == "precious"
    assert find_cached(entry) is None


def test_a_body_longer_than_announced_is_refused_and_never_linked(hub, ggufs, tmp_path):
    """A server that sends on past the announced size filled the disk (210 MB for 1 MB),
    and a file that failed its size check had already been linked into the snapshot,
    where it was loaded."""
    hub.add_repo("org/target-GGUF", {"target-q8_0.gguf": ggufs["target"]})
    hub.pad = 1 << 20
    entry = registry(tmp_path, PAIR_YAML.split("pairs:")[0]).model("tgt")
    with pytest.raises(DownloadError, match="sent more than the"):
        download_model(entry)
    assert find_cached(entry) is None
    hub.pad = 0  # the server mended: the next run fetches the file whole
    download_model(entry)
    [path] = find_cached(entry)
    assert path.read_bytes() == ggufs["target"]
