"""The registry: validation errors name the file and key; merge order; name resolution."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hubserver import isolate_env

from specgen.errors import ConfigError, ModelFileError
from specgen.models.registry import PACKAGED_FILE, load_registry, user_registry_file
from specgen.models.resolve import resolve_model, resolve_pair


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate_env(monkeypatch, tmp_path)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_packaged_registry_has_the_demo_and_the_llama_cpp_presets():
    reg = load_registry()
    assert reg.sources == (PACKAGED_FILE,)
    demo = reg.pair("demo")
    assert (demo.target, demo.draft, demo.draft_max) == ("gemma3-270m-f32", "gemma3-270m-q4", 8)
    assert reg.model("gemma3-270m-q4").embedded and reg.model("gemma3-270m-f32").embedded
    for size in ("7b", "14b"):
        pair = reg.pair(f"qwen2.5-coder-{size}")
        target, draft = reg.model(pair.target), reg.model(pair.draft)
        assert target.repo == f"ggml-org/Qwen2.5-Coder-{size.upper()}-Q8_0-GGUF"
        assert target.file == f"qwen2.5-coder-{size}-q8_0.gguf"
        assert (draft.repo, draft.file) == (
            "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF",
            "qwen2.5-coder-0.5b-q8_0.gguf",
        )
    assert {"qwen2.5-7b-instruct", "llama3.1-8b", "gemma3-4b"} <= set(reg.pairs)
    # nothing with a repo was checked from a machine with network
    assert not any(m.verified for m in reg.models.values() if not m.embedded)


def test_entries_are_frozen():
    reg = load_registry()
    with pytest.raises(dataclasses.FrozenInstanceError):
        reg.model("gemma3-270m-q4").quant = "F16"  # type: ignore[misc]
    with pytest.raises(TypeError):
        reg.models["x"] = reg.model("gemma3-270m-q4")  # type: ignore[index]


OK_MODEL = "repo: o/r\n    file: m.gguf"


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("models: [1, 2\n", "line", "invalid YAML"),
        ("- a\n- b\n", "(top level)", "expected a mapping"),
        ("model: {}\n", "(top level).model", "unknown key"),
        ("models: [a]\n", "models", "expected a mapping"),
        ("models:\n  a/b: {repo: o/r, file: m.gguf}\n", "models.a/b", "invalid name"),
        ("models:\n  m: just-a-string\n", "models.m", "expected a mapping"),
        (
            f"models:\n  m:\n    {OK_MODEL}\n    quantization: Q8_0\n",
            "models.m.quantization",
            "unknown key",
        ),
        ("models:\n  m: {file: m.gguf}\n", "models.m.repo", "missing field"),
        ("models:\n  m: {repo: o/r}\n", "models.m.file", "missing field"),
        ("models:\n  m: {repo: justname, file: m.gguf}\n", "models.m.repo", "owner/name"),
        ("models:\n  m: {embedded: true, repo: o/r}\n", "models.m", "embedded model has no"),
        (f"models:\n  m:\n    {OK_MODEL}\n    sha256: abc\n", "models.m.sha256", "64 hex"),
        (f"models:\n  m:\n    {OK_MODEL}\n    size_gb: -1\n", "models.m.size_gb", "positive"),
        (f"models:\n  m:\n    {OK_MODEL}\n    size_gb: big\n", "models.m.size_gb", "expected"),
        (f"models:\n  m:\n    {OK_MODEL}\n    size_gb: .nan\n", "models.m.size_gb", "positive"),
        (f"models:\n  m:\n    {OK_MODEL}\n    size_gb: .inf\n", "models.m.size_gb", "positive"),
        (
            f"models:\n  m:\n    {OK_MODEL}\n    revision: ../../../tmp/x\n",
            "models.m.revision",
            "not a branch, tag or commit",
        ),
        ("models: " + "[" * 5000 + "]" * 5000 + "\n", "", "nested too deeply"),
        # PyYAML keeps the last of a key given twice: an entry pasted and edited once lost
        # the edit silently
        ("models:\n  m: {repo: o/r, file: a.gguf}\n  m: {}\n", "line 3", "'m' is given twice"),
        (f"models:\n  m:\n    {OK_MODEL}\n    file: b.gguf\n", "line 5", "'file' is given"),
        (f"models:\n  m:\n    {OK_MODEL}\n    quant: 8\n", "models.m.quant", "expected str"),
        (
            f"models:\n  m:\n    {OK_MODEL}\n    embedded: yes-ish\n",
            "models.m.embedded",
            "expected bool",
        ),
        (
            "pairs:\n  p: {target: gemma3-270m-f32, draft: gemma3-270m-q4, k: 4}\n",
            "pairs.p.k",
            "unknown key",
        ),
        ("pairs:\n  p: {target: gemma3-270m-f32}\n", "pairs.p.draft", "missing field"),
        (
            "pairs:\n  p: {target: gemma3-270m-f32, draft: gemma3-270m-q4, draft_max: 0}\n",
            "pairs.p.draft_max",
            "1 to 64",
        ),
        (
            "pairs:\n  p: {target: gemma3-270m-f32, draft: gemma3-270m-q4, draft_max: true}\n",
            "pairs.p.draft_max",
            "expected int",
        ),
        (
            "pairs:\n  p: {target: gemma3-270m-f32, draft: nope}\n",
            "pairs.p.draft",
            "unknown model 'nope'",
        ),
        (
            "pairs:\n  gemma3-270m-q4: {target: gemma3-270m-f32, draft: gemma3-270m-q4}\n",
            "pairs.gemma3-270m-q4",
            "also a model",
        ),
    ],
)
def test_validation_errors_name_file_and_key(tmp_path, text, key, problem):
    f = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_registry(f)
    message = str(err.value)
    assert message.startswith(str(f)), message
    assert key in message and problem in message, message


def test_a_registry_that_is_not_utf8_is_named(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("models:\n  caf\xe9: {repo: o/r, file: m.gguf}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=f"{f}: not UTF-8 text"):
        load_registry(f)


def test_a_missing_models_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--models .*nope.yaml: no such file"):
        load_registry(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="--models .*: a folder, not a models.yaml file"):
        load_registry(tmp_path)


def test_a_merge_key_may_override_what_it_merges(tmp_path):
    text = "models:\n  a: &a {repo: o/r, file: a.gguf}\n  b: {<<: *a, file: b.gguf}\n"
    reg = load_registry(write(tmp_path / "m.yaml", text))
    assert (reg.model("b").repo, reg.model("b").file) == ("o/r", "b.gguf")


def test_empty_file_is_an_empty_registry(tmp_path):
    reg = load_registry(write(tmp_path / "empty.yaml", ""))
    assert set(reg.pairs) == set(load_registry().pairs)


def test_merge_order_packaged_then_user_then_models_flag(tmp_path):
    user = write(
        user_registry_file(),
        """
