"""Backends and devices: what this llama.cpp build computes with, and ggml's device registry
(the few ggml-backend functions the bindings do not wrap)."""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from typing import Any

import llama_cpp


def backend_of(system_info: str) -> str:
    """The GPU backend compiled into llama.cpp, from its system-info line ("CPU" if none)."""
    s = system_info.upper()
    for name, marks in (
        ("CUDA", ("CUDA",)),
        ("Metal", ("METAL", "MTL")),
        ("Vulkan", ("VULKAN",)),
        ("ROCm", ("HIP", "ROCM")),
        ("SYCL", ("SYCL",)),
    ):
        if any(m in s for m in marks):
            return name
    return "CPU"


def backend() -> str:
    """The backend this llama-cpp-python build computes with: CUDA, Metal, ... or CPU."""
    return backend_of(llama_cpp.llama_print_system_info().decode(errors="replace"))


def supports_gpu_offload() -> bool:
    """Whether -ngl / -ngld can do anything in this build (`llama_supports_gpu_offload`)."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> dict[str, str]:
    """llama.cpp build facts for reproducibility records: versions and backends."""
    info = {
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "gpu_offload": str(bool(llama_cpp.llama_supports_gpu_offload())),
    }
    version = getattr(llama_cpp, "llama_version", None)  # absent in some bindings
    if version is not None:
        with contextlib.suppress(Exception):
            info["llama_cpp"] = version().decode()
    return info


@dataclass(frozen=True)
class Device:
    """One ggml backend device (`ggml_backend_dev_get`).

    Attributes:
        name: ggml's name, e.g. ``CPU``, ``CUDA0``, ``RPC0``.
        description: e.g. the CPU model, or ``HOST:PORT`` for an RPC device.
        remote: True for a device that lives on an RPC server.
    """

    name: str
    description: str
    remote: bool


class _Ggml:
    """ctypes declarations of the few ggml-backend functions the bindings do not wrap.

    They are looked up through libllama's handle, which resolves them in the very libggml
    that llama.cpp uses (declared from ggml-backend.h and ggml.h of llama.cpp as vendored in
    llama-cpp-python 0.3.36).
    """

    def __init__(self) -> None:
        lib = llama_cpp.llama_cpp._lib
        p, s, n = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p

        def fn(name: str, restype: object, *argtypes: object) -> Any:
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = list(argtypes)
            return f

        self.reg_by_name = fn("ggml_backend_reg_by_name", p, n)
        self.reg_get_proc_address = fn("ggml_backend_reg_get_proc_address", p, p, n)
        self.reg_name = fn("ggml_backend_reg_name", n, p)
        self.register = fn("ggml_backend_register", None, p)
        self.dev_count = fn("ggml_backend_dev_count", s)
        self.dev_get = fn("ggml_backend_dev_get", p, s)
        self.dev_name = fn("ggml_backend_dev_name", n, p)
        self.dev_description = fn("ggml_backend_dev_description", n, p)
        self.dev_type = fn("ggml_backend_dev_type", ctypes.c_int, p)
        self.dev_backend_reg = fn("ggml_backend_dev_backend_reg", p, p)
        self.set_abort_callback = fn("ggml_set_abort_callback", p, p)
        self.add_server_type = ctypes.CFUNCTYPE(p, n)


_ggml_api: _Ggml | None = None


def _ggml() -> _Ggml:
    global _ggml_api
    if _ggml_api is None:
        _ggml_api = _Ggml()
    return _ggml_api


# ggml_backend_dev_type: CPU, GPU, IGPU, ACCEL, META (ggml-backend.h)
_DEV_TYPE_GPU, _DEV_TYPE_IGPU = 1, 2


def list_devices() -> tuple[Device, ...]:
    """Every ggml device registered in this process, in ggml's order."""
    g = _ggml()
    out = []
    for i in range(g.dev_count()):
        dev = g.dev_get(i)
        reg = g.dev_backend_reg(dev)
        out.append(
            Device(
                name=(g.dev_name(dev) or b"").decode(),
                description=(g.dev_description(dev) or b"").decode(),
                remote=bool(reg) and g.reg_name(reg) == b"RPC",
            )
        )
    return tuple(out)


def offload_devices(
    n_gpu_layers: int, local_only: bool
) -> tuple[ctypes.Array | None, tuple[str, ...]]:
    """The `llama_model_params.devices` array for a model with `n_gpu_layers` offloaded,
    and the names of the devices the model may use.

    llama.cpp's default (devices NULL) puts RPC devices first, then GPUs; `local_only`
    passes this machine's GPUs only, so the model never touches the network. The CPU
    always holds what is not offloaded (and the input embeddings).
    """
    g = _ggml()
    gpus: list[int] = []
    remote: list[int] = []
    for i in range(g.dev_count()):
        dev = g.dev_get(i)
        if g.dev_type(dev) not in (_DEV_TYPE_GPU, _DEV_TYPE_IGPU):
            continue
        reg = g.dev_backend_reg(dev)
        (remote if reg and g.reg_name(reg) == b"RPC" else gpus).append(dev)
    chosen = gpus if local_only else remote + gpus
    names = tuple((g.dev_name(d) or b"").decode() for d in chosen)
    names = (names if n_gpu_layers != 0 else ()) + ("CPU",)
    if not (local_only and remote):
        return None, names  # llama.cpp's own choice is the same
    array = (ctypes.c_void_p * (len(gpus) + 1))(*gpus, None)
    return array, names
