"""Read GGUF headers, derive GGUF model files from other GGUF files.

The one reader of GGUF headers: :func:`read_magic` (the first four bytes, checked against
:data:`GGUF_MAGIC` by :func:`check_gguf_file` and models/files.py) and :func:`header_fields`
(a few keys, for bench's record). Two writers, built on the ``gguf`` package (no llama.cpp
needed), and the plumbing the tests' writers (``tests/tinymodels.py``) share:

- :func:`dequantize_to_f32`: the same model with every tensor stored as F32 (the demo target).
- :func:`keep_first_layers`: the first ``n`` transformer blocks only, original quantization
  (a weak draft).

Every writer writes to a hidden temporary file in the destination directory and renames it
into place (``os.replace``), so ``dst`` is either absent/unchanged or complete: an exception
never leaves a partial file there.

Shapes: ``GGUFReader`` reports ``tensor.shape`` in GGML order (``ne0`` first, the row length);
``tensor.data`` and ``gguf.quants.dequantize`` use numpy order (row length last).
``GGUFWriter.add_tensor_info`` takes numpy order (it reverses when writing).

The ``gguf`` package is imported inside the functions that parse or write a file: session.py
and models/files.py import this module for its header checks alone.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specgen.errors import ModelFileError, ModelLoadFailure
from specgen.fileio import atomic_path

__all__ = [
    "check_gguf_file",
    "explain_load_failure",
    "GGUF_MAGIC",
    "dequantize_to_f32",
    "header_fields",
    "keep_first_layers",
    "open_reader",
    "read_magic",
    "read_vocab",
]

_ARCH_KEY = "general.architecture"
_ALIGNMENT_KEY = "general.alignment"
_FILE_TYPE_KEY = "general.file_type"
_TOKENS_KEY = "tokenizer.ggml.tokens"

# (name, value, value type, array sub-type or None): one metadata entry to write.
_KV = tuple[str, Any, Any, Any]
# (name, numpy array in numpy order, GGML type or None for plain dtypes): one tensor to write.
_TensorOut = tuple[str, np.ndarray, Any]


# ---------------------------------------------------------------------------------------------
# reading headers (the one place that does)

#: the first four bytes of every GGUF file (``gguf.GGUF_MAGIC`` as little-endian bytes)
GGUF_MAGIC = b"GGUF"


def read_magic(path: Path | str) -> bytes:
    """The first four bytes of ``path`` (fewer for a shorter file); GGUF files start with
    :data:`GGUF_MAGIC`.

    Raises:
        OSError: the file cannot be opened or read.
    """
    with open(path, "rb") as f:
        return f.read(4)


def _scalar_formats() -> dict[int, str]:
    """struct formats of GGUF's fixed-size value types (``gguf.GGUFValueType``)."""
    from gguf import GGUFValueType as T

    return {
        T.UINT8: "<B", T.INT8: "<b", T.UINT16: "<H", T.INT16: "<h", T.UINT32: "<I",
        T.INT32: "<i", T.FLOAT32: "<f", T.BOOL: "<?", T.UINT64: "<Q", T.INT64: "<q",
        T.FLOAT64: "<d",
    }  # fmt: skip


