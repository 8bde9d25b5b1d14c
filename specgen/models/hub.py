"""The one door to huggingface_hub: its settings, the cache lookup, the Hub's requests (file
lists, metadata, fetching a file into the standard Hugging Face cache) and its errors as
one-line messages, through huggingface_hub's public API.

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
it costs about 150 ms, and registry lookups import this module for the cache paths alone
(``test_registry_modules_import_nothing_heavy``). What a download does with these calls is
``specgen.models.download``; the files' checks are ``specgen.models.files``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.errors import DownloadError, ModelFileError, NetworkError
from specgen.models.files import SPLIT_NAME, select_files, split_names

if TYPE_CHECKING:
    from specgen.models.registry import ModelEntry

#: progress hook: (file name in the repository, bytes done, total bytes or None)
ProgressHook = Callable[[str, int, "int | None"], None]

LIBRARY = "specgen"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# a git blob's SHA-1 or an LFS file's SHA-256: the only ETags a blob's file name is made of
_DIGEST = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_GLOB_CHARS = frozenset("*?[")
#: a transfer that stops without receiving a byte is retried this many times in one run
_STALLED_RETRIES = 3


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


# --- the cache (no network) -----------------------------------------------------------------


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


# --- the network ---------------------------------------------------------------------------


def _client() -> dict[str, Any]:
    """The keyword arguments every huggingface_hub call gets."""
    return {"token": _token(), "library_name": LIBRARY}


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


def remote_names(entry: ModelEntry, revision: str) -> list[str]:
    """Exact names need no listing (split shards are named by rule); globs list the repo."""
    assert entry.file is not None and entry.repo is not None
    if not _GLOB_CHARS & set(entry.file):
        m = SPLIT_NAME.match(entry.file)
        return split_names(m["stem"], int(m["n"])) if m else [entry.file]
    available = _list_files(entry.repo, revision)
    names = select_files(entry.file, available)
    if not names:
        raise _missing_file_error(entry.repo, entry.file, revision, available)
    return names


def fetch(
    repo: str, filename: str, revision: str, force: bool, progress: ProgressHook | None
) -> tuple[Path, int | None, int]:
    """Fetch one file into the cache: (snapshot path, size in bytes, bytes transferred)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import WeakFileLock

    url, meta = metadata(repo, filename, revision)
    blob, lock = blob_and_lock(repo, meta.etag)
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
                _check_whole(partial, meta.size, filename)
                os.replace(partial, blob)
    elif progress is not None:
        progress(filename, blob.stat().st_size, meta.size)
    # the blob is complete: this links it into the snapshot and records the ref, no transfer
    path = hf_hub_download(repo, filename, revision=revision, **_client())
    return Path(path), meta.size, moved


def metadata(repo: str, filename: str, revision: str) -> tuple[str, Any]:
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
    if not _DIGEST.match(meta.etag) or not _COMMIT.match(meta.commit_hash):
        # both name places in the cache: an ETag of "../../x" overwrote x (2026-12-07)
        raise DownloadError(
            f"{hub_endpoint()} answered for {repo}/{filename} with an ETag or commit that is"
            f" not a hex digest ({meta.etag[:80]!r}, {meta.commit_hash[:80]!r}): refused;"
            " check HF_ENDPOINT and any proxy"
        )
    return url, meta


def blob_and_lock(repo: str, etag: str) -> tuple[Path, Path]:
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
                    elif done and not _range_from(response, done):
                        f.seek(0)  # not the bytes asked for: what is kept cannot be trusted
                        f.truncate()
                        raise DownloadError(
                            f"{_host(location)} answered the bytes of {filename} from {done} on"
                            f" with {response.headers.get('Content-Range')!r}; run the same"
                            " command again to start over"
                        )
                    for chunk in response.iter_bytes():
                        if size is not None and f.tell() + len(chunk) > size:
                            f.seek(0)  # more than announced: a disk filled, not a model
                            f.truncate()
                            raise DownloadError(
                                f"{_host(location)} sent more than the {size} bytes of"
                                f" {filename} it announced: refused"
                            )
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


def _check_whole(partial: Path, size: int | None, filename: str) -> None:
    """Refuse a transfer that is not the GGUF file announced, before it becomes the blob
    (which `hf_hub_download` then links into the snapshot, where it would be loaded); the
    bytes are dropped, so the next run fetches them again.

    Raises:
        ModelFileError: the size differs from the announced one, or no GGUF magic.
    """
    from specgen.models.header import GGUF_MAGIC, read_magic

    got = partial.stat().st_size
    magic = read_magic(partial)
    if (size is not None and got != size) or magic != GGUF_MAGIC:
        partial.unlink()
        wrong_size = size is not None and got != size
        what = f"{got} bytes, the Hub said {size}" if wrong_size else f"starts with {magic!r}"
        raise ModelFileError(
            f"{filename} is not a GGUF file of the size announced ({what}): not kept; check"
            " `file:` in the registry and HF_ENDPOINT"
        )


def _range_from(response: Any, done: int) -> bool:
    """Whether a 206 answer starts at byte `done` (its Content-Range, RFC 9110, 14.4)."""
    m = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return m is not None and int(m[1]) == done


def _host(url: str) -> str:
    return url.split("/")[2] if "://" in url else ""


def _free_bytes(folder: Path) -> int:
    """Free bytes on the disk holding ``folder``."""
    return shutil.disk_usage(folder).free


# --- errors --------------------------------------------------------------------------------


@contextmanager
def hub_errors(entry: ModelEntry, revision: str) -> Iterator[None]:
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


def offline_error(entry: ModelEntry) -> NetworkError:
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
