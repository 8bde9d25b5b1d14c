"""specgen.models.gguf, specgen.models.header and specgen.models.demo: real files, read back
with gguf and llama.cpp."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import gguf
import numpy as np
import pytest
import tinymodels

from specgen.errors import ConfigError, ModelFileError
from specgen.models import demo, header
from specgen.models import gguf as gguf_tools

# --- helpers -----------------------------------------------------------------------------------


def _fields(path: Path) -> dict[str, tuple[object, list[int]]]:
    """name -> (contents, value types) for every real metadata field."""
    reader = gguf.GGUFReader(path)
    return {
        f.name: (f.contents(), [int(t) for t in f.types])
        for f in reader.fields.values()
        if not f.name.startswith("GGUF.")
    }


def test_open_reader_parses_what_gguf_reader_parses(tiny_target: Path) -> None:
    fast, ref = gguf_tools.open_reader(tiny_target), gguf.GGUFReader(tiny_target)
    assert type(fast.data) is np.ndarray  # not np.memmap: that subclass is the slow part
    assert list(fast.fields) == list(ref.fields)
    for name, field in ref.fields.items():
        assert fast.fields[name].contents() == field.contents(), name
    assert [t.name for t in fast.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(fast.tensors, ref.tensors, strict=True):
        assert a.tensor_type == b.tensor_type and np.array_equal(a.data, b.data), a.name
        assert not a.data.flags.writeable


def _llama(path: Path, **kwargs: object):
    """llama-cpp-python's own high-level `Llama`, loaded as specgen loads models: without
    llama.cpp's extra buffers on a CPU with AMX (`extra_buffers_safe`: its kernels crash)."""
    import llama_cpp
    import llama_cpp.llama_cpp as low

    from specgen.llamacpp.loading import extra_buffers_safe

    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = extra_buffers_safe()
        return p

    with mock.patch.object(low, "llama_model_default_params", params):
        return llama_cpp.Llama(
            model_path=str(path), verbose=False, n_ctx=64, n_batch=16, seed=0, **kwargs
        )


