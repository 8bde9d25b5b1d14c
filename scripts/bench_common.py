"""What the in-process benchmark scripts (choices, grammar, logprobs, penalty) share: the
record's provenance, the progress line of one run, medians over the alternated runs, and
the result written once (the summary on stdout, the summary and every run in --json), and
the options, environment and check of a script that runs two builds side by side
(`ab_parser`, `AB_ENV`, `check_builds`).
scripts/ is on sys.path when a script runs, so each imports this as `bench_common`."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from specgen.bench.record import cpu_model


def provenance() -> dict[str, str]:
    """{"date" (UTC, YYYY-MM-DD), "commit" (git's short hash, empty outside a checkout),
    "machine" (the CPU model)}: the first keys of every result."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit,
            "machine": cpu_model()}  # fmt: skip


def progress(rep: int, prompt_id: str, mode: str, run: dict[str, Any]) -> None:
    """One run's line on stderr: tokens/s and acceptance."""
    print(
        f"  rep {rep} {prompt_id:18s} {mode:9s} {run['tokens_per_s']:6.1f} tok/s"
        f" acceptance {run['acceptance_rate']:.2f}",
        file=sys.stderr,
        flush=True,
    )


def medians(runs: dict[str, list[dict[str, Any]]], key: str) -> dict[str, float]:
    """{mode: the median of `key` over that mode's runs}."""
    return {m: statistics.median(r[key] for r in rs) for m, rs in runs.items()}


def emit(out: dict[str, Any], path: Path | None, runs: Any = None) -> None:
    """Print `out` as JSON; write it to `path` (when given) with `runs` as its last key
    (when given): the summary to read, the record to recompute from."""
    print(json.dumps(out, indent=1))
    if path is not None:
        full = out if runs is None else {**out, "runs": runs}
        path.write_text(json.dumps(full, indent=1) + "\n")


AB_ENV = {**os.environ, "PYTHONSAFEPATH": "1"}
"""The environment of each build's command: ``python -m`` puts the working directory first
on sys.path, before PYTHONPATH, so run from the repository ``PYTHONPATH=OLD python -m
specgen`` would run the checkout's specgen, not OLD's; PYTHONSAFEPATH (Python 3.11) leaves
it out."""


def check_builds(a: str, b: str) -> None:
    """Exit with a message unless the commands `a` and `b` import specgen from two places
    (each one's ``--version`` says where from, under `AB_ENV`)."""
    where = []
    for cmd in (a, b):
        done = subprocess.run(
            [*shlex.split(cmd), "--version"], capture_output=True, text=True, env=AB_ENV
        )
        if done.returncode != 0:
            sys.exit(f"{cmd!r} --version exited {done.returncode}: {done.stderr.strip()}")
        said = done.stdout.strip()
        # a build older than the location in --version: None, told apart by that
        where.append(said.split(" from ", 1)[1].split(" (")[0] if " from " in said else None)
        print(f"{cmd}: {said}", flush=True)
    if where[0] is not None and where[0] == where[1]:
        sys.exit(f"--a and --b both run the specgen in {where[0]}: nothing to compare")


def ab_parser(doc: str, reps: int, n: int) -> argparse.ArgumentParser:
    """The options of a script timing two builds of specgen side by side: --a and --b (the
    command of each, before and after), --reps and -n (tokens per request) with these
    defaults; the description is `doc`'s first line."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--a", required=True, help="the first build's command (before)")
    ap.add_argument("--b", required=True, help="the second build's command (after)")
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("-n", type=int, default=n)
    return ap
