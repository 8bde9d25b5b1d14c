"""Read GGUF headers: the one reader of them, without the ``gguf`` package's parser.

:func:`read_magic` (the first four bytes, checked against :data:`GGUF_MAGIC` by
:func:`check_gguf_file` and models/files.py), :func:`header_fields` (a few keys, for bench's
record and the session), :func:`read_vocab` (the vocabulary as llama.cpp's compatibility
check sees it) and :func:`implied_size` (the size a header implies, for messages about
truncated files). The value types come from ``specgen.models.gguf``, the door to the ``gguf``
package, imported on first use.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specgen.errors import ModelFileError, ModelLoadFailure
from specgen.fileio import check_model_path
from specgen.models.gguf import ARCH_KEY, scalar_formats, tensor_bytes, value_types

__all__ = [
    "GGUF_MAGIC",
    "HeaderVocab",
    "check_gguf_file",
    "explain_load_failure",
    "header_fields",
    "implied_size",
    "read_magic",
    "read_vocab",
]

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


class _HeaderReader:
    """Sequential reads of a GGUF header (llama.cpp ``docs/gguf.md``) from an open file."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.formats = scalar_formats()

    def read(self, fmt: str) -> Any:
        import struct

        return struct.unpack(fmt, self.f.read(struct.calcsize(fmt)))[0]

    def read_str(self) -> str:
        return self.f.read(self.read("<Q")).decode("utf-8", "replace")

    def skip(self, vtype: int) -> None:
        import struct

        T = value_types()

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
    T = value_types()

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
    "tokenizer.ggml.add_eos_token", ARCH_KEY,
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

    T = value_types()

    fmts = scalar_formats()
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
        architecture=str(found.get(ARCH_KEY, "")),
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
    check_model_path(path)
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

    T = value_types()

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
                nbytes = tensor_bytes(h.read("<I"), math.prod(dims))
                end = max(end, h.read("<Q") + nbytes)
            start = -(-f.tell() // alignment) * alignment
    except (OSError, struct.error, ValueError, KeyError):
        return None
    return start + end