models:
  gemma3-4b-it-q4: {repo: me/gemma-4b, file: g.gguf}
  mine: {repo: me/mine, file: mine.gguf}
pairs:
  gemma3-4b: {target: gemma3-4b-it-q4, draft: mine, draft_max: 3}
""",
    )
    assert user == tmp_path / "specgen" / "models.yaml"
    extra = write(
        tmp_path / "extra.yaml",
        """
models:
  mine: {repo: other/mine, file: mine2.gguf}
pairs:
  p: {target: mine, draft: gemma3-270m-q4}
""",
    )
    reg = load_registry(extra)
    assert reg.sources == (PACKAGED_FILE, user, extra)
    assert reg.model("gemma3-4b-it-q4").repo == "me/gemma-4b"  # user over packaged
    assert reg.model("mine").repo == "other/mine" and reg.model("mine").source == extra
    assert reg.pair("gemma3-4b").draft_max == 3 and reg.pair("p").draft_max == 8
    assert reg.model("gemma3-270m-q4").source == PACKAGED_FILE
    assert load_registry().model("mine").repo == "me/mine"  # without --models


def test_user_file_falls_back_to_dot_config(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECGEN_HOME")
    f = write(
        tmp_path / "home" / ".config" / "specgen" / "models.yaml",
        "models:\n  mine: {repo: me/mine, file: m.gguf}\n",
    )
    assert user_registry_file() == f
    assert load_registry().model("mine").source == f


def test_a_user_pair_may_name_packaged_models_and_errors_name_the_user_file(tmp_path):
    write(user_registry_file(), "pairs:\n  p: {target: qwen2.5-coder-7b-q8, draft: ghost}\n")
    with pytest.raises(ConfigError, match=r"specgen/models.yaml: pairs.p.draft: unknown model"):
        load_registry()


def test_resolve_model_paths_names_and_errors(tmp_path):
    reg = load_registry()
    gguf = write(tmp_path / "my.gguf", "GGUF")
    assert resolve_model(reg, str(gguf)) == gguf
    with pytest.raises(ModelFileError, match="no such file or registry name"):
        resolve_model(reg, str(tmp_path / "missing.gguf"))
    with pytest.raises(ConfigError, match="`specgen download qwen2.5-coder-7b-q8`"):
        resolve_model(reg, "qwen2.5-coder-7b-q8")
    with pytest.raises(ConfigError, match="`specgen download qwen2.5-coder-7b`"):
        resolve_pair(reg, "qwen2.5-coder-7b")
    with pytest.raises(ConfigError, match="no pair named 'nope'"):
        resolve_pair(reg, "nope")


def test_resolve_finds_a_model_already_in_the_hf_cache(tmp_path):
    snap = tmp_path / "hf" / "hub" / "models--ggml-org--Qwen2.5-Coder-0.5B-Q8_0-GGUF"
    write(snap / "refs" / "main", "a" * 40)
    f = write(snap / "snapshots" / ("a" * 40) / "qwen2.5-coder-0.5b-q8_0.gguf", "GGUF")
    assert resolve_model(load_registry(), "qwen2.5-coder-0.5b-q8") == f


def test_embedded_models_are_built_by_the_demo_module(tmp_path, monkeypatch):
    calls = []

    def ensure_demo_model(name: str) -> Path:
        calls.append(name)
        return tmp_path / f"{name}.gguf"

    from specgen.models import resolve

    monkeypatch.setattr(resolve, "ensure_demo_model", ensure_demo_model)
    target, draft, k = resolve_pair(load_registry(), "demo")
    assert (target.name, draft.name, k) == ("gemma3-270m-f32.gguf", "gemma3-270m-q4.gguf", 8)
    assert calls == ["gemma3-270m-f32", "gemma3-270m-q4"]


def test_models_for_download(tmp_path):
    reg = load_registry()
    assert [m.name for m in reg.models_for("qwen2.5-coder-14b")] == [
        "qwen2.5-coder-14b-q8",
        "qwen2.5-coder-0.5b-q8",
    ]
    assert [m.name for m in reg.models_for("gemma3-4b-it-q4")] == ["gemma3-4b-it-q4"]
    with pytest.raises(ConfigError, match="neither a pair nor a model"):
        reg.models_for("nope")


def test_instruct_pairs_are_marked_for_chat(tmp_path):
    reg = load_registry()
    chat = {name for name, p in reg.pairs.items() if p.chat}
    assert chat == {"qwen2.5-7b-instruct", "llama3.1-8b", "gemma3-4b"}
    assert not reg.pair("demo").chat  # Gemma 3 270M base: no chat template
    bad = tmp_path / "bad.yaml"
    bad.write_text("pairs:\n  p: {target: gemma3-270m-f32, draft: gemma3-270m-q4, chat: yes-ish}\n")
    with pytest.raises(ConfigError, match=r"pairs\.p\.chat: expected bool"):
        load_registry(bad)
