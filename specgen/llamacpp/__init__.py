"""The only door to `llama_cpp`: the engine, Ctrl-C across its callbacks, RPC, devices and
chat templates. Nothing outside this package imports `llama_cpp`, and this package imports
no other part of specgen but the protocols (`specgen.engine`) and the errors."""

from __future__ import annotations

from specgen.llamacpp.devices import (
    Device,
    backend,
    backend_of,
    list_devices,
    supports_gpu_offload,
    system_info,
)
from specgen.llamacpp.engine import LlamaEngine
from specgen.llamacpp.loading import EngineConfig, default_threads
from specgen.llamacpp.rpc import (
    REBUILD_WITH_RPC,
    add_rpc_servers,
    parse_rpc_endpoints,
    probe_rpc_server,
    rpc_supported,
)
from specgen.llamacpp.signals import set_verbose
from specgen.llamacpp.templates import compile_chat_template

__all__ = [
    "REBUILD_WITH_RPC",
    "Device",
    "EngineConfig",
    "LlamaEngine",
    "add_rpc_servers",
    "backend",
    "backend_of",
    "compile_chat_template",
    "default_threads",
    "list_devices",
    "parse_rpc_endpoints",
    "probe_rpc_server",
    "rpc_supported",
    "set_verbose",
    "supports_gpu_offload",
    "system_info",
]
