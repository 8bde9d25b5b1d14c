"""The reproducibility record of `specgen bench`: models (read from the GGUF header, hashed),
software, machine and settings (`build_record`), its fingerprint, the differences that make
two records not comparable, and the comparison with an earlier `--json` result."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from specgen import __version__
from specgen.bench.prompts import BenchPrompt, k_label, prompt_set_sha256
from specgen.bench.results import (
    FORMAT,
    BenchResult,
    BenchSettings,
    Comparison,
    SpeedupChange,
    record_differences,
)
from specgen.errors import ConfigError

# llama.cpp and the model files are reached through specgen.session, imported inside the
# functions that build a record (start-up time): the bench package is imported by ui/reports
# for its result types (so by `specgen models`), which must not load llama.cpp.

# -- reproducibility record -----------------------------------------------------------------

# llama.cpp's `llama_ftype` (general.file_type) names
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip


def model_record(path: Path, n_gpu_layers: int) -> dict[str, Any]:
    """File name, size, SHA-256, architecture and quantization type of one model file."""
    from specgen import session  # start-up time: see the note at the top

    path = Path(path)
    facts = session.model_file_facts(path)
    ft = facts["file_type"]
    return {
        "file": path.name,
        "path": str(path.resolve()),
        "size_bytes": path.stat().st_size,
        "sha256": facts["sha256"],
        "architecture": facts["architecture"],
        "quantization": _FILE_TYPES.get(ft, f"type {ft}") if ft is not None else None,
        "n_gpu_layers": n_gpu_layers,
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                timeout=5,
            )  # fmt: skip
            if out.stdout.strip():
                return out.stdout.strip()
    return platform.processor() or platform.machine()


def gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs (name, memory) via nvidia-smi when present; [] otherwise."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.stdout.strip().splitlines():
        name, _, mem = line.rpartition(",")
        with contextlib.suppress(ValueError):
            found.append({"name": name.strip(), "memory_bytes": int(float(mem)) * 1024 * 1024})
    return found


def host_record() -> dict[str, Any]:
    """The machine without llama.cpp: CPU model and count, memory (bytes, or None), OS,
    Python, GPUs (what `bench --url`'s client records about the machine it ran on)."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "gpus": gpus(),
    }


def machine_record() -> dict[str, Any]:
    """`host_record` and the CPUs llama.cpp may use (``cpus_usable``, its ``-t 0``)."""
    from specgen import session  # start-up time: see the note at the top

    return {**host_record(), "cpus_usable": session.default_threads()}


def specgen_version() -> str:
    """The installed distribution's version, else the package's own (a source checkout)."""
    try:
        return version("specgen")
    except PackageNotFoundError:
        return __version__


