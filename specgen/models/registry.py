"""The model registry: models.yaml files validated once into frozen dataclasses.

Files are merged in this order, later names replacing earlier ones whole:
the packaged ``models.yaml`` (at the repository's top level; the package reads it through
the link ``specgen/models/models.yaml``) < the user file (``$SPECGEN_HOME/models.yaml``, else
``~/.config/specgen/models.yaml``) < ``--models FILE``.

PyYAML is imported when a file is parsed, not with this module: the CLI imports the registry
at start-up (``test_registry_modules_import_nothing_heavy``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from specgen.errors import ConfigError

PACKAGED_FILE = Path(__file__).with_name("models.yaml")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TOP_KEYS = frozenset({"models", "pairs"})
_MODEL_KEYS = frozenset(
    {
        "repo",
        "file",
        "revision",
        "sha256",
        "quant",
        "size_gb",
        "license",
        "note",
        "embedded",
        "verified",
    }
)
_PAIR_KEYS = frozenset({"target", "draft", "draft_max", "note", "chat"})


@dataclass(frozen=True)
class ModelEntry:
    """One GGUF model: a Hub repository and file (or glob), or an embedded demo model."""

    name: str
    source: Path
    repo: str | None = None
    file: str | None = None
    revision: str | None = None
    sha256: str | None = None
    quant: str = ""
    size_gb: float | None = None
    license: str = ""
    note: str = ""
    embedded: bool = False
    verified: bool = False


@dataclass(frozen=True)
class PairEntry:
    """A target/draft pair by model name, with its recommended block size K; `chat` marks
    instruct models (a chat template in the target: `specgen chat` works with them)."""

    name: str
    source: Path
    target: str
    draft: str
    draft_max: int = 8
    note: str = ""
    chat: bool = False


@dataclass(frozen=True)
class Registry:
    """The merged registry. ``models`` and ``pairs`` are read-only mappings by name."""

    models: Mapping[str, ModelEntry]
    pairs: Mapping[str, PairEntry]
    sources: tuple[Path, ...] = field(default=())

    def model(self, name: str) -> ModelEntry:
        """The model called ``name``. Raises ConfigError naming the known models."""
        if name not in self.models:
            raise ConfigError(f"no model named {name!r}; known: {_names(self.models)}")
        return self.models[name]

    def pair(self, name: str) -> PairEntry:
        """The pair called ``name``. Raises ConfigError naming the known pairs."""
        if name not in self.pairs:
            raise ConfigError(f"no pair named {name!r}; known: {_names(self.pairs)}")
        return self.pairs[name]

    def models_for(self, name: str) -> list[ModelEntry]:
        """The models a ``specgen download NAME`` fetches: a pair's two, or one model.

        Raises:
            ConfigError: ``name`` is neither a pair nor a model.
        """
        if name in self.pairs:
            p = self.pairs[name]
            return [self.models[p.target], self.models[p.draft]]
        if name in self.models:
            return [self.models[name]]
        raise ConfigError(
            f"{name!r} is neither a pair nor a model in the registry; "
            f"pairs: {_names(self.pairs)}; see `specgen models`"
        )


def _names(m: Mapping[str, object]) -> str:
    return ", ".join(sorted(m)) or "(none)"


def user_registry_file() -> Path:
    """``$SPECGEN_HOME/models.yaml`` if set, else ``~/.config/specgen/models.yaml``."""
    home = os.environ.get("SPECGEN_HOME")
    if home:
        return Path(home).expanduser() / "models.yaml"
    return Path.home() / ".config" / "specgen" / "models.yaml"


def load_registry(extra: Path | None = None) -> Registry:
    """Load and validate packaged < user < ``extra`` registry files.

    The user file is optional; ``extra`` (from ``--models FILE``) must exist.

    Raises:
        ConfigError: a YAML error, an unknown key, a missing or mistyped field, or a pair
            naming an unknown model; the message names the file and the key.
    """
    files = [PACKAGED_FILE]
    user = user_registry_file()
    if user.is_file():
        files.append(user)
    if extra is not None:
        extra = Path(extra).expanduser()
        if not extra.is_file():
            what = "a folder, not a models.yaml file" if extra.is_dir() else "no such file"
            raise ConfigError(f"--models {extra}: {what}")
        files.append(extra)
    models: dict[str, ModelEntry] = {}
    pairs: dict[str, PairEntry] = {}
    for f in files:
        m, p = parse_file(f)
        models.update(m)
        pairs.update(p)
    for pair in pairs.values():
        for role in ("target", "draft"):
            ref = getattr(pair, role)
            if ref not in models:
                raise ConfigError(
                    f"{pair.source}: pairs.{pair.name}.{role}: unknown model {ref!r}; "
                    f"known: {_names(models)}"
                )
    for name in sorted(set(models) & set(pairs)):
        raise ConfigError(
            f"{pairs[name].source}: pairs.{name}: the name is also a model "
            f"(in {models[name].source}); rename one of them"
        )
    return Registry(MappingProxyType(models), MappingProxyType(pairs), tuple(files))


def parse_file(path: Path) -> tuple[dict[str, ModelEntry], dict[str, PairEntry]]:
    """Parse and validate one registry file (pair references are checked after merging).

    Raises:
        ConfigError: as in :func:`load_registry`.
    """
    import yaml

    class _Loader(yaml.SafeLoader):
        """SafeLoader refusing a key given twice in one mapping: PyYAML keeps the last, so
        an entry pasted twice and edited once would silently lose the edit."""

    def _unique(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *anchor": keys it may override
                continue
            key = loader.construct_object(key_node)
            try:
                hash(key)
            except TypeError:  # construct_mapping names an unhashable key itself
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return loader.construct_mapping(node)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where}: invalid YAML: {getattr(e, 'problem', e)}") from e
    if data is None:
        return {}, {}
    top = _mapping(data, path, "(top level)")
    _check_keys(top, _TOP_KEYS, path, "(top level)")
    models = {
        name: _model(name, _mapping(body, path, f"models.{name}"), path)
        for name, body in _mapping(top.get("models") or {}, path, "models").items()
        if _check_name(name, path, "models")
    }
    pairs = {
        name: _pair(name, _mapping(body, path, f"pairs.{name}"), path)
        for name, body in _mapping(top.get("pairs") or {}, path, "pairs").items()
        if _check_name(name, path, "pairs")
    }
    return models, pairs


def check_revision(rev: str | None, where: str) -> str | None:
    """A branch, tag or commit: a git ref name never has ``..``, a leading ``/`` or a control
    character (git-check-ref-format), and huggingface_hub writes ``refs/<revision>`` in the
    cache (a revision of ``../../x`` wrote x)."""
    bad = rev is not None and (
        ".." in rev or rev.startswith("/") or any(ord(c) < 32 or c == "\x7f" for c in rev)
    )
    if bad:
        raise ConfigError(f"{where}: {rev!r} is not a branch, tag or commit")
    return rev


def _model(name: str, body: dict[str, Any], path: Path) -> ModelEntry:
    key = f"models.{name}"
    _check_keys(body, _MODEL_KEYS, path, key)
    embedded = _get(body, "embedded", bool, path, key, False)
    repo = _get(body, "repo", str, path, key, None)
    file = _get(body, "file", str, path, key, None)
    if embedded and (repo or file):
        raise ConfigError(f"{path}: {key}: an embedded model has no repo or file")
    if not embedded:
        for k, v in (("repo", repo), ("file", file)):
            if not v:
                raise ConfigError(f"{path}: {key}.{k}: missing field")
        if repo.count("/") != 1 or repo.startswith("/") or repo.endswith("/"):
            raise ConfigError(f"{path}: {key}.repo: {repo!r} is not of the form owner/name")
    sha = _get(body, "sha256", str, path, key, None)
    if sha is not None:
        sha = sha.lower()
        if not _SHA256.match(sha):
            raise ConfigError(f"{path}: {key}.sha256: not 64 hexadecimal digits")
    size = _get(body, "size_gb", (int, float), path, key, None)
    if size is not None and (isinstance(size, bool) or not 0 < size < math.inf):  # NaN too
        raise ConfigError(f"{path}: {key}.size_gb: must be a positive number")
    return ModelEntry(
        name=name,
        source=path,
        repo=repo,
        file=file,
        revision=check_revision(
            _get(body, "revision", str, path, key, None), f"{path}: {key}.revision"
        ),
        sha256=sha,
        quant=_get(body, "quant", str, path, key, ""),
        size_gb=float(size) if size is not None else None,
        license=_get(body, "license", str, path, key, ""),
        note=_get(body, "note", str, path, key, ""),
        embedded=embedded,
        verified=_get(body, "verified", bool, path, key, False),
    )


def _pair(name: str, body: dict[str, Any], path: Path) -> PairEntry:
    key = f"pairs.{name}"
    _check_keys(body, _PAIR_KEYS, path, key)
    for k in ("target", "draft"):
        if k not in body:
            raise ConfigError(f"{path}: {key}.{k}: missing field")
    k_max = _get(body, "draft_max", int, path, key, 8)
    if isinstance(k_max, bool) or not 1 <= k_max <= 64:
        raise ConfigError(f"{path}: {key}.draft_max: must be an integer from 1 to 64")
    return PairEntry(
        name=name,
        source=path,
        target=_get(body, "target", str, path, key, ""),
        draft=_get(body, "draft", str, path, key, ""),
        draft_max=k_max,
        note=_get(body, "note", str, path, key, ""),
        chat=_get(body, "chat", bool, path, key, False),
    )


def _mapping(value: object, path: Path, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping, got {type(value).__name__}")
    return value


def _check_name(name: object, path: Path, section: str) -> bool:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            f"{path}: {section}.{name}: invalid name (letters, digits, '.', '_', '-'; no '/')"
        )
    return True


def _check_keys(body: dict[str, Any], allowed: frozenset[str], path: Path, key: str) -> None:
    for k in body:
        if k not in allowed:
            raise ConfigError(
                f"{path}: {key}.{k}: unknown key (allowed: {', '.join(sorted(allowed))})"
            )


def _get(body: dict[str, Any], k: str, kind: Any, path: Path, key: str, default: Any) -> Any:
    if k not in body or body[k] is None:
        return default
    value = body[k]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        want = kind.__name__ if isinstance(kind, type) else "number"
        raise ConfigError(f"{path}: {key}.{k}: expected {want}, got {type(value).__name__}")
    return value
