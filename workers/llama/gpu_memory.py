"""The GPUs llama.cpp can offload to and their free memory, for the coordinator's memory plan
(runner/plan/vram.py), read through ggml's device registry (ggml-backend.h): the same devices,
in the same order, as llama.cpp's model loader takes. The coordinator asks in a short-lived
process before any worker loads (runner/pool/gpu_probe.py): a process that touches a GPU holds a
context there, and the workers' own weights must not count as taken.

llama-cpp-python binds llama.h only; ggml's device functions are read from the libggml beside
the libllama it loaded (its LLAMA_CPP_LIB_PATH included). Where that fails, or a device cannot
say its memory, nothing is reported and VRAM stays unplanned.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, NamedTuple

from ..helper_messages import GpuMemory
from ..protocol import encode

GGML_BACKEND_DEVICE_TYPE_GPU = 1  # ggml-backend.h: a device with memory of its own (an integrated GPU's is RAM)


class Device(NamedTuple):
    name: str
    kind: int  # ggml_backend_dev_type
    backend: str  # its registry's name: CUDA, ROCm, Vulkan, RPC, ...
    device_id: str  # the PCI bus id where the backend knows it, else ""
    free: int
    total: int


def offload_targets(devices: list[Device]) -> tuple[GpuMemory, ...]:
    """The GPUs llama.cpp's loader takes (src/llama.cpp, llama_model_load_from_file): dedicated
    ones, not an RPC server's (another machine's memory), each physical GPU once (a build with two
    GPU backends lists it under both: the first wins); and only those that can say their memory."""
    out: list[GpuMemory] = []
    seen: set[str] = set()
    for d in devices:
        if d.kind != GGML_BACKEND_DEVICE_TYPE_GPU or d.backend == "RPC" or d.device_id in seen:
            continue
        if d.device_id:
            seen.add(d.device_id)
        if d.total > 0:
            out.append(GpuMemory(d.name, d.free, d.total))
    return tuple(out)


def gpus() -> tuple[GpuMemory, ...]:
    """Every GPU llama.cpp may offload to, with its free and total memory now; () on a CPU-only
    build or when ggml's library cannot be read."""
    import llama_cpp

    if not llama_cpp.llama_supports_gpu_offload():
        return ()
    try:
        return offload_targets(devices())
    except (OSError, AttributeError, RuntimeError):  # RuntimeError: llama_cpp could not load the library
        return ()


class _Caps(ctypes.Structure):
    _fields_ = [(name, ctypes.c_bool) for name in ("async_", "host_buffer", "buffer_from_host_ptr", "events",
                                                    "mmap_support")]


class _Props(ctypes.Structure):  # ggml-backend.h: struct ggml_backend_dev_props
    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p), ("memory_free", ctypes.c_size_t),
                ("memory_total", ctypes.c_size_t), ("type", ctypes.c_int), ("device_id", ctypes.c_char_p),
                ("caps", _Caps)]


def devices() -> list[Device]:
    """Every device ggml registered, in its order."""
    ggml = _libggml()
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        props = _Props()
        ggml.ggml_backend_dev_get_props(dev, ctypes.byref(props))
        backend = ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(dev)) or b""
        out.append(Device(_text(props.name), props.type, backend.decode("utf-8", "replace"), _text(props.device_id),
                          props.memory_free, props.memory_total))
    return out


def _text(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


def report_gpus(results: Any) -> None:
    """Entry point of the coordinator's probe process: send gpus() and exit."""
    os.environ["GGML_NO_BACKTRACE"] = "1"  # read when libggml loads: an abort then costs no gdb
    from .llama_log import init_backend

    init_backend()  # llama.cpp's log goes through ggbatch's handler, not to the terminal
    results.send_bytes(encode(gpus()))


def _libggml() -> Any:
    import llama_cpp.llama_cpp as bindings
    from llama_cpp._ctypes_extensions import load_shared_library

    lib = load_shared_library("ggml", bindings._base_path)
    pointer = ctypes.c_void_p
    for name, args, result in (("ggml_backend_dev_count", [], ctypes.c_size_t),
                               ("ggml_backend_dev_get", [ctypes.c_size_t], pointer),
                               ("ggml_backend_dev_get_props", [pointer, ctypes.POINTER(_Props)], None),
                               ("ggml_backend_dev_backend_reg", [pointer], pointer),
                               ("ggml_backend_reg_name", [pointer], ctypes.c_char_p)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib
