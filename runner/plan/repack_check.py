"""Whether this machine's llama.cpp runs repacked weights: asked once per machine and build, by a
probe process (workers/llama/repack_probe.py) decoding tiny quantized models of the types users'
models come in, and kept in ggbatch's cache folder.

llama-cpp-python compiles llama.cpp for the CPU it is installed on, with the kernels of every
instruction set the CPU lists. Its repacked layouts (CPU_REPACK, and AMX on Intel CPUs that list
it) are used only when the weights are repacked, and a CPU can list an instruction set it then
refuses: an x86 virtual machine listing AMX killed every worker with SIGILL (signal 4) as soon as
a quantized model decoded, where plain weights answer. `auto` then leaves the weights plain
(repack.repack_weights), and `model.repack: true` is refused with the reason.

The answer is keyed by the llama.cpp libraries' sizes and times and the CPU's flags: a new build
or another CPU asks again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

from ..files.outputs import write_atomic
from ..files.paths import ggbatch_cache
from .repack import cpu_flags

log = logging.getLogger("ggbatch")

PROBE_QUANTS = ("q8_0", "q4_0", "q4_k_m")  # what users' models mostly are; AMX and CPU_REPACK take each
PROBE_SECONDS = 120
VERDICTS = "repack-probe.json"


def repacked_weights_run(flags: frozenset[str]) -> tuple[bool, str]:
    """(whether llama.cpp's repacked kernels run here, why not when they do not)."""
    key = build_key(flags)
    path = ggbatch_cache() / VERDICTS
    known = _read(path)
    if key in known:
        return bool(known[key]["runs"]), str(known[key].get("why", ""))
    runs, why = _probe()
    if runs is not None:  # a probe that could not ask (no disk for its models, a timeout, a kill) is not kept
        known[key] = {"runs": runs, "why": why}
        try:
            write_atomic(str(path), json.dumps(known, indent=1) + "\n")
        except OSError:
            pass
    # unknown (no disk for the probe's models, a timeout, a kill) is not yes: repacked weights where the
    # kernels stop the CPU kill every worker with SIGILL, plain weights only run slower
    return runs is True, why


def repack_refused(plain_anyway: bool = False) -> str:
    """Why this CPU cannot run llama.cpp's repacked weights ("" when it can), asked only when the
    weights may be repacked (`plain_anyway`: they will not be, whatever the answer)."""
    if plain_anyway:
        return ""
    runs, why = repacked_weights_run(cpu_flags())
    return "" if runs else why


def build_key(flags: frozenset[str]) -> str:
    """The llama.cpp build (its shared libraries' names, sizes and times) and the CPU (its flags)."""
    h = hashlib.blake2b(digest_size=12)
    for lib in _libraries():
        st = lib.stat()
        h.update(f"{lib.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    h.update(" ".join(sorted(flags)).encode())
    return h.hexdigest()


def _libraries() -> list[Path]:
    spec = importlib.util.find_spec("llama_cpp")  # found, not imported: only workers/llama loads llama.cpp
    if spec is None or spec.origin is None:
        return []
    return sorted(p for p in Path(spec.origin).parent.rglob("*") if p.suffix in (".so", ".dylib", ".dll"))


def _probe() -> tuple[Optional[bool], str]:
    """(True, ""), (False, why), or (None, why) when the probe could not run to an answer."""
    folder = ggbatch_cache() / "repack-probe"
    try:
        models = [_probe_model(folder, quant) for quant in PROBE_QUANTS]
    except (OSError, RuntimeError, ValueError) as exc:
        return None, f"no probe could check that llama.cpp's repacked kernels run on this CPU (its models could " \
                      f"not be written: {exc})"
    log.info("checking once that llama.cpp's repacked kernels run on this CPU (%s)", ", ".join(PROBE_QUANTS))
    try:
        done = subprocess.run([sys.executable, "-m", "ggbatch.workers.llama.repack_probe", *map(str, models)],
                              capture_output=True, timeout=PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        return None, f"no probe could check that llama.cpp's repacked kernels run on this CPU (it took over " \
                      f"{PROBE_SECONDS} s)"
    return _verdict(done.returncode)


def _verdict(returncode: int) -> tuple[Optional[bool], str]:
    """What the probe's exit status says of the kernels. Only SIGILL is the CPU refusing an
    instruction it lists; a kill from outside (the OOM killer's SIGKILL, a SIGTERM or SIGINT from a
    shutdown or a user) or a crash the kernels need not have caused says nothing of them, and a
    kept verdict from one would keep every later run's weights plain and refuse `repack: true`."""
    if returncode >= 0:
        return True, ""  # decoded (0), or a Python error of the probe's own: not a verdict on the kernels
    sig = -returncode
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
    if sig == signal.SIGILL:
        return False, (f"llama.cpp's repacked kernels stop this CPU ({name}: an instruction the CPU lists but "
                       "refuses, such as AMX in a virtual machine)")
    return None, f"no probe could check that llama.cpp's repacked kernels run on this CPU (it was stopped by {name})"


def _probe_model(folder: Path, quant: str) -> Path:
    """A tiny model quantized to `quant`, rows of 256 (the k-quants' block) so every tensor takes
    the quantized type, built once into the cache."""
    from ..model.make import modelgen

    path = folder / f"probe-{quant}.gguf"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        shape = modelgen.ModelShape(n_layer=1, n_embd=256, n_head=4, n_head_kv=4, n_ff=512, n_ctx=256)
        plain = folder / f".probe-{quant}-{os.getpid()}.f32.gguf"
        try:
            modelgen.write_model_gguf(plain, shape, modelgen.build_demo_vocab(), ftype="f32")
            modelgen.quantize(plain, path, quant)
        finally:
            plain.unlink(missing_ok=True)
    return path


def _read(path: Path) -> dict[str, dict[str, object]]:
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}
