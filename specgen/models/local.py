"""GGUF files already on this machine, where other tools keep them: the Hugging Face cache,
llama.cpp's cache, LM Studio's models folder and Ollama's blob store (`specgen models
--local`), grouped by tokenizer with the vocabulary check's rules, and the draft a target
could use from them (`-md auto`).

Nothing is loaded: each file's vocabulary comes from its GGUF header
(:func:`specgen.models.header.read_vocab`), and no network is used.

Where each tool keeps its files (looked up at each call, from the environment):

- Hugging Face: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``;
  ``models--ORG--NAME/snapshots/COMMIT/FILE.gguf`` (links to ``blobs/``), named ``ORG/NAME/FILE``.
- llama.cpp (``-hf``): ``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp`` or
  ``~/.cache/llama.cpp`` (``~/Library/Caches/llama.cpp`` on macOS); GGUF files named as saved.
- LM Studio: ``~/.lmstudio/models`` and the older ``~/.cache/lm-studio/models``;
  ``PUBLISHER/REPO/FILE.gguf``.
- specgen's own cache (the demo pair and the drafts derived from it): ``$SPECGEN_CACHE``,
  else ``$XDG_CACHE_HOME/specgen`` or ``~/.cache/specgen``; GGUF files named as saved.
- Ollama: ``$OLLAMA_MODELS``, else ``~/.ollama/models`` (and ``/usr/share/ollama/.ollama/models``
  of the Linux service); ``manifests/HOST/NAMESPACE/MODEL/TAG`` is JSON whose layer of media
  type ``application/vnd.ollama.image.model`` names the GGUF blob ``blobs/sha256-HEX``; named
  ``MODEL:TAG`` (``NAMESPACE/MODEL:TAG`` outside ``library``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from specgen.compat import check_compatible
from specgen.engine import VocabInfo
from specgen.errors import ModelFileError, VocabMismatchError
from specgen.models.demo import cache_dir
from specgen.models.header import GGUF_MAGIC, HeaderVocab, read_magic, read_vocab

HUGGING_FACE = "Hugging Face"
LLAMA_CPP = "llama.cpp"
LM_STUDIO = "LM Studio"
OLLAMA = "Ollama"
SPECGEN = "specgen"
_OLLAMA_MODEL = "application/vnd.ollama.image.model"
_OLLAMA_HOST = "registry.ollama.ai"
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
#: a draft must be at most this share of its target's size to be proposed (`-md auto`):
#: cheaper per token by enough to pay for the rounds it loses (the demo pair's is 1 / 4.3)
DRAFT_SIZE_SHARE = 0.5


@dataclass(frozen=True)
class LocalModel:
    """One GGUF model found on disk.

    Attributes:
        name: what its tool calls it (``ORG/NAME/FILE`` on the Hub, ``MODEL:TAG`` in Ollama).
        source: the tool: ``HUGGING_FACE``, ``LLAMA_CPP``, ``SPECGEN``, ``LM_STUDIO`` or
            ``OLLAMA``.
        path: the file to load (a split set's first shard).
        size_bytes: bytes on disk, every shard of a split set included.
        vocab: its vocabulary from the header, or None (no tokenizer: a projector, a file
            whose header could not be read).
    """

    name: str
    source: str
    path: Path
    size_bytes: int
    vocab: HeaderVocab | None


@dataclass(frozen=True)
class TokenizerGroup:
    """Models whose vocabularies pass the draft/target check with each other's first
    member (``specgen.compat.check_compatible``), largest first; any smaller one can draft
    for a larger one as far as the tokenizer goes."""

    vocab: HeaderVocab | None
    models: tuple[LocalModel, ...]


def search_roots() -> list[tuple[str, Path]]:
    """(tool, folder) for each place looked in, whether it exists or not (module docstring)."""
    home = Path.home()
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache")
    if os.environ.get("HF_HUB_CACHE"):
        hf = Path(os.environ["HF_HUB_CACHE"])
    elif os.environ.get("HF_HOME"):
        hf = Path(os.environ["HF_HOME"]) / "hub"
    else:
        hf = xdg / "huggingface" / "hub"
    if os.environ.get("LLAMA_CACHE"):
        llama = Path(os.environ["LLAMA_CACHE"])
    elif sys.platform == "darwin":
        llama = home / "Library" / "Caches" / "llama.cpp"
    else:
        llama = xdg / "llama.cpp"
    roots = [(HUGGING_FACE, hf), (LLAMA_CPP, llama), (SPECGEN, cache_dir())]
    roots += [(LM_STUDIO, home / ".lmstudio" / "models"), (LM_STUDIO, xdg / "lm-studio" / "models")]
    if os.environ.get("OLLAMA_MODELS"):
        roots.append((OLLAMA, Path(os.environ["OLLAMA_MODELS"])))
    else:
        roots += [
            (OLLAMA, home / ".ollama" / "models"),
            (OLLAMA, Path("/usr/share/ollama/.ollama/models")),
        ]
    return [(tool, p.expanduser()) for tool, p in roots]


def find_local(
    roots: list[tuple[str, Path]] | None = None, with_vocab: bool = True
) -> list[LocalModel]:
    """Every GGUF model under ``roots`` (default :func:`search_roots`), each file once (a
    blob linked from several snapshots or tools is listed where it is found first), a
    split set as one model. Unreadable folders and files are skipped. ``with_vocab=False``
    leaves ``vocab`` None (no header is read beyond the magic)."""
    seen: set[Path] = set()
    found: list[LocalModel] = []
    for tool, root in roots if roots is not None else search_roots():
        if not root.is_dir():
            continue
        walk = _ollama(root) if tool == OLLAMA else _gguf_files(root, tool)
        for name, path in walk:
            try:
                real = path.resolve()
                if real in seen or read_magic(path) != GGUF_MAGIC:
                    continue
                size = _size(path)
            except OSError:
                continue
            seen.add(real)
            found.append(LocalModel(name, tool, path, size, _vocab(path) if with_vocab else None))
    return found


def group_by_tokenizer(models: list[LocalModel]) -> list[TokenizerGroup]:
    """Models grouped by compatible vocabulary, groups with the largest model first; the
    models without a vocabulary in one group last."""
    groups: list[list[LocalModel]] = []
    no_vocab: list[LocalModel] = []
    for m in sorted(models, key=lambda m: -m.size_bytes):
        if m.vocab is None:
            no_vocab.append(m)
            continue
        home = next((g for g in groups if compatible(g[0].vocab, m.vocab)), None)
        if home is None:
            groups.append([m])
        else:
            home.append(m)
    out = [TokenizerGroup(g[0].vocab, tuple(g)) for g in groups]
    if no_vocab:
        out.append(TokenizerGroup(None, tuple(no_vocab)))
    return out


def compatible(target: HeaderVocab | None, draft: HeaderVocab | None) -> bool:
    """Whether ``draft`` passes the draft/target vocabulary check against ``target``."""
    if target is None or draft is None:
        return False
    try:
        check_compatible(
            vocab_info(target),
            vocab_info(draft),
            lambda i: target.tokens[i],  # type: ignore[arg-type, return-value]
            lambda i: draft.tokens[i],  # type: ignore[arg-type, return-value]
        )
    except VocabMismatchError:
        return False
    return True


def vocab_info(v: HeaderVocab) -> VocabInfo:
    """The fields `specgen.compat` compares, from a header vocabulary."""
    return VocabInfo(v.vocab_type, v.n_vocab, v.bos, v.eos, v.add_bos, v.add_eos)


def draft_for(
    target: Path, models: list[LocalModel] | None = None
) -> tuple[LocalModel | None, list[LocalModel]]:
    """The local model ``-md auto`` uses for ``target``: the smallest GGUF whose vocabulary
    passes the check against the target's and whose size is at most ``DRAFT_SIZE_SHARE`` of
    the target's (the target's own file excluded). Returns (that model or None, every
    compatible smaller candidate, smallest first).

    Raises:
        ModelFileError: the target's header cannot be read.
        OSError: the target cannot be read.
    """
    t_vocab = read_vocab(target)
    t_size = _size(target)
    t_real = target.resolve()
    # sizes first: only the headers of files small enough are read
    pool = models if models is not None else find_local(with_vocab=False)
    small = [
        m for m in pool if m.path.resolve() != t_real and m.size_bytes <= DRAFT_SIZE_SHARE * t_size
    ]
    small = [m if m.vocab is not None else replace(m, vocab=_vocab(m.path)) for m in small]
    fits = sorted((m for m in small if compatible(t_vocab, m.vocab)), key=lambda m: m.size_bytes)
    return (fits[0] if fits else None), fits


def size_text(n: int) -> str:
    """Bytes for people, as `specgen models` shows them: "1.23 GB", "473.00 kB", "12 B"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


