"""Model downloads into the standard Hugging Face cache, through huggingface_hub's public API.

Settings are huggingface_hub's own (:mod:`huggingface_hub.constants`, read when it is first
imported): ``HF_ENDPOINT``, ``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``; the token is
:func:`huggingface_hub.get_token`'s (``HF_TOKEN``, else the saved login). Nothing here prints:
pass a progress hook.

What the public API does not do in huggingface_hub 2.4 is resume a transfer across runs
(``hf_hub_download`` deletes its partial file when interrupted). :func:`_transfer` does that
one thing: it appends to ``blobs/<etag>.incomplete`` with HTTP Range requests and renames it
to ``blobs/<etag>`` only when complete, so the path a model is loaded from never holds a
partial file; ``hf_hub_download`` then links the finished blob into its snapshot.
``tests/test_download.py::test_upstream_*`` fail when upstream changes what this relies on.

huggingface_hub (and its HTTP client) is imported inside the functions that use it: importing
it costs about 150 ms, and `specgen models` and registry lookups import this module for the
cache paths and checksums alone (``test_registry_modules_import_nothing_heavy``).
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.errors import ConfigError, DownloadError, ModelFileError, NetworkError
from specgen.fileio import atomic_write
from specgen.models.demo import cache_dir
from specgen.models.gguf import GGUF_MAGIC, read_magic

if TYPE_CHECKING:
    from specgen.models.registry import ModelEntry

#: progress hook: (file name in the repository, bytes done, total bytes or None)
ProgressHook = Callable[[str, int, "int | None"], None]

LIBRARY = "specgen"
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_GLOB_CHARS = frozenset("*?[")
#: a transfer that stops without receiving a byte is retried this many times in one run
_STALLED_RETRIES = 3


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


# --- huggingface_hub's settings --------------------------------------------------------------


def hub_endpoint() -> str:
    """The Hub's address (``HF_ENDPOINT``, else the public Hub)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_cache_dir() -> Path:
    """The Hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def is_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set."""
    from huggingface_hub import is_offline_mode

    return is_offline_mode()


def _token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


# --- file selection and the cache (no network) ----------------------------------------------


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
        m = _SPLIT.match(f)
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


def find_cached(entry: ModelEntry, revision: str | None = None) -> list[Path] | None:
    """Cached paths of a registry model (first shard first), or None if not all are cached.

    Looks in the snapshot of the pinned commit only; for a branch or tag, in the snapshot
    its ref names first, then in any other snapshot, newest first (a model downloaded with
    ``--revision`` is found without it). Never uses the network. Complete files only: partial
    downloads are not in any snapshot. Read with :func:`huggingface_hub.scan_cache_dir`.
    """
    if entry.repo is None or entry.file is None:
        return None
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    rev = revision or entry.revision or "main"
    try:
        cache = scan_cache_dir(hub_cache_dir())
    except CacheNotFound:
        return None
    repo = next(
        (r for r in cache.repos if r.repo_id == entry.repo and r.repo_type == "model"), None
    )
    if repo is None:
        return None
    if _COMMIT.match(rev):
        revisions = [r for r in repo.revisions if r.commit_hash == rev]
    else:
        revisions = sorted(repo.revisions, key=lambda r: (rev not in r.refs, -r.last_modified))
    for r in revisions:
        files = {f.file_path.relative_to(r.snapshot_path).as_posix(): f.file_path for f in r.files}
        try:
            names = select_files(entry.file, list(files))
        except ModelFileError:
            continue
        if names:
            return [files[n] for n in names]
    return None


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


# --- the network ---------------------------------------------------------------------------


