"""Peers load quantized weights as ggbatch's plan does on this machine: plain where llama.cpp's
repacked kernels are refused (runner/plan/repack_check.py: an x86 VM listing AMX dies with SIGILL
on them), so both sides of a comparison run the same kernels.

llama-cpp-python's Llama takes no repack setting, so its default model parameters are read with
`use_extra_bufts` off (llama.cpp's switch for repacked buffer types); llama-server takes
`--no-repack`. Call `follow_plan()` before any Llama is made in the process.
"""

from __future__ import annotations

from typing import Any

from ggbatch.runner.plan.repack_check import repack_refused


def follow_plan() -> str:
    """Every Llama made afterwards in this process loads plain weights where repacking is refused;
    returns the reason ("" when nothing changed)."""
    why = repack_refused()
    if why:
        import llama_cpp.llama_cpp as lib

        defaults = lib.llama_model_default_params
        if not getattr(defaults, "plain_weights", False):
            def plain() -> Any:
                params = defaults()
                params.use_extra_bufts = False
                return params

            plain.plain_weights = True  # type: ignore[attr-defined]
            lib.llama_model_default_params = plain
    return why


def server_flags() -> list[str]:
    """llama-server's flags for the same weights."""
    return ["--no-repack"] if repack_refused() else []
