"""A registry model's files without the network: which files of a repository a registry
``file:`` (exact name or glob) stands for, split sets included, and the checks of downloaded
files (GGUF magic, sizes, the registry's SHA-256) with the record of a failed check that keeps
a file from loading until it is downloaded again.

No network and no huggingface_hub: registry lookups and ``specgen models`` import this module
for the checksums alone (``test_registry_modules_import_nothing_heavy``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.errors import ModelFileError
from specgen.fileio import atomic_write
from specgen.models.demo import cache_dir
from specgen.models.header import GGUF_MAGIC, read_magic

if TYPE_CHECKING:
    from specgen.models.registry import ModelEntry

SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")
"""A split set's shard name: ``STEM-0000I-of-0000N.gguf``."""


def select_files(pattern: str, available: list[str]) -> list[str]:
    """The files a registry ``file`` (exact name or glob) stands for, first shard first.

    Returns [] when nothing matches. A match inside a split set (``-00001-of-0000N.gguf``)
    stands for the whole set.

    Raises:
        ModelFileError: the pattern matches several files or sets, or a set is incomplete.
    """
    matches = sorted(f for f in available if fnmatch.fnmatchcase(f, pattern))
    groups: dict[tuple[str, str | None], list[str]] = {}
    for f in matches:
        m = SPLIT_NAME.match(f)
        groups.setdefault((m["stem"], m["n"]) if m else (f, None), []).append(f)
    if len(groups) > 1:
        shown = ", ".join(matches[:8]) + (", ..." if len(matches) > 8 else "")
        raise ModelFileError(
            f"{pattern!r} matches {len(matches)} files ({shown}): "
            "make `file:` match one file or one split set"
        )
    if not groups:
        return []
    ((stem, n),) = groups
    if n is None:
        return matches
    names = split_names(stem, int(n))
    missing = sorted(set(names) - set(available))
    if missing:
        raise ModelFileError(f"split set {stem} is incomplete: missing {', '.join(missing)}")
    return names


def split_names(stem: str, count: int) -> list[str]:
    """All shard names of a split set, first shard first."""
    return [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def verify_files(entry: ModelEntry, paths: list[Path], sizes: list[int | None]) -> None:
    """Check GGUF magic and sizes (bytes) of every file, and the registry SHA-256 if given.

    Deletes nothing.

    Raises:
        ModelFileError: a file is not GGUF, has the wrong size or the wrong SHA-256.
    """
    for path, size in zip(paths, sizes, strict=True):
        magic = read_magic(path)
        if magic != GGUF_MAGIC:
            raise ModelFileError(
                f"{path} is not a GGUF file (starts with {magic!r}); check `file:` for "
                f"{entry.name} in the registry, then `specgen download {entry.name} --force`"
            )
        actual = path.stat().st_size
        if size is not None and actual != size:
            raise ModelFileError(
                f"{path} has {actual} bytes, the Hub says {size}: "
                f"run `specgen download {entry.name} --force`"
            )
    if entry.sha256:
        digest = sha256_file(paths[0])
        _remember_checksum(paths[0], None if digest == entry.sha256 else digest)
        if digest != entry.sha256:
            raise ModelFileError(
                f"SHA-256 mismatch for {entry.name}: expected {entry.sha256}, got {digest}; "
                f"the file is kept at {paths[0]} but not loaded. If the repository changed, "
                f"pin `revision:` or update `sha256:` in {entry.source}; otherwise download "
                f"it again with `specgen download {entry.name} --force`"
            )


def checksum_failure(entry: ModelEntry, paths: list[Path]) -> str | None:
    """Why the cached ``paths`` of ``entry`` must not be loaded, or None if they may be.

    A file that failed the registry's SHA-256 check stays in the cache (nothing is deleted
    without the user asking) but is refused until it is downloaded again (``--force``), or
    the registry's ``sha256`` is changed to its digest or removed. The check reads a record
    kept by :func:`verify_files`, not the file: a multi-GB file is hashed only on download.
    """
    if not entry.sha256 or not paths:
        return None
    got = _recorded_failure(paths[0])
    if got is None or got == entry.sha256:
        return None
    return (
        f"{entry.name} failed its SHA-256 check (expected {entry.sha256}, got {got}), so "
        f"{paths[0]} is not loaded: download it again with `specgen download {entry.name} "
        f"--force`, or if the repository changed on purpose, pin `revision:` or update "
        f"`sha256:` in {entry.source}"
    )


def _failures_file() -> Path:
    return cache_dir() / "checksum-failures.json"


def _file_key(path: Path) -> tuple[str, list[int]]:
    """A file's identity: its real path, and (size, mtime in ns) to notice it was replaced."""
    st = path.stat()
    return str(path.resolve()), [st.st_size, st.st_mtime_ns]


def _read_failures() -> dict[str, Any]:
    try:
        data = json.loads(_failures_file().read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _recorded_failure(path: Path) -> str | None:
    """The digest a failed check found for ``path``, if that same file is still there."""
    try:
        key, stamp = _file_key(path)
    except OSError:
        return None
    record = _read_failures().get(key)
    if not isinstance(record, dict) or record.get("stamp") != stamp:
        return None
    got = record.get("got")
    return got if isinstance(got, str) else None


def _remember_checksum(path: Path, failed_digest: str | None) -> None:
    """Record (``failed_digest``) or forget (None) a failed SHA-256 check of ``path``."""

    key, stamp = _file_key(path)
    failures = {k: v for k, v in _read_failures().items() if Path(k).exists()}
    if failed_digest is None and key not in failures:
        return
    if failed_digest is None:
        del failures[key]
    else:
        failures[key] = {"got": failed_digest, "stamp": stamp}
    target = _failures_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, (json.dumps(failures, indent=1) + "\n").encode("utf-8"))


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks of ``chunk_bytes``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()