def _no_temp_files(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def _write_q8_copy(src: Path, dst: Path) -> None:
    """Rewrite a tiny F32 model with every 2-D tensor quantized to Q8_0 (a small quantized
    source for exact dequantization checks)."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch="llama")
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if data.ndim == 2:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            # q is uint8 rows of 34-byte blocks; the writer derives the element shape.
            writer.add_tensor(t.name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --- tiny model --------------------------------------------------------------------------------


def test_tiny_model_is_small_and_has_the_documented_vocab(tiny_target: Path) -> None:
    assert tiny_target.stat().st_size < 500_000
    fields = _fields(tiny_target)
    tokens = fields["tokenizer.ggml.tokens"][0]
    assert len(tokens) == 272
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3] == "<0x00>" and tokens[258] == "<0xFF>"
    assert tokens[262] == "▁the"
    assert fields["tokenizer.ggml.model"][0] == "llama"
    assert fields["tokenizer.ggml.bos_token_id"][0] == 1
    assert fields["tokenizer.ggml.eos_token_id"][0] == 2
    assert fields["tokenizer.ggml.add_bos_token"][0] is True
    assert len(fields["tokenizer.ggml.scores"][0]) == 272
    assert len(fields["tokenizer.ggml.token_type"][0]) == 272


def test_tiny_model_loads_tokenizes_and_generates(tiny_target: Path) -> None:
    llm = _llama(tiny_target)
    assert llm.n_vocab() == 272
    assert llm.tokenize(b"the cat on the mat") == [1, 262, 265, 267, 262, 270]
    out = llm.create_completion("the cat", max_tokens=8, temperature=1.0, seed=1)
    assert out["usage"]["completion_tokens"] >= 1
    assert isinstance(out["choices"][0]["text"], str)


def test_tiny_model_distribution_is_not_degenerate(tiny_target: Path) -> None:
    llm = _llama(tiny_target, logits_all=True)
    rng = np.random.default_rng(0)
    tops = []
    for _ in range(4):
        toks = [1, *rng.integers(3, 272, 15).tolist()]
        llm.reset()
        llm.eval(toks)
        logits = np.array(llm.scores[: len(toks)], dtype=np.float64)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        tops.extend(p.max(axis=1))
    assert 0.2 < float(np.median(tops)) < 0.9
    assert max(tops) < 0.999 and min(tops) > 2 / 272


def test_tiny_models_same_seed_are_identical_and_noise_is_deterministic(
    tmp_path: Path, tiny_target: Path, tiny_draft: Path
) -> None:
    tinymodels.write_tiny_llama(tmp_path / "a.gguf", seed=0)
    assert (tmp_path / "a.gguf").read_bytes() == tiny_target.read_bytes()
    tinymodels.write_tiny_llama(tmp_path / "b.gguf", seed=0, noise=0.015, noise_seed=1)
    assert (tmp_path / "b.gguf").read_bytes() == tiny_draft.read_bytes()
    assert tiny_draft.read_bytes() != tiny_target.read_bytes()


def test_tiny_draft_agrees_more_than_wrong_model(
    tiny_target: Path, tiny_draft: Path, tiny_wrong: Path
) -> None:
    toks = [1, 262, 265, 267, 262, 270, 100, 120, 140, 160, 180, 200]

    def probs(path: Path) -> np.ndarray:
        llm = _llama(path, logits_all=True)
        llm.eval(toks)
        logits = np.array(llm.scores[: len(toks)], dtype=np.float64)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)

    p = probs(tiny_target)
    overlap_draft = np.minimum(p, probs(tiny_draft)).sum(axis=1).mean()
    overlap_wrong = np.minimum(p, probs(tiny_wrong)).sum(axis=1).mean()
    assert 0.4 < overlap_draft < 0.95
    assert overlap_wrong < 0.2


def test_extra_words_append_tokens_and_keep_base_weights(tmp_path: Path, tiny_target: Path) -> None:
    dst = tmp_path / "bigger.gguf"
    tinymodels.write_tiny_llama(dst, extra_words=["▁dog", "▁sat"])
    base, big = gguf.GGUFReader(tiny_target), gguf.GGUFReader(dst)
    tokens = big.get_field("tokenizer.ggml.tokens").contents()
    assert len(tokens) == 274 and tokens[-2:] == ["▁dog", "▁sat"]
    assert tokens[:272] == base.get_field("tokenizer.ggml.tokens").contents()
    for name in ("token_embd.weight", "output.weight"):
        a = next(t for t in base.tensors if t.name == name).data
        b = next(t for t in big.tensors if t.name == name).data
        np.testing.assert_array_equal(a, b[:272])
    assert _llama(dst).n_vocab() == 274
    with pytest.raises(ValueError, match="already"):
        tinymodels.write_tiny_llama(tmp_path / "dup.gguf", extra_words=["▁the"])


# --- dequantize_to_f32 -------------------------------------------------------------------------


def test_dequantize_tiny_q8_matches_gguf_dequantize(tmp_path: Path, tiny_target: Path) -> None:
    q8 = tmp_path / "q8.gguf"
    _write_q8_copy(tiny_target, q8)
    f32 = tmp_path / "f32.gguf"
    gguf_tools.dequantize_to_f32(q8, f32)
    src, out = gguf.GGUFReader(q8), gguf.GGUFReader(f32)
    assert [t.name for t in out.tensors] == [t.name for t in src.tensors]
    assert any(t.tensor_type == gguf.GGMLQuantizationType.Q8_0 for t in src.tensors)
    for s, o in zip(src.tensors, out.tensors, strict=True):
        assert o.tensor_type == gguf.GGMLQuantizationType.F32
        assert o.shape.tolist() == s.shape.tolist()
        np.testing.assert_array_equal(o.data, gguf.quants.dequantize(s.data, s.tensor_type))
    a, b = _fields(q8), _fields(f32)
    assert b.pop("general.file_type")[0] == int(gguf.LlamaFileType.ALL_F32)
    a.pop("general.file_type", None)
    assert a == b
    out_text = _llama(f32).create_completion("the cat", max_tokens=4, temperature=0.0)
    assert out_text["usage"]["completion_tokens"] >= 1


@pytest.fixture(scope="module")
def demo_readers(demo_pair: tuple[Path, Path]) -> tuple[gguf.GGUFReader, gguf.GGUFReader]:
    """(target F32 reader, draft Q4 reader). Each takes ~4 s: the 262,144-token vocab."""
    target, draft = demo_pair
    return gguf_tools.open_reader(target), gguf_tools.open_reader(draft)


def test_demo_f32_has_same_tensors_and_metadata(demo_readers) -> None:
    f32, q4 = demo_readers
    assert [t.name for t in f32.tensors] == [t.name for t in q4.tensors]
    for a, b in zip(f32.tensors, q4.tensors, strict=True):
        assert a.shape.tolist() == b.shape.tolist(), a.name
        assert a.tensor_type == gguf.GGMLQuantizationType.F32
    assert any(t.tensor_type != gguf.GGMLQuantizationType.F32 for t in q4.tensors)
    assert f32.get_field("general.file_type").contents() == int(gguf.LlamaFileType.ALL_F32)
    skip = {"general.file_type"}
    names_f32 = [f.name for f in f32.fields.values() if not f.name.startswith("GGUF.")]
    names_q4 = [f.name for f in q4.fields.values() if not f.name.startswith("GGUF.")]
    assert names_f32 == names_q4
    for name in names_q4:
        if name in skip:
            continue
        fa, fb = f32.get_field(name), q4.get_field(name)
        assert fa.types == fb.types, name
        if name == "tokenizer.ggml.tokens":  # 262,144 strings: compare a sample
            idx = [0, 1, 2, 5, 1000, 100_000, 262_143]
            assert [fa.contents(i) for i in idx] == [fb.contents(i) for i in idx]
        elif len(fb.data) < 1000:
            assert fa.contents() == fb.contents(), name


def test_demo_f32_values_equal_gguf_dequantize(demo_readers) -> None:
    f32, q4 = demo_readers
    by_name = {t.name: t for t in f32.tensors}
    quantized = [t for t in q4.tensors if t.tensor_type != gguf.GGMLQuantizationType.F32]
    types = {t.tensor_type for t in quantized}
    picks = [next(t for t in quantized if t.tensor_type == qt) for qt in types]
    picks.append(next(t for t in q4.tensors if t.tensor_type == gguf.GGMLQuantizationType.F32))
    for t in picks:
        if t.name == "token_embd.weight":
            continue  # 671 MB at F32; the blocks cover the same quant types
        expected = gguf.quants.dequantize(t.data, t.tensor_type)
        np.testing.assert_array_equal(np.asarray(by_name[t.name].data), expected, err_msg=t.name)


def test_demo_pair_loads_in_llama_cpp(demo_pair: tuple[Path, Path]) -> None:
    target, draft = demo_pair
    assert target.stat().st_size > 4 * draft.stat().st_size
    llm = _llama(target)
    assert llm.metadata["general.file_type"] == "0"
    assert llm.n_vocab() == 262_144
    # Semantic check through llama.cpp: both files continue this prompt the same way
    # (measured: " the capital of the country of France. It is the largest city in France").
    for model in (llm, _llama(draft)):
        out = model.create_completion("The capital of France is", max_tokens=3, temperature=0.0)
        assert out["choices"][0]["text"].startswith(" the capital")


# --- keep_first_layers -------------------------------------------------------------------------


def test_keep_first_layers_tiny(tmp_path: Path) -> None:
    src, dst = tmp_path / "three.gguf", tmp_path / "one.gguf"
    tinymodels.write_tiny_llama(src, n_layer=3)
    gguf_tools.keep_first_layers(src, dst, 1)
    s, d = gguf.GGUFReader(src), gguf.GGUFReader(dst)
    assert d.get_field("llama.block_count").contents() == 1
    expected = [t.name for t in s.tensors if not t.name.startswith(("blk.1.", "blk.2."))]
    assert [t.name for t in d.tensors] == expected
    for t in d.tensors:
        np.testing.assert_array_equal(t.data, next(x for x in s.tensors if x.name == t.name).data)
    assert _llama(dst).create_completion("the", max_tokens=4)["usage"]["completion_tokens"] >= 1
    with pytest.raises(ValueError):
        gguf_tools.keep_first_layers(src, tmp_path / "zero.gguf", 0)
    with pytest.raises(ValueError):
        gguf_tools.keep_first_layers(src, tmp_path / "four.gguf", 4)


def test_weak_draft_has_six_layers_and_generates(weak_draft: Path) -> None:
    llm = _llama(weak_draft)
    assert llm.metadata["gemma3.block_count"] == "6"
    out = llm.create_completion("The capital of France is", max_tokens=4, temperature=0.0)
    assert out["usage"]["completion_tokens"] >= 1


# --- replace_token -----------------------------------------------------------------------------


def test_replace_token_changes_exactly_one_token(tiny_draft: Path, vocab_mismatch_draft: Path):
    a, b = gguf.GGUFReader(tiny_draft), gguf.GGUFReader(vocab_mismatch_draft)
    ta = a.get_field("tokenizer.ggml.tokens").contents()
    tb = b.get_field("tokenizer.ggml.tokens").contents()
    assert len(ta) == len(tb)
    assert [i for i in range(len(ta)) if ta[i] != tb[i]] == [262]
    assert tb[262] == "▁zzz"
    fa, fb = _fields(tiny_draft), _fields(vocab_mismatch_draft)
    fa.pop("tokenizer.ggml.tokens")
    fb.pop("tokenizer.ggml.tokens")
    assert fa == fb
    for x, y in zip(a.tensors, b.tensors, strict=True):
        assert x.name == y.name
        np.testing.assert_array_equal(x.data, y.data)
    assert _llama(vocab_mismatch_draft).n_vocab() == 272
    with pytest.raises(ValueError):
        tinymodels.replace_token(tiny_draft, vocab_mismatch_draft.parent / "x.gguf", 272, "x")


# --- errors and atomic writes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "writer",
    [
        lambda s, d: gguf_tools.dequantize_to_f32(s, d),
        lambda s, d: gguf_tools.keep_first_layers(s, d, 1),
        lambda s, d: tinymodels.replace_token(s, d, 5, "x"),
    ],
    ids=["dequantize", "keep_first_layers", "replace_token"],
)
def test_bad_source_raises_and_leaves_dst_alone(
    tmp_path: Path, writer, not_gguf_file: Path, truncated_gguf: Path
) -> None:
    for bad in (tmp_path / "missing.gguf", not_gguf_file, truncated_gguf):
        dst = tmp_path / "out" / "model.gguf"
        with pytest.raises(ModelFileError):
            writer(bad, dst)
        assert not dst.exists()
    dst.parent.mkdir(exist_ok=True)
    dst.write_bytes(b"old")
    with pytest.raises(ModelFileError):
        writer(not_gguf_file, dst)
    assert dst.read_bytes() == b"old"
    assert _no_temp_files(dst.parent)


def test_failure_mid_write_leaves_no_file(
    tmp_path: Path, tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def failing(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
        calls.append(qtype)
        if len(calls) > 3:
            raise RuntimeError("disk on fire")
        return data.view(np.float32)

    monkeypatch.setattr(gguf.quants, "dequantize", failing)
    dst = tmp_path / "f32.gguf"
    with pytest.raises(RuntimeError, match="disk on fire"):
        gguf_tools.dequantize_to_f32(tiny_target, dst)
    assert len(calls) == 4
    assert not dst.exists()
    assert list(tmp_path.iterdir()) == []


def test_written_files_are_world_readable(tiny_target: Path) -> None:
    assert tiny_target.stat().st_mode & 0o777 == 0o644


# --- demo cache --------------------------------------------------------------------------------


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert demo.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("SPECGEN_CACHE")
    assert demo.cache_dir() == tmp_path / "xdg" / "specgen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert demo.cache_dir() == tmp_path / "home" / ".cache" / "specgen"


def test_a_cache_that_is_a_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    (tmp_path / "f").write_text("")  # was "File exists: ..." from the first mkdir
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "f"))
    with pytest.raises(ConfigError, match=r"cache .*/f is a file, not a folder: move it"):
        demo.cache_dir()
    monkeypatch.delenv("SPECGEN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "specgen").write_text("")
    with pytest.raises(ConfigError, match=r"cache .*/specgen is a file"):
        demo.cache_dir()


def test_unknown_demo_model_is_config_error() -> None:
    with pytest.raises(ConfigError, match="gemma3-270m-q4"):
        demo.ensure_demo_model("gemma3-1b")


def test_demo_q4_assembled_once_with_status(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path))
    messages: list[str] = []
    path = demo.ensure_demo_model("gemma3-270m-q4", status=messages.append)
    assert path.parent == tmp_path
    assert path.stat().st_size == 253_113_024
    assert len(messages) == 1 and "Q4_K_M" in messages[0]
    assert demo.ensure_demo_model("gemma3-270m-q4", status=messages.append) == path
    assert len(messages) == 1
    assert _no_temp_files(tmp_path)


# --- header reading ----------------------------------------------------------------------------


def test_header_fields_agree_with_gguf_reader_and_stop_early(tiny_target: Path) -> None:
    fields = _fields(tiny_target)
    keys = [
        "general.architecture",  # a string
        "general.file_type",  # uint32
        "llama.attention.layer_norm_rms_epsilon",  # float32
        "tokenizer.ggml.add_bos_token",  # bool, after the token arrays
        "tokenizer.ggml.tokens",  # an array: not returned
        "no.such.key",
    ]
    got = header.header_fields(tiny_target, keys)
    assert set(got) == set(keys[:4])
    for key in keys[:4]:
        assert got[key] == pytest.approx(fields[key][0])
    assert header.read_magic(tiny_target) == header.GGUF_MAGIC


def test_header_fields_refuse_non_gguf_and_truncated_files(tiny_target: Path, tmp_path) -> None:
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"<html>")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        header.header_fields(not_gguf, ["general.architecture"])
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_target.read_bytes()[:2000])  # inside the token list
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        header.header_fields(cut, ["tokenizer.ggml.add_bos_token"])
