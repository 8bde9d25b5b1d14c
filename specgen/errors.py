"""The exception hierarchy. Each class says what the user should do.

Library code raises these; only ``specgen.cli.app`` turns them into a one-line message and an
exit code (set ``SPECGEN_DEBUG=1`` to see the traceback instead).
"""

from __future__ import annotations

from pathlib import Path


class SpecgenError(Exception):
    """Base class: a problem the user can fix; the message says how. Exit code 1."""

    exit_code = 1


class ModelFileError(SpecgenError):
    """A model file is missing, unreadable, not GGUF, or truncated: check the path or
    re-download it."""


class ModelLoadFailure(ModelFileError):
    """llama.cpp returned NULL for a model file: `reason` is llama.cpp's own last word."""

    def __init__(self, message: str, path: Path, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class ModelLoadError(SpecgenError):
    """llama.cpp refused to load a model or create its context: check memory, -c and -ngl."""


class VocabMismatchError(SpecgenError):
    """Draft and target tokenizers differ: pick a draft from the same model family."""


class PromptError(SpecgenError):
    """The prompt is empty or does not fit in the context: shorten it or raise -c."""


class ChatTemplateError(SpecgenError):
    """A chat template does not compile or fails to render: the message names the template's
    source; fix the file given to --chat-template, pass another, or use --raw."""


class EngineError(SpecgenError):
    """llama.cpp failed while decoding or could not roll back its cache (for example a
    recurrent model): report it with SPECGEN_DEBUG=1 output, or use --draft none."""


class BusyError(SpecgenError):
    """A `Pair` is generating already (an unfinished stream, or a call from another
    thread): finish or close that generation first. One Pair runs one generation at a
    time, as its models hold one context; for concurrent requests use `specgen serve` or
    ``Pair.scheduler()``, or load a Pair per thread."""


class ConfigError(SpecgenError):
    """A command-line value or registry entry is invalid: the message names the flag,
    file or key."""


class GrammarError(ConfigError):
    """A grammar or JSON Schema (--grammar, --json-schema, a request's response_format,
    json_schema, grammar or tool parameters) does not compile or uses what is not
    supported: the message names where it came from and the problem."""


class DownloadError(SpecgenError):
    """A model download failed (no network, gated repository, missing file, full disk): the
    message says what to fix; run the same `specgen download` again to resume."""


class NetworkError(DownloadError):
    """The Hub cannot be reached (no network, or ``HF_HUB_OFFLINE`` is set) and the files are
    not cached: connect, or unset HF_HUB_OFFLINE, and run the same command again."""


class RpcError(SpecgenError):
    """An RPC server (``--rpc``) cannot be used: unreachable, refused, incompatible, or this
    llama-cpp-python was built without RPC support. The message names the endpoint or gives
    the rebuild command."""
