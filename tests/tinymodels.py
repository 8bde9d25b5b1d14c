"""Test-only GGUF writers (moved out of the package: nothing in specgen uses them):
`write_tiny_llama`, a ~0.5 MB random ``llama``-architecture model for fast tests, and
`replace_token`, a copy with one vocabulary entry changed (a vocabulary-mismatch case).

Built on the plumbing of `specgen.models.gguf` (its private helpers, on purpose: the one
writer of GGUF files stays there), so a written file is atomic in the same way.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from specgen.errors import ModelFileError
from specgen.models.gguf import (
    _FILE_TYPE_KEY,
    _KV,
    _TOKENS_KEY,
    _arch_and_alignment,
    _field_kvs,
    _raw_tensor_spec,
    _write_gguf,
    open_reader,
)


def replace_token(src: Path | str, dst: Path | str, token_id: int, text: str) -> None:
    """Write a copy of ``src`` whose vocabulary entry ``token_id`` reads ``text``.

    Only ``tokenizer.ggml.tokens[token_id]`` changes; tensors are copied byte for byte and all
    other metadata is unchanged (scores and token types too). Used to build a draft whose
    vocabulary differs from its target in exactly one token.

    Args:
        src: source GGUF file with a ``tokenizer.ggml.tokens`` array.
        dst: destination path; replaced atomically.
        token_id: index into the token list, ``0 <= token_id < n_vocab``.
        text: the new token text (must differ from every existing token, or llama.cpp's
            tokenizer may behave oddly; not checked).

    Raises:
        ModelFileError: ``src`` is missing, not a readable GGUF file, or has no token list.
        ValueError: ``token_id`` out of range.
    """
    reader = open_reader(src)
    arch, alignment = _arch_and_alignment(reader)
    if reader.get_field(_TOKENS_KEY) is None:
        raise ModelFileError(f"{src}: no {_TOKENS_KEY} key")
    kvs: list[_KV] = []
    for name, value, vtype, sub_type in _field_kvs(reader):
        if name == _TOKENS_KEY:
            if not 0 <= token_id < len(value):
                raise ValueError(f"token_id must be in 0..{len(value) - 1}, got {token_id}")
            value = list(value)
            value[token_id] = text
        kvs.append((name, value, vtype, sub_type))
    tensors = list(reader.tensors)
    _write_gguf(
        dst, arch, alignment, kvs, [_raw_tensor_spec(t) for t in tensors], lambda i: tensors[i].data
    )


# ---------------------------------------------------------------------------------------------
# tiny synthetic model

# Words with their prefix chains, so that llama.cpp's SentencePiece merge loop
# (which only merges pairs whose concatenation is in the vocabulary) can reach them.
_TINY_WORDS = ["▁the", "▁cat", "▁on", "▁mat", "▁a"]

# Scale of the output layer, tuned so that at temperature 1 the top token probability is
# typically 0.2-0.9 (see write_tiny_llama's docstring for measured figures).
_TINY_LOGIT_SCALE = 4.0


def _tiny_vocab(extra_words: list[str]) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of the tiny SentencePiece-style vocabulary.

    Ids: 0 ``<unk>``, 1 ``<s>``, 2 ``</s>``, 3..258 byte tokens ``<0x00>``..``<0xFF>``, then
    ``▁`` and the prefix chains of the built-in words, then ``extra_words`` in order.
    """
    import gguf

    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [int(tt.UNKNOWN), int(tt.CONTROL), int(tt.CONTROL)] + [int(tt.BYTE)] * 256
    words: list[str] = ["▁"]
    for w in _TINY_WORDS:
        for end in range(2, len(w) + 1):
            if w[:end] not in words:
                words.append(w[:end])
    for w in extra_words:
        if w in tokens or w in words:
            raise ValueError(f"extra word {w!r} is already in the vocabulary")
        words.append(w)
    tokens += words
    types += [int(tt.NORMAL)] * len(words)
    # SentencePiece scores: byte/control tokens 0; words scored so longer pieces merge first.
    scores = [0.0] * 259 + [-100.0 + float(len(w)) for w in words]
    return tokens, scores, types