class _HeaderReader:
    """Sequential reads of a GGUF header (llama.cpp ``docs/gguf.md``) from an open file."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.formats = _scalar_formats()

    def read(self, fmt: str) -> Any:
        import struct

        return struct.unpack(fmt, self.f.read(struct.calcsize(fmt)))[0]

    def read_str(self) -> str:
        return self.f.read(self.read("<Q")).decode("utf-8", "replace")

    def skip(self, vtype: int) -> None:
        import struct

        from gguf import GGUFValueType as T

        if vtype == T.STRING:
            self.f.seek(self.read("<Q"), 1)
        elif vtype == T.ARRAY:
            itype, n = self.read("<I"), self.read("<Q")
            if itype in self.formats:
                self.f.seek(n * struct.calcsize(self.formats[itype]), 1)
            else:
                for _ in range(n):
                    self.skip(itype)
        else:
            self.f.seek(struct.calcsize(self.formats[T(vtype)]), 1)


def header_fields(path: Path | str, keys: Sequence[str]) -> dict[str, Any]:
    """Scalar and string metadata ``keys`` of a GGUF file, read from its header only.

    Stops as soon as every key is found, so it takes microseconds where ``gguf.GGUFReader``,
    which parses the whole header (a 262,144-token vocabulary included), takes seconds. The
    layout is GGUF's (llama.cpp ``docs/gguf.md``): magic, version (uint32), tensor and
    key-value counts (uint64 from version 2, uint32 before), then each key as a
    length-prefixed UTF-8 string, its ``gguf.GGUFValueType`` (uint32) and value. Keys that are
    absent, or arrays, are absent from the result.

    Raises:
        ModelFileError: not a GGUF file, or the header is cut short.
        OSError: the file cannot be read.
    """
    from gguf import GGUFValueType as T

    want = set(keys)
    out: dict[str, Any] = {}
    with open(path, "rb") as f:
        h = _HeaderReader(f)
        if f.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF file: {path}")
        try:
            count = "<Q" if h.read("<I") >= 2 else "<I"
            h.read(count)  # tensors
            for _ in range(h.read(count)):
                key, vtype = h.read_str(), h.read("<I")
                if key in want and vtype in h.formats:
                    out[key] = h.read(h.formats[T(vtype)])
                elif key in want and vtype == T.STRING:
                    out[key] = h.read_str()
                else:
                    h.skip(vtype)
                if want <= out.keys():
                    break
        except (struct.error, ValueError, KeyError) as exc:  # cut short, or an unknown type
            raise ModelFileError(f"GGUF header of {path} is truncated or corrupt ({exc})") from exc
    return out


#: ``tokenizer.ggml.model`` -> llama.cpp's ``enum llama_vocab_type`` (llama-vocab.cpp)
VOCAB_TYPES = {"no_vocab": 0, "llama": 1, "gpt2": 2, "bert": 3, "t5": 4, "rwkv": 5, "plamo2": 6}
#: llama.cpp's defaults where a file leaves the special ids or flags out (llama-vocab.cpp,
#: ``llama_vocab::impl::load``): SentencePiece <s> 1, </s> 2 and adds BOS; BPE 11 and 11
_VOCAB_DEFAULTS = {1: (1, 2, True, False), 2: (11, 11, False, False)}


@dataclass(frozen=True)
class HeaderVocab:
    """A GGUF file's vocabulary as llama.cpp's compatibility check sees it, read from the
    header only (see :func:`read_vocab`).

    Attributes:
        vocab_type: llama.cpp's ``llama_vocab_type`` (1 SentencePiece, 2 BPE, ...; -1 for an
            unknown ``tokenizer.ggml.model``).
        tokens: the token texts, as stored (UTF-8 bytes), id order.
        bos, eos: special token ids (-1 when absent and llama.cpp has no default).
        add_bos, add_eos: whether tokenization adds them.
        architecture: ``general.architecture`` ("" when absent).
    """

    vocab_type: int
    tokens: tuple[bytes, ...]
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool
    architecture: str = ""

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


_VOCAB_KEYS = {
    "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token", _ARCH_KEY,
}  # fmt: skip


def read_vocab(path: Path | str) -> HeaderVocab | None:
    """The vocabulary of a GGUF file from its header alone (no model load).

    Walks the key-value section through a memory map, reading ``tokenizer.ggml.*`` and
    skipping everything else (merges included): about 0.3 s for a 262,144-token vocabulary,
    where ``gguf.GGUFReader`` takes 10-20 s. Missing BOS/EOS ids and add flags get
    llama.cpp's defaults for SentencePiece and BPE.

    Returns:
        None for a file without a vocabulary (``tokenizer.ggml.tokens`` absent: a
        projector, or a split set's later shard).

    Raises:
        ModelFileError: not a GGUF file, or the header is cut short or corrupt.
        OSError: the file cannot be read.
    """
    import mmap

    from gguf import GGUFValueType as T

    fmts = _scalar_formats()
    found: dict[str, Any] = {}
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF file: {path}")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            try:
                found = _walk_kvs(m, fmts, T)
            except (struct.error, ValueError, KeyError, IndexError) as exc:
                raise ModelFileError(
                    f"GGUF header of {path} is truncated or corrupt ({exc})"
                ) from exc
    tokens = found.get("tokenizer.ggml.tokens")
    if tokens is None:
        return None
    vtype = VOCAB_TYPES.get(str(found.get("tokenizer.ggml.model", "")), -1)
    bos, eos, add_bos, add_eos = _VOCAB_DEFAULTS.get(vtype, (-1, -1, False, False))
    return HeaderVocab(
        vocab_type=vtype,
        tokens=tuple(tokens),
        bos=int(found.get("tokenizer.ggml.bos_token_id", bos)),
        eos=int(found.get("tokenizer.ggml.eos_token_id", eos)),
        add_bos=bool(found.get("tokenizer.ggml.add_bos_token", add_bos)),
        add_eos=bool(found.get("tokenizer.ggml.add_eos_token", add_eos)),
        architecture=str(found.get(_ARCH_KEY, "")),
    )


def _walk_kvs(m: Any, fmts: dict[int, str], T: Any) -> dict[str, Any]:
    """The ``_VOCAB_KEYS`` of the key-value section in the mapped file ``m``; the token
    texts as a list of bytes. Offsets follow llama.cpp ``docs/gguf.md``."""
    unpack = struct.unpack_from
    version = unpack("<I", m, 4)[0]
    count = "<Q" if version >= 2 else "<I"
    csize = struct.calcsize(count)
    off = 8 + csize  # magic, version, tensor count
    (n_kv,) = unpack(count, m, off)
    off += csize
    out: dict[str, Any] = {}

    def string(at: int) -> tuple[bytes, int]:
        (n,) = unpack("<Q", m, at)
        end = at + 8 + n
        if end > len(m):
            raise ValueError("a string runs past the end of the file")
        return m[at + 8 : end], end

    for _ in range(n_kv):
        raw, off = string(off)
        key = raw.decode("utf-8", "replace")
        (vtype,) = unpack("<I", m, off)
        off += 4
        want = key in _VOCAB_KEYS
        if vtype == T.STRING:
            value, off = string(off)
            if want:
                out[key] = value.decode("utf-8", "replace")
        elif vtype == T.ARRAY:
            itype, n = unpack("<IQ", m, off)
            off += 12
            if itype == T.STRING:
                items: list[bytes] = []
                for _ in range(n):
                    (ln,) = unpack("<Q", m, off)
                    if want:
                        items.append(m[off + 8 : off + 8 + ln])
                    off += 8 + ln
                if want:
                    out[key] = items
            elif itype in fmts:
                off += n * struct.calcsize(fmts[itype])
            else:  # arrays of arrays: not in any tokenizer key llama.cpp reads
                raise ValueError(f"unsupported array type {itype} in {key}")
        else:
            fmt = fmts[T(vtype)]
            if want:
                out[key] = unpack(fmt, m, off)[0]
            off += struct.calcsize(fmt)
    return out


def check_gguf_file(path: Path) -> None:
    """Refuse a path that cannot be a GGUF model before llama.cpp sees it.

    Raises:
        ModelFileError: missing, a directory, unreadable, empty, or without the GGUF magic.
    """
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a GGUF file")
    if not path.is_file():
        raise ModelFileError(f"not a file: {path}")
    try:
        magic = read_magic(path)
    except OSError as e:
        raise ModelFileError(f"cannot read {path}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file (bad magic {magic!r}): {path}")


def explain_load_failure(error: ModelLoadFailure) -> ModelFileError:
    """`error` with the file's size set against the size its header implies, when the file
    is shorter: the likeliest cause of a NULL from llama.cpp is a download cut short."""
    path = error.path
    try:
        size = path.stat().st_size
    except OSError:
        return error
    expected = implied_size(path)
    if expected is not None and expected > size:
        return ModelFileError(
            f"{path} is truncated: {size:,} bytes, its header implies {expected:,}"
            f" (llama.cpp: {error.reason}): download or build it again"
        )
    return error


def implied_size(path: Path | str) -> int | None:
    """The size in bytes a GGUF file must have by its own header: the start of the tensor
    data (the header's end, aligned to ``general.alignment``, default 32) plus the end of
    the tensor that ends last. Reads the whole header (about a second for a 262,144-token
    vocabulary); for messages about truncated files.

    Returns:
        The size, or None when the header itself is cut short, corrupt or not GGUF.
    """
    import math
    import struct

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf import GGUFValueType as T

    try:
        with open(path, "rb") as f:
            h = _HeaderReader(f)
            if f.read(4) != GGUF_MAGIC:
                return None
            count = "<Q" if h.read("<I") >= 2 else "<I"
            n_tensors, n_kv = h.read(count), h.read(count)
            alignment = 32
            for _ in range(n_kv):
                key, vtype = h.read_str(), h.read("<I")
                if key == "general.alignment" and vtype in h.formats:
                    alignment = int(h.read(h.formats[T(vtype)]))
                else:
                    h.skip(vtype)
            end = 0
            for _ in range(n_tensors):
                h.read_str()  # name
                dims = [h.read(count) for _ in range(h.read("<I"))]
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(h.read("<I"))]
                end = max(end, h.read("<Q") + math.prod(dims) // block * type_size)
            start = -(-f.tell() // alignment) * alignment
    except (OSError, struct.error, ValueError, KeyError):
        return None
    return start + end


# ---------------------------------------------------------------------------------------------
# shared plumbing


@functools.cache
def _plain_reader_class() -> Any:
    """``gguf.GGUFReader`` whose buffer is a plain ``ndarray`` view of its ``np.memmap``.

    The reader slices its buffer once per value: about a million slices for a 262,144-token
    vocabulary. Each slice of an ``np.memmap`` runs ``memmap.__array_finalize__``, which took
    most of the 16-20 s that parsing Gemma 3's header took; slices of the plain view take
    4-5 s. The view shares the same read-only mapping, so tensors stay memory-mapped.
    """
    import gguf

    class PlainReader(gguf.GGUFReader):
        @property  # type: ignore[override]
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain = value.view(np.ndarray)

    return PlainReader


def open_reader(src: Path | str) -> Any:
    """Open ``src`` as a ``gguf.GGUFReader`` (memory-mapped, read-only), 3-4x faster to parse
    than ``gguf.GGUFReader(src)`` itself on large vocabularies (see :func:`_plain_reader_class`).

    Raises:
        ModelFileError: ``src`` is missing, not a regular file, not GGUF, or truncated.
    """
    path = Path(src)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    try:
        return _plain_reader_class()(path, "r")
    except Exception as exc:  # bad magic, truncated header or tensor data, bad version
        raise ModelFileError(f"not a readable GGUF file: {path} ({exc})") from exc


def _field_kvs(reader: Any) -> Iterator[_KV]:
    """Every real metadata entry of ``reader`` (virtual ``GGUF.*`` fields and the architecture,
    which ``GGUFWriter`` writes itself, are skipped), with its stored value type."""
    import gguf

    for field in reader.fields.values():
        if field.name == _ARCH_KEY or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        yield field.name, field.contents(), vtype, sub_type


def _write_gguf(
    dst: Path | str,
    arch: str,
    alignment: int | None,
    kvs: list[_KV],
    tensors: list[tuple[str, tuple[int, ...], np.dtype, int, Any]],
    tensor_data: Callable[[int], np.ndarray],
) -> None:
    """Write a GGUF file atomically, streaming one tensor at a time.

    Args:
        dst: destination path.
        arch: ``general.architecture`` value.
        alignment: tensor data alignment in bytes, or None for the default (32).
        kvs: metadata entries (name, value, type, array sub-type).
        tensors: per tensor (name, numpy-order shape of the array that will be written, its
            numpy dtype, its size in bytes, GGML type or None to infer from dtype).
        tensor_data: ``i -> array`` for the i-th tensor, called once each in order, so only
            one tensor needs to be in memory at a time.
    """
    import gguf

    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dst) as tmp:
        writer = gguf.GGUFWriter(tmp, arch=arch)
        try:
            if alignment is not None:
                writer.data_alignment = alignment
            for name, value, vtype, sub_type in kvs:
                writer.add_key_value(name, value, vtype, sub_type=sub_type)
            for name, shape, dtype, nbytes, raw_dtype in tensors:
                writer.add_tensor_info(name, shape, dtype, nbytes, raw_dtype=raw_dtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for i in range(len(tensors)):
                writer.write_tensor_data(tensor_data(i))
        finally:
            writer.close()


def _arch_and_alignment(reader: Any) -> tuple[str, int | None]:
    arch_field = reader.get_field(_ARCH_KEY)
    if arch_field is None:
        raise ModelFileError(f"GGUF file has no {_ARCH_KEY} key")
    align_field = reader.get_field(_ALIGNMENT_KEY)
    return arch_field.contents(), (align_field.contents() if align_field is not None else None)


def _raw_tensor_spec(t: Any) -> tuple[str, tuple[int, ...], np.dtype, int, Any]:
    """Spec that copies a reader tensor byte for byte (quantized data stays ``uint8`` rows)."""
    return (t.name, tuple(t.data.shape), t.data.dtype, int(t.data.nbytes), t.tensor_type)


# ---------------------------------------------------------------------------------------------
# derivations


def dequantize_to_f32(src: Path | str, dst: Path | str) -> None:
    """Write a copy of ``src`` with every tensor dequantized to F32.

    All metadata is copied unchanged (same value types, string arrays included) except
    ``general.file_type``, which becomes ``gguf.LlamaFileType.ALL_F32`` (0). Tensor names,
    order and shapes are unchanged; each value equals ``gguf.quants.dequantize`` of the source
    tensor. Output size is about 4 bytes per parameter (Gemma 3 270M: about 1.1 GB, written
    in roughly 15 s on two cores). Peak memory is about one dequantized tensor (the largest
    is usually ``token_embd.weight``: 262,144 x 640 x 4 bytes = 671 MB for Gemma 3 270M).

    Args:
        src: source GGUF file (any type ``gguf.quants`` can dequantize).
        dst: destination path; replaced atomically.

    Raises:
        ModelFileError: ``src`` is missing or not a readable GGUF file.
        NotImplementedError: a tensor type that ``gguf.quants`` cannot dequantize.
    """
    import gguf

    reader = open_reader(src)
    arch, alignment = _arch_and_alignment(reader)
    kvs: list[_KV] = []
    for name, value, vtype, sub_type in _field_kvs(reader):
        if name == _FILE_TYPE_KEY:
            value = int(gguf.LlamaFileType.ALL_F32)
        kvs.append((name, value, vtype, sub_type))
    if reader.get_field(_FILE_TYPE_KEY) is None:
        f32 = int(gguf.LlamaFileType.ALL_F32)
        kvs.append((_FILE_TYPE_KEY, f32, gguf.GGUFValueType.UINT32, None))

    tensors = list(reader.tensors)
    specs = []
    for t in tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGML order -> numpy order
        n_elements = int(np.prod(shape))
        specs.append((t.name, shape, np.dtype(np.float32), 4 * n_elements, None))

    def data(i: int) -> np.ndarray:
        t = tensors[i]
        out = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        return out.reshape(specs[i][1])

    _write_gguf(dst, arch, alignment, kvs, specs, data)


def keep_first_layers(src: Path | str, dst: Path | str, n_layers: int) -> None:
    """Write a copy of ``src`` that keeps only transformer blocks ``0 .. n_layers-1``.

    Tensors named ``blk.N.*`` with ``N >= n_layers`` are dropped and ``<arch>.block_count``
    is set to ``n_layers``; every other tensor is copied byte for byte in its original
    quantization, and all other metadata is unchanged. For Gemma 3 270M (18 blocks) keeping
    6 gives a much weaker draft with the same vocabulary.

    Args:
        src: source GGUF file.
        dst: destination path; replaced atomically.
        n_layers: blocks to keep, ``1 <= n_layers <= block_count``.

    Raises:
        ModelFileError: ``src`` is missing or not a readable GGUF file, or has no
            ``<arch>.block_count`` key.
        ValueError: ``n_layers`` out of range.
    """
    reader = open_reader(src)
    arch, alignment = _arch_and_alignment(reader)
    count_key = f"{arch}.block_count"
    count_field = reader.get_field(count_key)
    if count_field is None:
        raise ModelFileError(f"{src}: no {count_key} key")
    block_count = int(count_field.contents())
    if not 1 <= n_layers <= block_count:
        raise ValueError(f"n_layers must be in 1..{block_count}, got {n_layers}")

    kvs = [
        (name, n_layers if name == count_key else value, vtype, sub_type)
        for name, value, vtype, sub_type in _field_kvs(reader)
    ]
    tensors = [t for t in reader.tensors if not _dropped_block(t.name, n_layers)]
    _write_gguf(
        dst, arch, alignment, kvs, [_raw_tensor_spec(t) for t in tensors], lambda i: tensors[i].data
    )


def _dropped_block(name: str, n_layers: int) -> bool:
    parts = name.split(".")
    return len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) >= n_layers
