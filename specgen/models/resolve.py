"""The one resolver: a file path, a registry name, a pair or the embedded demo -> files on disk.

Never uses the network: a registry model must have been downloaded (``specgen download``);
an embedded demo model is built locally, once.
"""

from __future__ import annotations

from pathlib import Path

from specgen.errors import ConfigError, ModelFileError
from specgen.flags import DRAFT_AUTO, DRAFT_NGRAM, DRAFT_NONE
from specgen.models.demo import DEMO_MODELS, cache_dir, ensure_demo_model, ensure_demo_pair
from specgen.models.registry import ModelEntry, Registry, load_registry

# models/hub.py and models/files.py are imported inside the functions that look up a download:
# they read GGUF headers with numpy, which `specgen --help` and `specgen run -m FILE` need not load.

__all__ = [
    "DRAFT_AUTO",
    "DRAFT_NGRAM",
    "DRAFT_NONE",
    "resolve_model",
    "resolve_models",
    "resolve_pair",
]


def resolve_model(reg: Registry, name_or_path: str) -> Path:
    """A loadable GGUF path for a file path or a registry name; never uses the network.

    An existing path is returned as is; a downloaded registry model gives its cached
    path (the first shard of a split set); an embedded model is built by
    ``specgen.models.demo.ensure_demo_model``.

    Raises:
        ConfigError: a known model that is not downloaded yet (the message has the
            exact ``specgen download`` command).
        ModelFileError: a directory, neither an existing file nor a registry name, or a downloaded
            model that failed its SHA-256 check (the message says how to recover).
    """
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a GGUF file{_holds(path)}")
    entry = reg.models.get(name_or_path)
    if entry is None:
        raise ModelFileError(
            f"{name_or_path}: no such file or registry name (see `specgen models`)"
        )
    if entry.embedded:
        return ensure_demo_model(entry.name)
    from specgen.models.files import checksum_failure
    from specgen.models.hub import find_cached

    files = find_cached(entry)
    if files is None:
        raise ConfigError(
            f"model {entry.name!r} is not downloaded yet: run `specgen download {entry.name}`"
        )
    failure = checksum_failure(entry, files)
    if failure is not None:
        raise ModelFileError(failure)
    return files[0]


#: GGUF names a directory's error lists before "… and N more"
_LISTED = 3


def _holds(folder: Path) -> str:
    """What a directory given as a model holds, for its error: a few GGUF names, and how
    many more when cut ("a.gguf, b.gguf, c.gguf, … and 4 more")."""
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if not ggufs:
        return ""
    shown = ", ".join(ggufs[:_LISTED])
    if len(ggufs) > _LISTED:
        shown += f", … and {len(ggufs) - _LISTED} more"
    return f" (it holds {shown}: give one of them)"


def resolve_pair(reg: Registry, name: str) -> tuple[Path, Path, int]:
    """(target path, draft path, draft_max) for a pair; errors as in resolve_model."""
    p = reg.pair(name)
    missing = [
        m
        for m in (p.target, p.draft)
        if not reg.models[m].embedded and _find_cached(reg.models[m]) is None
    ]
    if missing:
        raise ConfigError(
            f"pair {name!r} is not downloaded yet ({', '.join(missing)}): "
            f"run `specgen download {name}`"
        )
    return resolve_model(reg, p.target), resolve_model(reg, p.draft), p.draft_max


def _find_cached(entry: ModelEntry) -> list[Path] | None:
    from specgen.models.hub import find_cached

    return find_cached(entry)


def resolve_models(
    target: str | None, draft: str | None, pair: str | None, models: Path | None, status=None
) -> tuple[Path | str, Path | str, int | None]:
    """Turn --target/--draft/--pair into paths (or `none`/`ngram`) and a suggested K.

    With nothing given, the embedded demo pair (prepared once, offline).

    Raises:
        ConfigError: unknown or not-downloaded names, --pair mixed with --target, or a
            --models file that cannot be read (whether or not a name needs it).
    """
    if pair is not None:
        if target is not None:
            raise ConfigError("--pair cannot be combined with --target")
        t, d, k = resolve_pair(load_registry(models), pair)
        return t, (draft if draft in (DRAFT_NONE, DRAFT_NGRAM) else d), k
    if target is None:
        if models is not None:  # read where no name needs it too: a bad file is never ignored
            load_registry(models)
        t, d = ensure_demo_pair(status=status)  # prepared once, then cached
        if draft is None:
            return t, d, None
        return t, _resolve_one(draft, models), None
    if draft is None:
        _resolve_one(target, models)  # a missing or unknown target is said first
        raise ConfigError(
            "--target needs --draft too (a model, 'ngram' or 'none')" + _auto_hint(target, models)
        )
    target_path = _resolve_one(target, models)
    if draft == DRAFT_AUTO and isinstance(target_path, Path):
        return target_path, auto_draft(target_path), None
    return target_path, _resolve_one(draft, models), None


def auto_draft(target: Path) -> Path:
    """``--draft auto``: the smallest GGUF on disk that shares the target's tokenizer and is
    at most half its size (``specgen.models.local.draft_for``).

    Raises:
        ConfigError: none found (the message names where it looked).
    """
    from specgen.models.local import draft_for, search_roots

    best, _ = draft_for(target)
    if best is None:
        where = ", ".join(sorted({tool for tool, _ in search_roots()}))
        raise ConfigError(
            f"-md auto: no GGUF on disk ({where}) shares the tokenizer of {target.name} and"
            " is at most half its size; give -md FILE (see `specgen models --local`)"
        )
    return best.path


def _auto_hint(target: str, models: Path | None) -> str:
    """For the missing --draft error: the local draft `-md auto` would use, if any."""
    try:
        t = _resolve_one(target, models)
        if not isinstance(t, Path):
            return ""
        from specgen.models.local import draft_for

        best, _ = draft_for(t)
    except (ConfigError, ModelFileError, OSError):
        return ""  # the target's own error comes once a draft is given
    if best is None:
        return ""
    from specgen.models.local import size_text

    return (
        f"; on disk, {best.name} ({best.source}, {size_text(best.size_bytes)}) shares its"
        f" tokenizer and is smaller: -md auto uses it ({best.path})"
    )


def _resolve_one(name: str, models: Path | None) -> Path | str:
    if name in (DRAFT_NONE, DRAFT_NGRAM):
        return name
    return resolve_model(load_registry(models), name)


def checksum_failure(m: ModelEntry, paths: list[Path]) -> str | None:
    """Why the downloaded ``paths`` of ``m`` are refused (failed SHA-256 check), or None."""
    from specgen.models.files import checksum_failure as failure

    return None if m.embedded else failure(m, paths)


def local_paths(m: ModelEntry) -> list[Path] | None:
    """The files of ``m`` already on disk (built demo file or cached download), else None."""
    if m.embedded:
        path = cache_dir() / DEMO_MODELS.get(m.name, "")
        return [path] if path.is_file() else None
    from specgen.models.hub import find_cached

    return find_cached(m)
