"""Model downloads into the standard Hugging Face cache, through huggingface_hub only.

Environment read at call time (huggingface_hub reads some of it at import time only):
``HF_ENDPOINT``, ``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_TOKEN`` (else the token file under
HF_HOME), ``HF_HUB_OFFLINE``. Nothing here prints: pass a progress hook.

A transfer writes ``blobs/<etag>.incomplete`` in the cache (the name huggingface_hub uses)
and renames it to ``blobs/<etag>`` only when complete, so the final path never holds a
partial file; an interrupted transfer resumes from the partial file on the next run.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import inspect
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specgen.errors import ConfigError, DownloadError, ModelFileError

if TYPE_CHECKING:
    from specgen.models.registry import ModelEntry

#: progress hook: (file name in the repository, bytes done, total bytes or None)
ProgressHook = Callable[[str, int, "int | None"], None]

DEFAULT_ENDPOINT = "https://huggingface.co"
GGUF_MAGIC = b"GGUF"
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_GLOB_CHARS = frozenset("*?[")


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


# --- environment, read at call time --------------------------------------------------------


def hub_endpoint() -> str:
    """``$HF_ENDPOINT`` without a trailing slash, else the public Hub."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hf_home() -> Path:
    """``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``."""
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface"


def hub_cache_dir() -> Path:
    """The Hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub`` (the standard layout)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(explicit).expanduser() if explicit else hf_home() / "hub"


def is_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to 1/true/yes/on."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _token() -> str | bool:
    token = os.environ.get("HF_TOKEN")
    if token:
        return token
    path = Path(os.environ.get("HF_TOKEN_PATH") or hf_home() / "token")
    try:
        return path.read_text().strip() or False
    except OSError:
        return False


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


def _storage(repo: str) -> Path:
    return hub_cache_dir() / ("models--" + repo.replace("/", "--"))


def _snapshots(storage: Path, revision: str) -> list[Path]:
    """Snapshot folders to look in: the pinned commit, else the ref, then any others."""
    if _COMMIT.match(revision):
        return [storage / "snapshots" / revision]
    found = []
    try:
        found.append(storage / "snapshots" / (storage / "refs" / revision).read_text().strip())
    except OSError:
        pass
    others = (
        sorted((storage / "snapshots").glob("*"), key=lambda p: -p.stat().st_mtime)
        if (storage / "snapshots").is_dir()
        else []
    )
    return found + [p for p in others if p not in found]


def find_cached(entry: ModelEntry, revision: str | None = None) -> list[Path] | None:
    """Cached paths of a registry model (first shard first), or None if not all are cached.

    Never uses the network. Complete files only: partial downloads live under other names.
    """
    if entry.repo is None or entry.file is None:
        return None
    storage = _storage(entry.repo)
    for snap in _snapshots(storage, revision or entry.revision or "main"):
        if not snap.is_dir():
            continue
        available = [p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()]
        try:
            names = select_files(entry.file, available)
        except ModelFileError:
            continue
        if names:
            return [snap / n for n in names]
    return None


def verify_files(entry: ModelEntry, paths: list[Path], sizes: list[int | None]) -> None:
    """Check GGUF magic and sizes (bytes) of every file, and the registry SHA-256 if given.

    Deletes nothing.

    Raises:
        ModelFileError: a file is not GGUF, has the wrong size or the wrong SHA-256.
    """
    for path, size in zip(paths, sizes, strict=True):
        with open(path, "rb") as f:
            magic = f.read(4)
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
        if digest != entry.sha256:
            raise ModelFileError(
                f"SHA-256 mismatch for {entry.name}: expected {entry.sha256}, got {digest}; "
                f"the file is kept at {paths[0]}. If the repository changed, pin `revision:` "
                f"or update `sha256:` in {entry.source}; otherwise re-download it with "
                f"`specgen download {entry.name} --force`"
            )


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
        DownloadError: network, authentication or missing-file problems.
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
            meta = _metadata(repo, name, rev)
            blob = _storage(repo) / "blobs" / meta.etag
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


def list_gguf_files(repo: str, revision: str = "main") -> list[str]:
    """The ``.gguf`` files of a Hub repository (network)."""
    return [f for f in _list_files(repo, revision) if f.endswith(".gguf")]


def _check_downloadable(entry: ModelEntry) -> str:
    """The entry's Hub repository; ConfigError for an embedded model."""
    if entry.embedded or entry.repo is None or entry.file is None:
        raise ConfigError(f"{entry.name} is an embedded model: nothing to download")
    return entry.repo


def _list_files(repo: str, revision: str) -> list[str]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_endpoint(), token=_token(), library_name="specgen")
    return list(api.list_repo_files(repo, revision=revision))


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


