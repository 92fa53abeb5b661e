"""The GPUs llama.cpp can offload to and their free memory, for the coordinator's memory plan
(runner/plan/vram.py), read through ggml's device registry (ggml-backend.h) in the tokenizer
process: the same devices, in the same order, as llama.cpp's model loader sees.

llama-cpp-python binds llama.h only; ggml's device functions are read from the libggml beside
the libllama it loaded (its LLAMA_CPP_LIB_PATH included). A build or platform where that fails
plans no VRAM, as before there was this module.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as bindings
from llama_cpp._ctypes_extensions import load_shared_library

from ..protocol import GpuMemory

GGML_BACKEND_DEVICE_TYPE_GPU = 1  # ggml-backend.h: a device with memory of its own (an integrated GPU's is RAM)


def gpus() -> tuple[GpuMemory, ...]:
    """Every dedicated GPU with its free and total memory now; () on a CPU-only build."""
    if not llama_cpp.llama_supports_gpu_offload():
        return ()
    try:
        found = devices()
    except (OSError, AttributeError):
        return ()
    return tuple(GpuMemory(name, free, total) for name, kind, free, total in found
                 if kind == GGML_BACKEND_DEVICE_TYPE_GPU)


def devices() -> list[tuple[str, int, int, int]]:
    """Every device ggml registered: (name, ggml_backend_dev_type, free bytes, total bytes)."""
    ggml = _libggml()
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append((ggml.ggml_backend_dev_name(dev).decode("utf-8", "replace"), ggml.ggml_backend_dev_type(dev),
                    free.value, total.value))
    return out


def _libggml() -> Any:
    lib = load_shared_library("ggml", bindings._base_path)
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    lib.ggml_backend_dev_memory.restype = None
    return lib
