"""`specgen download`: plan and fetch every file of a registry model into the Hugging Face
cache through ``specgen.models.hub``, then check them (``specgen.models.files``). Nothing here
prints: pass a progress hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specgen.errors import ConfigError, NetworkError
from specgen.models.files import verify_files
from specgen.models.hub import (
    ProgressHook,
    blob_and_lock,
    fetch,
    find_cached,
    hub_endpoint,
    hub_errors,
    is_offline,
    metadata,
    offline_error,
    remote_names,
)

if TYPE_CHECKING:
    from specgen.models.registry import ModelEntry


@dataclass(frozen=True)
class FilePlan:
    """What a download of one file would do (``specgen download --dry-run``)."""

    filename: str
    size_bytes: int | None
    cached: bool


@dataclass(frozen=True)
class DownloadResult:
    """Downloaded files of one model, first shard first; ``path`` is the one to load."""

    model: str
    paths: tuple[Path, ...]
    transferred_bytes: int

    @property
    def path(self) -> Path:
        return self.paths[0]


def plan_download(entry: ModelEntry, revision: str | None = None) -> list[FilePlan]:
    """The files a download would fetch, with sizes (bytes) and whether each is cached.

    Uses the network (file metadata only) unless offline.

    Raises:
        NetworkError: offline, or the Hub cannot be reached, and the files are not cached.
        DownloadError: authentication or missing-file problems.
    """
    repo, rev, cached = _source(entry, revision)
    if cached is not None:
        return [FilePlan(p.name, p.stat().st_size, True) for p in cached]
    plans = []
    with hub_errors(entry, rev):
        for name in remote_names(entry, rev):
            _, meta = metadata(repo, name, rev)
            blob, _ = blob_and_lock(repo, meta.etag)
            plans.append(FilePlan(name, meta.size, blob.is_file()))
    return plans


def download_model(
    entry: ModelEntry,
    *,
    revision: str | None = None,
    force: bool = False,
    progress: ProgressHook | None = None,
) -> DownloadResult:
    """Download every file of a registry model into the Hub cache, then verify it.

    Args:
        entry: a non-embedded registry model.
        revision: overrides the registry's revision (default ``main``).
        force: delete this model's cached copy first (an explicit user request).
        progress: called with (file name, bytes done, total bytes) as bytes arrive.

    Raises:
        DownloadError: no network, gated/private repository, missing file, full disk,
            interrupted transfer (the next run resumes it).
        ModelFileError: the downloaded file fails the GGUF, size or SHA-256 check.
        KeyboardInterrupt: passed through; the partial file is kept where the next run
            resumes from (``blobs/<etag>.incomplete``), never in a snapshot.
    """
    repo, rev, cached = _source(entry, revision)
    if cached is not None:
        verify_files(entry, cached, [None] * len(cached))
        return DownloadResult(entry.name, tuple(cached), 0)
    paths: list[Path] = []
    sizes: list[int | None] = []
    moved = 0
    with hub_errors(entry, rev):
        names = remote_names(entry, rev)
        if entry.sha256 and len(names) > 1:
            raise ConfigError(
                f"{entry.source}: models.{entry.name}.sha256: the model is a split set of "
                f"{len(names)} files; remove sha256"
            )
        for name in names:
            path, size, n = fetch(repo, name, rev, force, progress)
            paths.append(path)
            sizes.append(size)
            moved += n
    verify_files(entry, paths, sizes)
    return DownloadResult(entry.name, tuple(paths), moved)


def _source(entry: ModelEntry, revision: str | None) -> tuple[str, str, list[Path] | None]:
    """The entry's Hub repository and revision (default ``main``) and, offline, its cached
    files (None when the Hub may be asked).

    Raises:
        ConfigError: an embedded model (nothing to download).
        NetworkError: offline, and the files are not cached.
    """
    if entry.embedded or entry.repo is None or entry.file is None:
        raise ConfigError(f"{entry.name} is an embedded model: nothing to download")
    rev = revision or entry.revision or "main"
    if not is_offline():
        return entry.repo, rev, None
    cached = find_cached(entry, rev)
    if cached is None:
        raise offline_error(entry)
    return entry.repo, rev, cached


def dry_run_unchecked(e: NetworkError) -> str:
    """What a dry run could not check without the Hub (``e`` from :func:`plan_download`), in
    one line: the rows marked "not checked" came from the registry alone."""
    why = (
        "HF_HUB_OFFLINE is set"
        if is_offline()
        else f"cannot reach {hub_endpoint()} ({type(e.__cause__ or e).__name__})"
    )
    return (
        f"{why}: the rows marked 'not checked' show the registry's file and size, not the"
        " Hub's (file names, sizes and cache state unchecked); nothing was downloaded"
    )