# -- the tools' layouts ------------------------------------------------------------------------


def _gguf_files(root: Path, tool: str) -> Iterator[tuple[str, Path]]:
    """(name, path) of each ``*.gguf`` under ``root`` but a split set's later shards."""
    for path in sorted(root.rglob("*.gguf")):
        shard = _SHARD.search(path.name)
        if shard and int(shard[1]) != 1:
            continue
        rel = path.relative_to(root)
        if tool == HUGGING_FACE:  # models--ORG--NAME/snapshots/COMMIT/FILE
            parts = rel.parts
            if len(parts) < 4 or not parts[0].startswith("models--") or parts[1] != "snapshots":
                continue  # blobs/ hold the same bytes without a name
            repo = parts[0][len("models--") :].replace("--", "/")
            yield f"{repo}/{'/'.join(parts[3:])}", path
        else:
            yield rel.as_posix(), path


def _ollama(root: Path) -> Iterator[tuple[str, Path]]:
    """(MODEL:TAG, blob) for each manifest under ``root/manifests`` that names a model layer."""
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        parts = manifest.relative_to(manifests).parts
        if len(parts) != 4:  # HOST/NAMESPACE/MODEL/TAG
            continue
        host, namespace, model, tag = parts
        try:
            layers = json.loads(manifest.read_text("utf-8")).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue
        for layer in layers:
            if isinstance(layer, dict) and layer.get("mediaType") == _OLLAMA_MODEL:
                digest = str(layer.get("digest", ""))
                blob = root / "blobs" / digest.replace(":", "-")
                name = f"{model}:{tag}"
                if host != _OLLAMA_HOST:
                    name = f"{host}/{namespace}/{name}"
                elif namespace != "library":
                    name = f"{namespace}/{name}"
                yield name, blob


def _size(path: Path) -> int:
    """Bytes of ``path``, or of every shard of its split set."""
    shard = _SHARD.search(path.name)
    if not shard:
        return path.stat().st_size
    stem = path.name[: shard.start()]
    n = int(shard[2])
    total = 0
    for i in range(1, n + 1):
        part = path.with_name(f"{stem}-{i:05d}-of-{n:05d}.gguf")
        if part.exists():
            total += part.stat().st_size
    return total


def _vocab(path: Path) -> HeaderVocab | None:
    try:
        return read_vocab(path)
    except (ModelFileError, OSError):
        return None