def write_tiny_llama(
    dst: Path | str,
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    n_layer: int = 2,
    n_embd: int = 64,
    extra_words: list[str] | None = None,
) -> None:
    """Write a small random ``llama``-architecture GGUF model (F32) for fast tests.

    Vocabulary (SentencePiece style, ``tokenizer.ggml.model = "llama"``): 272 tokens with no
    ``extra_words``: ``<unk>`` 0, ``<s>`` 1 (BOS), ``</s>`` 2 (EOS), the 256 byte tokens
    ``<0x00>``..``<0xFF>`` (ids 3..258), then ``▁`` and the words "▁the", "▁cat", "▁on",
    "▁mat", "▁a" with their prefix chains; ``extra_words`` are appended after these, so base
    token ids never move. ``add_bos`` is true, ``add_eos`` false. Text outside the words is
    encoded with byte tokens.

    Architecture: ``n_layer`` blocks, width ``n_embd``, 4 heads of ``n_embd // 4``, FFN width
    ``2 * n_embd``, context 512, separate (untied) output matrix. Defaults give 473 kB.

    Weights: each tensor is drawn from its own generator seeded by ``(seed, tensor name)``;
    rows for ``extra_words`` use a separate stream, so models differing only in
    ``extra_words`` share all other weights exactly. ``noise > 0`` adds Gaussian noise of
    standard deviation ``noise`` (from ``(noise_seed, tensor name)``) to every weight, norms
    included: same ``seed`` with small noise gives a draft that agrees partly with its target.
    The output layer is scaled so that at temperature 1 the next-token distribution is neither
    uniform nor one-hot (top probability typically 0.2-0.9).

    Args:
        dst: destination path; replaced atomically.
        seed: weight seed.
        noise: standard deviation of the added weight noise (0 for none).
        noise_seed: seed of the noise.
        n_layer: transformer blocks (>= 1).
        n_embd: model width, a multiple of 8 (head size ``n_embd // 4`` must be even for RoPE).
        extra_words: extra normal tokens appended to the vocabulary (no duplicates).

    Raises:
        ValueError: bad sizes, or an extra word already in the vocabulary.
    """
    import gguf

    if n_layer < 1 or n_embd < 8 or n_embd % 8:
        raise ValueError(f"need n_layer >= 1 and n_embd a multiple of 8, got {n_layer}, {n_embd}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    extra = list(extra_words or [])
    tokens, scores, types = _tiny_vocab(extra)
    n_vocab = len(tokens)
    n_base = n_vocab - len(extra)
    n_head = 4
    n_ff = 2 * n_embd
    n_ctx = 512

    def rng(base_seed: int, name: str) -> np.random.Generator:
        return np.random.default_rng([base_seed, zlib.crc32(name.encode())])

    def normal(name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
        return rng(seed, name).standard_normal(shape) * std

    def vocab_rows(name: str, std: float) -> np.ndarray:
        base = normal(name, (n_base, n_embd), std)
        more = rng(seed, name + "#extra").standard_normal((n_vocab - n_base, n_embd)) * std
        return np.concatenate([base, more], axis=0)

    # numpy order: (rows, row length) = (out features, in features).
    w: dict[str, np.ndarray] = {"token_embd.weight": vocab_rows("token_embd.weight", 1.0)}
    inv = 1.0 / np.sqrt(n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(n_embd)
        w[p + "attn_q.weight"] = normal(p + "attn_q.weight", (n_embd, n_embd), 2.0 * inv)
        w[p + "attn_k.weight"] = normal(p + "attn_k.weight", (n_embd, n_embd), 2.0 * inv)
        w[p + "attn_v.weight"] = normal(p + "attn_v.weight", (n_embd, n_embd), inv)
        w[p + "attn_output.weight"] = normal(p + "attn_output.weight", (n_embd, n_embd), inv)
        w[p + "ffn_norm.weight"] = np.ones(n_embd)
        w[p + "ffn_gate.weight"] = normal(p + "ffn_gate.weight", (n_ff, n_embd), inv)
        w[p + "ffn_up.weight"] = normal(p + "ffn_up.weight", (n_ff, n_embd), inv)
        w[p + "ffn_down.weight"] = normal(p + "ffn_down.weight", (n_embd, n_ff), n_ff**-0.5)
    w["output_norm.weight"] = np.ones(n_embd)
    w["output.weight"] = vocab_rows("output.weight", _TINY_LOGIT_SCALE * inv)
    if noise > 0:
        for name, arr in w.items():
            arr += rng(noise_seed, name).standard_normal(arr.shape) * noise
    arrays = [(name, np.ascontiguousarray(arr, dtype=np.float32)) for name, arr in w.items()]

    vt = gguf.GGUFValueType
    a = "llama"
    kvs: list[_KV] = [
        ("general.name", "specgen tiny llama", vt.STRING, None),
        (_FILE_TYPE_KEY, int(gguf.LlamaFileType.ALL_F32), vt.UINT32, None),
        (f"{a}.context_length", n_ctx, vt.UINT32, None),
        (f"{a}.embedding_length", n_embd, vt.UINT32, None),
        (f"{a}.block_count", n_layer, vt.UINT32, None),
        (f"{a}.feed_forward_length", n_ff, vt.UINT32, None),
        (f"{a}.attention.head_count", n_head, vt.UINT32, None),
        (f"{a}.attention.head_count_kv", n_head, vt.UINT32, None),
        (f"{a}.attention.layer_norm_rms_epsilon", 1e-5, vt.FLOAT32, None),
        (f"{a}.rope.dimension_count", n_embd // n_head, vt.UINT32, None),
        (f"{a}.vocab_size", n_vocab, vt.UINT32, None),
        ("tokenizer.ggml.model", "llama", vt.STRING, None),
        (_TOKENS_KEY, tokens, vt.ARRAY, vt.STRING),
        ("tokenizer.ggml.scores", scores, vt.ARRAY, vt.FLOAT32),
        ("tokenizer.ggml.token_type", types, vt.ARRAY, vt.INT32),
        ("tokenizer.ggml.unknown_token_id", 0, vt.UINT32, None),
        ("tokenizer.ggml.bos_token_id", 1, vt.UINT32, None),
        ("tokenizer.ggml.eos_token_id", 2, vt.UINT32, None),
        ("tokenizer.ggml.add_bos_token", True, vt.BOOL, None),
        ("tokenizer.ggml.add_eos_token", False, vt.BOOL, None),
    ]
    specs = [(n, arr.shape, arr.dtype, int(arr.nbytes), None) for n, arr in arrays]
    _write_gguf(dst, a, None, kvs, specs, lambda i: arrays[i][1])