def plan_download(entry: ModelEntry, revision: str | None = None) -> list[FilePlan]:
    """The files a download would fetch, with sizes (bytes) and whether each is cached.

    Uses the network (file metadata only) unless offline.

    Raises:
        NetworkError: offline, or the Hub cannot be reached, and the files are not cached.
        DownloadError: authentication or missing-file problems.
    """
    repo = _check_downloadable(entry)
    rev = revision or entry.revision or "main"
    if is_offline():
        cached = find_cached(entry, rev)
        if cached is None:
            raise _offline_error(entry)
        return [FilePlan(p.name, p.stat().st_size, True) for p in cached]
    plans = []
    with _hub_errors(entry, rev):
        for name in _remote_names(entry, rev):
            _, meta = _metadata(repo, name, rev)
            blob, _ = _blob_and_lock(repo, meta.etag)
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
    repo = _check_downloadable(entry)
    rev = revision or entry.revision or "main"
    if is_offline():
        cached = find_cached(entry, rev)
        if cached is None:
            raise _offline_error(entry)
        verify_files(entry, cached, [None] * len(cached))
        return DownloadResult(entry.name, tuple(cached), 0)
    paths: list[Path] = []
    sizes: list[int | None] = []
    moved = 0
    with _hub_errors(entry, rev):
        names = _remote_names(entry, rev)
        if entry.sha256 and len(names) > 1:
            raise ConfigError(
                f"{entry.source}: models.{entry.name}.sha256: the model is a split set of "
                f"{len(names)} files; remove sha256"
            )
        for name in names:
            path, size, n = _fetch(repo, name, rev, force, progress)
            paths.append(path)
            sizes.append(size)
            moved += n
    verify_files(entry, paths, sizes)
    return DownloadResult(entry.name, tuple(paths), moved)


def _client() -> dict[str, Any]:
    """The keyword arguments every huggingface_hub call gets."""
    return {"token": _token(), "library_name": LIBRARY}


def _check_downloadable(entry: ModelEntry) -> str:
    """The entry's Hub repository; ConfigError for an embedded model."""
    if entry.embedded or entry.repo is None or entry.file is None:
        raise ConfigError(f"{entry.name} is an embedded model: nothing to download")
    return entry.repo


def _list_files(repo: str, revision: str) -> list[str]:
    """The repository's file names, in one request.

    ``HfApi.model_info`` (its ``siblings``) rather than ``list_repo_files``: the listing
    pages through ``http_backoff``, which without a network retries 5 times over about 24 s,
    logging each retry, where every other call here fails at once. huggingface_hub's own
    log is kept to errors for the call as well.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.utils import logging as hf_logging

    api = HfApi(token=_token(), library_name=LIBRARY)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        info = api.model_info(repo, revision=revision)
    finally:
        hf_logging.set_verbosity(level)
    return [s.rfilename for s in info.siblings or []]


def _remote_names(entry: ModelEntry, revision: str) -> list[str]:
    """Exact names need no listing (split shards are named by rule); globs list the repo."""
    assert entry.file is not None and entry.repo is not None
    if not _GLOB_CHARS & set(entry.file):
        m = _SPLIT.match(entry.file)
        return split_names(m["stem"], int(m["n"])) if m else [entry.file]
    available = _list_files(entry.repo, revision)
    names = select_files(entry.file, available)
    if not names:
        raise _missing_file_error(entry.repo, entry.file, revision, available)
    return names


def _fetch(
    repo: str, filename: str, revision: str, force: bool, progress: ProgressHook | None
) -> tuple[Path, int | None, int]:
    """Fetch one file into the cache: (snapshot path, size in bytes, bytes transferred)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import WeakFileLock

    url, meta = _metadata(repo, filename, revision)
    blob, lock = _blob_and_lock(repo, meta.etag)
    partial = blob.with_name(blob.name + ".incomplete")
    if force:
        info = hf_hub_download(repo, filename, revision=revision, dry_run=True, **_client())
        for p in (Path(info.local_path), blob, partial):
            p.unlink(missing_ok=True)
    moved = 0
    if not blob.is_file():
        lock.parent.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(lock):
            if not blob.is_file():
                moved = _transfer(meta.location, url, meta.size, filename, partial, progress)
                os.replace(partial, blob)
    elif progress is not None:
        progress(filename, blob.stat().st_size, meta.size)
    # the blob is complete: this links it into the snapshot and records the ref, no transfer
    path = hf_hub_download(repo, filename, revision=revision, **_client())
    return Path(path), meta.size, moved


