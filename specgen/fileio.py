"""Atomic file writes: a destination is either as it was or complete, never partial.

The rule (write a temporary file in the same directory, then ``os.replace`` it onto the
destination, which POSIX and Windows make atomic on one file system) is written once here
for model files (models/gguf.py, models/demo.py), bench results (bench/report.py) and
specgen's own records.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(dst: Path | str, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path next to ``dst``; rename it onto ``dst`` if the block succeeds.

    On any exception, Ctrl-C included, the temporary file is removed and ``dst`` is left as
    it was. The parent directory must exist (a missing one is the caller's error to report).

    Args:
        dst: the destination path.
        mode: permission bits of the result (``mkstemp`` creates 0600; model files and
            results are normally world-readable).
    """
    dst = Path(dst)
    fd, name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, mode)
        yield tmp
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write(dst: Path | str, data: bytes) -> None:
    """Write ``data`` to ``dst`` atomically (see :func:`atomic_path`)."""
    with atomic_path(dst) as tmp:
        tmp.write_bytes(data)