def _metadata(repo: str, filename: str, revision: str):  # -> HfFileMetadata
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo, filename, revision=revision, endpoint=hub_endpoint())
    meta = get_hf_file_metadata(
        url, token=_token(), library_name="specgen", endpoint=hub_endpoint()
    )
    if not meta.etag or not meta.commit_hash:
        raise DownloadError(
            f"{hub_endpoint()} did not answer like a Hugging Face Hub for {repo}/{filename} "
            "(no ETag or X-Repo-Commit): check HF_ENDPOINT and any proxy"
        )
    return meta


def _fetch(
    repo: str, filename: str, revision: str, force: bool, progress: ProgressHook | None
) -> tuple[Path, int | None, int]:
    """Fetch one file into the cache: (snapshot path, size in bytes, bytes transferred)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import WeakFileLock

    meta = _metadata(repo, filename, revision)
    storage = _storage(repo)
    blob = storage / "blobs" / meta.etag
    partial = blob.with_name(blob.name + ".incomplete")
    pointer = storage / "snapshots" / meta.commit_hash / filename
    if force:
        for p in (pointer, blob, partial):
            p.unlink(missing_ok=True)
    moved = 0
    if not blob.is_file():
        blob.parent.mkdir(parents=True, exist_ok=True)
        lock = hub_cache_dir() / ".locks" / storage.name / f"{meta.etag}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(lock):
            if not blob.is_file():
                moved = _transfer(meta, filename, partial, progress)
                os.replace(partial, blob)
    elif progress is not None:
        progress(filename, blob.stat().st_size, meta.size)
    path = hf_hub_download(
        repo,
        filename,
        revision=revision,
        cache_dir=hub_cache_dir(),
        endpoint=hub_endpoint(),
        token=_token(),
        library_name="specgen",
    )
    return Path(path), meta.size, moved


def _transfer(meta, filename: str, partial: Path, progress: ProgressHook | None) -> int:
    """Append the missing bytes of ``meta.location`` to ``partial``; returns bytes moved."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    start = partial.stat().st_size if partial.exists() else 0
    if meta.size is not None and start > meta.size:
        partial.unlink()
        start = 0
    need = (meta.size or 0) - start
    free = _free_bytes(partial.parent)
    if need > free:
        raise _disk_full(partial.parent, need, free)
    headers = build_hf_headers(token=_token(), library_name="specgen")
    headers["Accept-Encoding"] = "identity"
    if meta.location.split("/")[2] != hub_endpoint().split("/")[2]:
        headers.pop("authorization", None)  # a signed CDN URL: do not leak the token
    kwargs = {"displayed_filename": filename, "expected_size": meta.size}
    if progress is not None and "tqdm_class" in inspect.signature(http_get).parameters:
        kwargs["tqdm_class"] = _bar_class(progress, filename)
    try:
        with open(partial, "ab") as f:
            http_get(meta.location, f, resume_size=start, headers=headers, **kwargs)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(partial.parent, need, _free_bytes(partial.parent)) from e
        if "Consistency check failed" in str(e):
            raise DownloadError(
                f"the transfer of {filename} stopped early; run the same command again to resume"
            ) from e
        raise
    return partial.stat().st_size - start


def _free_bytes(folder: Path) -> int:
    """Free bytes on the disk holding ``folder``."""
    return shutil.disk_usage(folder).free


def _bar_class(progress: ProgressHook, filename: str) -> type:
    """A tqdm-shaped class that forwards byte counts to ``progress``."""

    class _Bar:
        def __init__(
            self, *args: object, total: int | None = None, initial: int = 0, **kwargs: object
        ) -> None:
            self.n, self.total = initial, total
            progress(filename, self.n, total)

        def update(self, n: int = 1) -> None:
            self.n += n
            progress(filename, self.n, self.total)

        def update_transfer(self, n: int) -> None:
            pass

        def close(self) -> None:
            pass

        def __enter__(self) -> _Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            self.close()

    return _Bar


# --- errors --------------------------------------------------------------------------------


@contextmanager
def _hub_errors(entry: ModelEntry, revision: str) -> Iterator[None]:
    """Turn huggingface_hub and network exceptions into one-line DownloadErrors."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
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
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(hub_cache_dir(), 0, _free_bytes_safe(hub_cache_dir())) from e
        if isinstance(e, LocalEntryNotFoundError):  # the Hub went away mid-download
            raise DownloadError(
                f"cannot reach {ep}: check the network connection and run the command again"
            ) from e
        raise
    except Exception as e:
        if _is_network_error(e):
            raise DownloadError(
                f"cannot reach {ep} ({type(e).__name__}): check the network connection, "
                "or set HF_HUB_OFFLINE=1 to use cached files only (a partial download resumes)"
            ) from e
        raise


def _is_network_error(e: BaseException) -> bool:
    names = {c.__name__ for c in type(e).__mro__}
    return bool(
        names
        & {
            "TransportError",
            "NetworkError",
            "TimeoutException",
            "ConnectionError",
            "ConnectError",
            "RemoteProtocolError",
        }
    )


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


def _offline_error(entry: ModelEntry) -> DownloadError:
    return DownloadError(
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
