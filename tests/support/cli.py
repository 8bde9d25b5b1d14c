"""The `specgen` command in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SPECGEN = [sys.executable, "-m", "specgen"]


def specgen(*args: str, stdin: bytes | None = None, env: dict | None = None, **kw):
    """`python -m specgen ARGS` with `stdin`, output captured, `env` over the environment."""
    return subprocess.run(
        [*SPECGEN, *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=300,
        **kw,
    )


def run_json(*args: str, stdin: bytes | None = None) -> dict:
    """`specgen run --json ARGS`'s JSON (the command must succeed)."""
    r = specgen("run", "--json", *args, stdin=stdin)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)