def source_commit() -> str | None:
    """The git commit of the specgen source that runs (12 hex digits, ``+dirty`` when
    tracked files differ from it), or None outside a git checkout (an installed wheel):
    a published figure states its commit."""
    here = Path(__file__).resolve().parent.parent  # the package: +dirty speaks for all of it
    git = shutil.which("git")
    if git is None:
        return None
    try:
        head = subprocess.run(
            [git, "-C", str(here), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            [git, "-C", str(here), "status", "--porcelain", "--untracked-files=no", "--", "."],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head or None


def software_record() -> dict[str, Any]:
    from specgen import session  # start-up time: see the note at the top

    return {
        "specgen": specgen_version(),
        "commit": source_commit(),
        **session.software_facts(),
        "numpy": np.__version__,
    }


def backend_of(system_info: str) -> str:
    """The backend named first in ggml's system_info line (see `specgen.session`)."""
    from specgen import session  # start-up time: see the note at the top

    return session.backend_of(system_info)


def build_record(
    target_path: Path,
    draft: Path | str,
    target_cfg: Any,
    draft_cfg: Any,
    settings: BenchSettings,
    prompts: Sequence[BenchPrompt],
    n_ctx: int | None = None,
    draft_p_min: float = 0.0,
) -> dict[str, Any]:
    """The reproducibility record: everything that changes the figures.

    `target_cfg`/`draft_cfg` are `EngineConfig`s; `draft` is a path or `ngram`.
    """
    from specgen import session  # start-up time: see the note at the top

    draft_rec: dict[str, Any]
    if isinstance(draft, Path) or (isinstance(draft, str) and draft not in ("ngram", "none")):
        draft_rec = model_record(Path(draft), draft_cfg.n_gpu_layers)
    else:
        draft_rec = {"file": str(draft), "sha256": None, "n_gpu_layers": 0}
    threads = target_cfg.n_threads if target_cfg.n_threads > 0 else session.default_threads()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "target": model_record(Path(target_path), target_cfg.n_gpu_layers),
        "draft": draft_rec,
        "draft_p_min": draft_p_min,
        "software": software_record(),
        "machine": machine_record(),
        "threads": threads,
        "n_ctx": n_ctx if n_ctx is not None else target_cfg.n_ctx,
        "n_batch": target_cfg.n_batch,
        "swa_full": target_cfg.swa_full,
        "flash_attn": target_cfg.flash_attn,
        "sampling": {
            "temps": list(settings.temps),
            "top_k": settings.sampling.top_k,
            "top_p": settings.sampling.top_p,
            "min_p": settings.sampling.min_p,
        },
        "seed": settings.seed,
        "n_tokens": settings.n_tokens,
        "runs": settings.runs,
        "draft_max": [k_label(k) for k in settings.draft_max],
        # the acceptance rule per temperature, and whether the draft model drafts with
        # prompt lookup beside it
        "verify_rule": {str(t): _rule(settings, t) for t in settings.temps},
        "lookup": _lookup(settings, draft),
        "prompt_set_sha256": prompt_set_sha256(prompts),
        "n_prompts": len(prompts),
    }


def _rule(settings: BenchSettings, temp: float) -> str:
    return settings.flags(temp).verify_rule


def _lookup(settings: BenchSettings, draft: Any) -> bool:
    from specgen.session import resolve_lookup

    return resolve_lookup(settings.lookup, draft)


def load_earlier(path: Path) -> dict[str, Any]:
    """An earlier `--json` result for `--compare`, read and checked (before measuring, so
    a wrong path fails in a second, not after the whole benchmark).

    Raises:
        ConfigError: the file cannot be read or is not a bench result.
    """
    return read_result(path, FORMAT, "a specgen bench JSON file")


def read_result(path: Path, fmt: str, what: str) -> dict[str, Any]:
    """A `--json` result file of format `fmt` for `--compare` (`what` names it in the
    error: "a specgen bench JSON file").

    Raises:
        ConfigError: the file cannot be read, is not JSON, or is not of that format.
    """
    try:
        old = json.loads(Path(path).read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise ConfigError(f"--compare: cannot read {path}: {why}") from None
    if not isinstance(old, dict) or old.get("format") != fmt:
        raise ConfigError(f"--compare: {path} is not {what}")
    return old


def compare_with(
    result: BenchResult, path: Path, earlier: dict[str, Any] | None = None
) -> Comparison:
    """Compare `result` with an earlier `--json` file: record differences and speedups.
    `earlier` is that file as `load_earlier` read it (read now when None).

    Raises:
        ConfigError: the file cannot be read or is not a bench result.
    """
    old = earlier if earlier is not None else load_earlier(path)
    diffs = record_differences(old.get("record", {}), result.record)
    # the earlier file is JSON on disk, read as it was written
    old_speedups = {
        (c["temp"], c["draft_max"]): c["overall"]["speedup"] for c in old.get("configs", [])
    }
    rows = [
        SpeedupChange(c.temp, c.draft_max, old_speedups[(c.temp, c.draft_max)], c.overall.speedup)
        for c in result.configs
        if (c.temp, c.draft_max) in old_speedups
    ]
    return Comparison(
        file=str(path),
        fingerprint=old.get("fingerprint"),
        comparable=not diffs,
        differences=diffs,
        speedups=rows,
    )