def _metadata(repo: str, filename: str, revision: str) -> tuple[str, Any]:
    """(URL, ``HfFileMetadata``) of one file: one HEAD request, no retries, so that a
    missing network is said at once (``hf_hub_download`` retries for about 20 s first)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo, filename, revision=revision)
    meta = get_hf_file_metadata(url, **_client())
    if not meta.etag or not meta.commit_hash:
        raise DownloadError(
            f"{hub_endpoint()} did not answer like a Hugging Face Hub for {repo}/{filename} "
            "(no ETag or X-Repo-Commit): check HF_ENDPOINT and any proxy"
        )
    return url, meta


def _blob_and_lock(repo: str, etag: str) -> tuple[Path, Path]:
    """Where ``hf_hub_download`` keeps a file's bytes and the lock it takes to write them.

    The one place that knows huggingface_hub's cache layout (no public function names a
    blob): ``<cache>/models--<org>--<name>/blobs/<etag>`` and
    ``<cache>/.locks/models--<org>--<name>/<etag>.lock``. Checked against hf_hub_download by
    ``test_upstream_blob_layout_is_what_resuming_writes_to``.
    """
    folder = "models--" + repo.replace("/", "--")
    return (
        hub_cache_dir() / folder / "blobs" / etag,
        hub_cache_dir() / ".locks" / folder / f"{etag}.lock",
    )


def _transfer(
    location: str,
    url: str,
    size: int | None,
    filename: str,
    partial: Path,
    progress: ProgressHook | None,
) -> int:
    """Append the missing bytes of ``location`` to ``partial``; returns the bytes moved.

    Resumes from ``partial``'s size with ``Range: bytes=N-`` (RFC 9110, 14.2), also within
    this call when the connection drops after some bytes arrived; restarts from 0 when the
    server ignores the range (answers 200). The token is not sent to another host (the
    Hub's CDN URLs are signed), as ``hf_hub_download`` does.

    Raises:
        DownloadError: the disk is too small, or the transfer stopped (the bytes received so
            far stay in ``partial``; the next run resumes).
    """
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    partial.parent.mkdir(parents=True, exist_ok=True)
    start = partial.stat().st_size if partial.exists() else 0
    if size is not None and start > size:
        partial.unlink()
        start = 0
    need = (size or 0) - start
    free = _free_bytes(partial.parent)
    if need > free:
        raise _disk_full(partial.parent, need, free)
    headers = build_hf_headers(**_client())
    headers["Accept-Encoding"] = "identity"
    if _host(location) != _host(url):
        headers.pop("authorization", None)
    stalls = 0
    with open(partial, "ab") as f:
        while size is None or f.tell() < size:
            done = f.tell()
            ask = {**headers, "Range": f"bytes={done}-"} if done else headers
            try:
                with get_session().stream(
                    "GET", location, headers=ask, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
                ) as response:
                    hf_raise_for_status(response)
                    if done and response.status_code == 200:  # the range was ignored
                        f.seek(0)
                        f.truncate()
                        start = 0
                    for chunk in response.iter_bytes():
                        f.write(chunk)
                        if progress is not None:
                            progress(filename, f.tell(), size)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise _disk_full(partial.parent, need, _free_bytes(partial.parent)) from e
                raise
            except httpx2.TransportError as e:  # the connection dropped or timed out
                stalls = 0 if f.tell() > done else stalls + 1
                if stalls > _STALLED_RETRIES:
                    raise DownloadError(
                        f"the transfer of {filename} stopped at {f.tell()} of {size} bytes "
                        f"({type(e).__name__}); run the same command again to resume"
                    ) from e
                continue
            if size is None:
                break
            if f.tell() == done:
                stalls += 1
                if stalls > _STALLED_RETRIES:
                    raise DownloadError(
                        f"{_host(location)} sent no bytes of {filename} after {done}; "
                        "run the same command again to resume"
                    )
        return f.tell() - start


def _host(url: str) -> str:
    return url.split("/")[2] if "://" in url else ""


def _free_bytes(folder: Path) -> int:
    """Free bytes on the disk holding ``folder``."""
    return shutil.disk_usage(folder).free


# --- errors --------------------------------------------------------------------------------


@contextmanager
def _hub_errors(entry: ModelEntry, revision: str) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into one-line DownloadErrors."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, ep = entry.repo, hub_endpoint()
    try:
        yield
    except GatedRepoError as e:
        raise _auth_error(repo, e) from e
    except RevisionNotFoundError as e:
        raise DownloadError(
            f"{repo} has no revision {revision!r}: fix `revision:` or --revision"
        ) from e
    except RemoteEntryNotFoundError as e:
        raise _missing_file_error(repo, entry.file or "", revision, None) from e
    except RepositoryNotFoundError as e:
        raise DownloadError(
            f"repository {repo} not found on {ep} (HTTP {_status(e)}): check `repo:` for "
            f"{entry.name}; if it is private, set HF_TOKEN to a token that can read it"
        ) from e
    except HfHubHTTPError as e:
        if _status(e) in (401, 403):
            raise _auth_error(repo, e) from e
        raise DownloadError(f"{ep} answered HTTP {_status(e)} for {repo}: try again later") from e
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, httpx2.TransportError) as e:
        # hf_hub_download says LocalEntryNotFoundError when the Hub cannot be reached and
        # the file is not cached; the other calls raise the HTTP client's TransportError
        raise NetworkError(
            f"cannot reach {ep} ({type(e).__name__}): check the network connection, "
            "or set HF_HUB_OFFLINE=1 to use cached files only (a partial download resumes)"
        ) from e
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(hub_cache_dir(), 0, _free_bytes_safe(hub_cache_dir())) from e
        raise


def _status(e: Exception) -> int | None:
    response = getattr(e, "response", None)
    return getattr(response, "status_code", None)


def _auth_error(repo: str | None, e: Exception) -> DownloadError:
    ep = hub_endpoint()
    how = (
        "the token in HF_TOKEN (or the saved token) was refused; check it can read the repo"
        if _token()
        else f"set a token: export HF_TOKEN=hf_... (create one at {ep}/settings/tokens)"
    )
    return DownloadError(
        f"{repo} is gated or private (HTTP {_status(e)}): accept its terms at {ep}/{repo} "
        f"while logged in, then {how}"
    )


def _missing_file_error(
    repo: str | None, pattern: str, revision: str, available: list[str] | None
) -> DownloadError:
    if available is None:
        try:
            available = _list_files(repo or "", revision)
        except Exception:  # the listing is only a hint
            available = None
    if available is None:
        hint = "its file list could not be read"
    else:
        ggufs = [f for f in available if f.endswith(".gguf")]
        hint = f"its .gguf files: {', '.join(ggufs)}" if ggufs else "it has no .gguf file"
    return DownloadError(
        f"{repo} has no file matching {pattern!r} at {revision} (HTTP 404); {hint}; "
        "fix `file:` in the registry"
    )


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


def _offline_error(entry: ModelEntry) -> NetworkError:
    return NetworkError(
        f"{entry.name} is not in the cache ({hub_cache_dir()}) and HF_HUB_OFFLINE is set: "
        f"unset HF_HUB_OFFLINE and run `specgen download {entry.name}`"
    )


def _disk_full(folder: Path, need: int, free: int) -> DownloadError:
    return DownloadError(
        f"not enough disk space in {folder}: {need / 1e9:.2f} GB needed, "
        f"{free / 1e9:.2f} GB free; free some space or set HF_HOME to a larger disk "
        "(a partial download is kept and resumes)"
    )


def _free_bytes_safe(folder: Path) -> int:
    try:
        return _free_bytes(folder)
    except OSError:
        return 0
