"""A small local server speaking the parts of the Hugging Face Hub protocol that
huggingface_hub's downloads use, for tests (127.0.0.1 only, started by the tests).

Endpoints:
- ``HEAD|GET /{owner}/{name}/resolve/{revision}/{path}``: file metadata headers
  (``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``, ``X-Linked-Size``); LFS-style files answer
  302 to ``/cdn/{sha256}`` on another host name (``localhost``) like the real Hub's CDN.
- ``HEAD|GET /cdn/{sha256}``: the bytes, with ``Range: bytes=N-`` answered 206.
- ``GET /api/models/{owner}/{name}/tree/{revision}``: the recursive file listing.
- ``GET /api/models/{owner}/{name}[/revision/{revision}]``: the model's info, its file
  names in ``siblings``.
Errors carry the Hub's ``X-Error-Code`` header (RepoNotFound, GatedRepo, EntryNotFound,
RevisionNotFound), which huggingface_hub turns into its typed exceptions.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    gated_token: str | None = None


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    auth: str | None


@dataclass
class HubServer:
    """Start with ``start()``; ``url`` is the value for HF_ENDPOINT."""

    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    cut: dict[str, int] = field(default_factory=dict)  # sha -> transfers to cut half-way
    slow: dict[str, float] = field(default_factory=dict)  # sha -> seconds per 4 KiB sent
    cdn_host: str = "localhost"
    ignore_range: bool = False  # answer 200 with every byte, as some proxies do
    linked_etag: str | None = None  # X-Linked-Etag in place of the file's SHA-256
    pad: int = 0  # bytes sent after each file's own (a body longer than announced)
    _blobs: dict[str, bytes] = field(default_factory=dict)
    _httpd: ThreadingHTTPServer | None = None

    def add_repo(
        self, repo_id: str, files: dict[str, bytes], gated_token: str | None = None
    ) -> Repo:
        commit = hashlib.sha1((repo_id + "".join(sorted(files))).encode()).hexdigest()
        repo = Repo(dict(files), commit, gated_token)
        self.repos[repo_id] = repo
        for data in files.values():
            self._blobs[hashlib.sha256(data).hexdigest()] = data
        return repo

    def cut_next(self, data: bytes, times: int = 1) -> None:
        """Make the next ``times`` transfers of ``data`` stop half-way (connection closed)."""
        self.cut[hashlib.sha256(data).hexdigest()] = times

    def slow_down(self, data: bytes, seconds_per_4k: float) -> None:
        """Send ``data`` 4 KiB at a time with a pause after each (a slow network)."""
        self.slow[hashlib.sha256(data).hexdigest()] = seconds_per_4k

    def file_gets(self) -> list[Request]:
        """GET requests that transferred file bytes."""
        return [r for r in self.requests if r.method == "GET" and "/api/" not in r.path]

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HubServer:
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?$")
_INFO = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$")
_CDN = re.compile(r"^/cdn/([0-9a-f]{64})$")


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append(
            Request(
                self.command, path, self.headers.get("Range"), self.headers.get("Authorization")
            )
        )
        if m := _CDN.match(path):
            return self._bytes(m[1], head)
        if m := _RESOLVE.match(path):
            return self._resolve(m[1], m[2], m[3])
        if (m := _TREE.match(path)) and not head:
            return self._tree(m[1], m[2])
        if (m := _INFO.match(path)) and not head:
            return self._info(m[1], m[2] or "main")
        self._error(404, "RepoNotFound", "not found")

    def _repo(self, repo_id: str, revision: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            code = 403 if self.headers.get("Authorization") else 401
            self._error(code, "GatedRepo", "Access to model is restricted")
            return None
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id")
            return None
        return repo

    def _resolve(self, repo_id: str, revision: str, filename: str) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        data = repo.files.get(filename)
        if data is None:
            self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": repo.commit})
            return
        sha = hashlib.sha256(data).hexdigest()
        self.send_response(302)
        self.send_header("Location", f"http://{self.hub.cdn_host}:{self.hub.port}/cdn/{sha}")
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("X-Linked-Etag", f'"{self.hub.linked_etag or sha}"')
        self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _bytes(self, sha: str, head: bool) -> None:
        data = self.hub._blobs.get(sha)
        if data is None:
            return self._error(404, "EntryNotFound", "no such blob")
        start = 0
        rng = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
        if rng and not self.hub.ignore_range:
            start = int(rng[1])
        body = data[start:] + b"\0" * self.hub.pad
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{sha}"')
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        if self.hub.cut.get(sha, 0) > 0:
            self.hub.cut[sha] -= 1
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        pause = self.hub.slow.get(sha)
        try:
            if pause is None:
                self.wfile.write(body)
                return
            for i in range(0, len(body), 4096):
                self.wfile.write(body[i : i + 4096])
                self.wfile.flush()
                time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            self.close_connection = True

    def _tree(self, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        listing = [
            {
                "type": "file",
                "oid": hashlib.sha1(d).hexdigest(),
                "size": len(d),
                "path": name,
                "lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 134},
            }
            for name, d in sorted(repo.files.items())
        ]
        self._json(200, listing)

    def _info(self, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        siblings = [{"rfilename": name} for name in sorted(repo.files)]
        self._json(200, {"id": repo_id, "sha": repo.commit, "siblings": siblings})

    def _json(self, code: int, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(
        self, code: int, error_code: str, message: str, extra: dict[str, str] | None = None
    ) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(code)
        self.send_header("X-Error-Code", error_code)
        self.send_header("X-Error-Message", message)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def tiny_gguf(
    path: Path, n_floats: int = 1024, seed: int = 0, extra: dict[str, int] | None = None
) -> bytes:
    """Write a small valid GGUF file (one F32 tensor of ``n_floats``) and return its bytes."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    for key, value in (extra or {}).items():
        writer.add_uint32(key, value)
    rng = np.random.default_rng(seed)
    writer.add_tensor("token_embd.weight", rng.standard_normal(n_floats).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def isolate_env(monkeypatch, tmp_path: Path) -> None:
    """Point every cache, config and Hub variable into ``tmp_path``; no real network."""
    for var in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "XDG_CACHE_HOME",
        "SPECGEN_MODELS",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "specgen"))
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "specgen-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    hub_env(
        monkeypatch,
        HF_HOME=str(tmp_path / "hf"),
        HF_ENDPOINT="http://127.0.0.1:9",  # a closed port unless a test sets it
        HF_HUB_DISABLE_TELEMETRY="1",
    )


def hub_env(monkeypatch, **env: str | None) -> None:
    """Set (None: unset) Hub variables, then make huggingface_hub read its settings again.

    huggingface_hub reads its environment once, when ``huggingface_hub.constants`` is
    imported; a new process would see these values, so this re-runs that module and
    monkeypatches every setting it changed (undone at the end of the test).
    """
    import importlib

    from huggingface_hub import constants

    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    before = dict(vars(constants))
    importlib.reload(constants)
    after = dict(vars(constants))
    for name, value in after.items():
        if name.startswith("__") or (name in before and before[name] is value):
            continue
        if name in before:
            setattr(constants, name, before[name])  # so that monkeypatch restores it
        monkeypatch.setattr(constants, name, value, raising=False)
