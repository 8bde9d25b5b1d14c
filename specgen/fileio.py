"""Atomic file writes: a destination is either as it was or complete, never partial; and
`check_model_path`, the refusal of a model path that names no regular file.

The rule (write a temporary file in the same directory, then ``os.replace`` it onto the
destination, which POSIX and Windows make atomic on one file system) is written once here
for model files (models/gguf.py, models/demo.py), bench results (bench/report.py) and
specgen's own records. And `read_chat_template`, the one reading of a --chat-template file
(the CLI reads it before the models load, `specgen.chat.load_template` when it applies it).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from specgen.errors import ChatTemplateError, ConfigError, ModelFileError


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


def check_model_path(path: Path) -> None:
    """Refuse a model path that is not a regular file, before llama.cpp sees it (its NULL
    says less): the first check of `specgen.models.header.check_gguf_file` and of
    `specgen.llamacpp.LlamaEngine`.

    Raises:
        ModelFileError: missing, a directory, or not a regular file.
    """
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a GGUF file")
    if not path.is_file():
        raise ModelFileError(f"not a file: {path}")


def read_chat_template(path: Path) -> str:
    """The text of a --chat-template file (a Jinja2 chat template).

    Raises:
        ConfigError: the file cannot be read or is not UTF-8, naming --chat-template.
        ChatTemplateError: the file is empty.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--chat-template: cannot read {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"--chat-template: {path} is not UTF-8 text") from e
    if not text.strip():
        raise ChatTemplateError(f"chat template {path}: the file is empty")
    return text
