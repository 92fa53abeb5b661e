"""Versions of ggbatch and what it runs on, for reports, journals and `ggbatch --version`."""

from __future__ import annotations

from importlib import metadata


def package_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def describe() -> str:
    """`ggbatch --version`: ggbatch, llama-cpp-python, the llama.cpp it carries (its build number
    and commit), whether that build can offload to a GPU and what llama.cpp reports of this CPU
    (the features its kernels use)."""
    import llama_cpp

    system = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    offload = ("yes" if llama_cpp.llama_supports_gpu_offload() else
               "no (a CPU-only build: docs/guide/gpu.md says how to install another)")
    lines = [f"ggbatch {package_version('ggbatch')}",
             f"llama-cpp-python {package_version('llama_cpp_python')}",
             f"llama.cpp {_llama_build()}",
             f"llama.cpp GPU offload: {offload}",
             f"llama.cpp system info: {system}"]
    return "\n".join(lines)


def _llama_build() -> str:
    """ggml's version and commit, as compiled into the library llama-cpp-python ships (libllama
    itself does not say which llama.cpp it is)."""
    import ctypes
    import pathlib

    import llama_cpp

    lib_dir = pathlib.Path(llama_cpp.__file__).parent / "lib"
    try:
        ggml = ctypes.CDLL(str(next(lib_dir.glob("libggml-base.so*"))))
        ggml.ggml_version.restype = ggml.ggml_commit.restype = ctypes.c_char_p
        return f"ggml {ggml.ggml_version().decode()} (commit {ggml.ggml_commit().decode()})"
    except (StopIteration, OSError, AttributeError):
        return "(build not reported)"
