"""Whether llama.cpp's repacked weights run on this CPU, asked in a process of its own:

    python -m ggbatch.workers.llama.repack_probe MODEL.gguf [MODEL.gguf ...]

loads each model with llama.cpp's extra buffer types (its repacked layouts: CPU_REPACK, and AMX
where the build has it) and decodes one batch of four sequences, the shape a worker's steps have.
llama-cpp-python is built for the CPU it is installed on, and a CPU can list an instruction set
it then refuses: an x86 virtual machine that lists AMX among its flags kills the process with
SIGILL at the first AMX tile instruction. Such a death ends this process, not its caller's, which
reads the exit status (runner/plan/repack_check.py): 0 when every model decoded.
"""

from __future__ import annotations

import sys

import numpy as np

from .model_runner import ModelRunner

SEQUENCES, TOKENS = 4, 8


def decode_repacked(path: str) -> None:
    """One batch of SEQUENCES × TOKENS tokens through the model with its weights repacked; raises
    if llama.cpp reports a failure."""
    runner = ModelRunner(path, n_threads=1, n_ctx=SEQUENCES * TOKENS * 2, n_seq_max=SEQUENCES,
                         n_batch=SEQUENCES * TOKENS, kv_unified=True, repack=True)
    try:
        n = SEQUENCES * TOKENS
        tokens = (np.arange(n, dtype=np.int32) % (runner.vocab.n_tokens - 1)) + 1
        positions = np.tile(np.arange(TOKENS, dtype=np.int32), SEQUENCES)
        seq_ids = np.repeat(np.arange(SEQUENCES, dtype=np.int32), TOKENS)
        logits = np.zeros(n, dtype=np.int8)
        logits[TOKENS - 1::TOKENS] = 1
        status = runner.decode(tokens, positions, seq_ids, logits)
        if status != 0:
            raise RuntimeError(f"{path}: llama_decode returned {status}")
        runner.logits(SEQUENCES)
    finally:
        runner.close()


if __name__ == "__main__":
    for model in sys.argv[1:]:
        decode_repacked(model)
