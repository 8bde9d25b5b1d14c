"""The one door to the ``gguf`` package: its reader and writer, the value types and tensor
sizes the header reader (``specgen.models.header``) needs, and two derivations of GGUF model
files from other GGUF files (no llama.cpp needed), with the plumbing the tests' writers
(``tests/tinymodels.py``) share:

- :func:`dequantize_to_f32`: the same model with every tensor stored as F32 (the demo target).
- :func:`keep_first_layers`: the first ``n`` transformer blocks only, original quantization
  (a weak draft).

Every writer writes to a hidden temporary file in the destination directory and renames it
into place (``os.replace``), so ``dst`` is either absent/unchanged or complete: an exception
never leaves a partial file there.

Shapes: ``GGUFReader`` reports ``tensor.shape`` in GGML order (``ne0`` first, the row length);
``tensor.data`` and ``gguf.quants.dequantize`` use numpy order (row length last).
``GGUFWriter.add_tensor_info`` takes numpy order (it reverses when writing).

The ``gguf`` package is imported inside the functions that use it: session.py and
models/files.py import the header reader, and so this module, for its header checks alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from specgen.errors import ModelFileError
from specgen.fileio import atomic_path

__all__ = [
    "ARCH_KEY",
    "dequantize_to_f32",
    "keep_first_layers",
    "open_reader",
    "scalar_formats",
    "tensor_bytes",
    "value_types",
]

ARCH_KEY = "general.architecture"
_ALIGNMENT_KEY = "general.alignment"
_FILE_TYPE_KEY = "general.file_type"
_TOKENS_KEY = "tokenizer.ggml.tokens"

# (name, value, value type, array sub-type or None): one metadata entry to write.
_KV = tuple[str, Any, Any, Any]
# (name, numpy array in numpy order, GGML type or None for plain dtypes): one tensor to write.
_TensorOut = tuple[str, np.ndarray, Any]


# ---------------------------------------------------------------------------------------------
# the value types and tensor sizes (for the header reader)


def value_types() -> Any:
    """``gguf.GGUFValueType``, GGUF's value types (imported on first use)."""
    from gguf import GGUFValueType

    return GGUFValueType


def scalar_formats() -> dict[int, str]:
    """struct formats of GGUF's fixed-size value types (``gguf.GGUFValueType``)."""
    from gguf import GGUFValueType as T

    return {
        T.UINT8: "<B", T.INT8: "<b", T.UINT16: "<H", T.INT16: "<h", T.UINT32: "<I",
        T.INT32: "<i", T.FLOAT32: "<f", T.BOOL: "<?", T.UINT64: "<Q", T.INT64: "<q",
        T.FLOAT64: "<d",
    }  # fmt: skip


def tensor_bytes(ggml_type: int, n_elements: int) -> int:
    """Bytes of a tensor of ``n_elements`` values stored as GGML type ``ggml_type`` (by
    ``gguf.GGML_QUANT_SIZES``: elements per block and bytes per block).

    Raises:
        ValueError, KeyError: an unknown GGML type.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return n_elements // block * type_size


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
        if field.name == ARCH_KEY or field.name.startswith("GGUF."):
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
    arch_field = reader.get_field(ARCH_KEY)
    if arch_field is None:
        raise ModelFileError(f"GGUF file has no {ARCH_KEY} key")
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
