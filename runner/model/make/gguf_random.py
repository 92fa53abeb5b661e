"""Write a random-weight GGUF of any architecture: the part every generated model shares.

An architecture's shape (shape.py and a module per architecture: llama_gen.py, qwen3_gen.py, ...)
gives its tensor names and shapes, its hyper-parameters and the tensors that must not be random; this writes the
file, byte-for-byte deterministic for a seed, one tensor at a time so a big model never sits in RAM.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

from .gguf_vocab import GGUFVocab

WEIGHT_STD = 0.02
TensorSpec = tuple[str, tuple[int, ...]]  # a name and its numpy shape (the reverse of ggml's ne)
# A tensor's values when they must not be N(0, WEIGHT_STD) (a decay, a bias), else None.
Fill = Callable[[str, tuple[int, ...]], Optional[np.ndarray]]
# Convolution kernels llama.cpp's CPU ops read only as f32 (as its converter keeps them).
F32_WEIGHTS = (".ssm_conv1d.weight", ".shortconv.conv.weight")


def temp_sibling(path: Path) -> Path:
    """A fresh temp file next to ``path``, so os.replace onto it is atomic (same filesystem)."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(name, 0o644)  # mkstemp makes it 0600; the model should be readable like any file
    return Path(name)


def keeps_f32(name: str, shape: tuple[int, ...]) -> bool:
    """Tensors llama.cpp's converter stores in f32 whatever the file type: vectors, norms,
    tensors without a ``.weight`` suffix (Mamba's A and D), convolution kernels."""
    return (len(shape) == 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
            or name.endswith(F32_WEIGHTS))


def write_random_gguf(
    path: str | os.PathLike[str], arch: str, specs: list[TensorSpec],
    add_hyperparameters: Callable[[gguf.GGUFWriter], None], vocab: GGUFVocab, seed: int, ftype: str,
    name: str, output_rows: str, fill: Optional[Fill] = None, weight_std: float = WEIGHT_STD,
) -> Path:
    """A GGUF of `arch` with N(0, weight_std) matrices, vectors at 1 and `fill`'s own values.

    `output_rows` names the tensor whose rows give the logits: the rows of special and byte
    tokens are zeroed there, so they are never the greedy choice (see _write_weights)."""
    if ftype not in ("f16", "f32"):
        raise ValueError(f"ftype must be 'f16' or 'f32', not {ftype!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wdtype = np.dtype(np.float16 if ftype == "f16" else np.float32)
    writer = gguf.GGUFWriter(None, arch)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if ftype == "f16" else gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(vocab.vocab_size)
    add_hyperparameters(writer)
    vocab.add_to(writer)
    # Declare all tensors first, then stream them one at a time.
    for tname, tshape in specs:
        dtype = np.dtype(np.float32) if keeps_f32(tname, tshape) else wdtype
        writer.add_tensor_info(tname, tshape, dtype, int(np.prod(tshape)) * dtype.itemsize)
    tmp = temp_sibling(path)
    try:
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        _write_weights(writer, specs, vocab, wdtype, seed, output_rows, fill, weight_std)
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_weights(writer: gguf.GGUFWriter, specs: list[TensorSpec], vocab: GGUFVocab, wdtype: np.dtype,
                   seed: int, output_rows: str, fill: Optional[Fill], weight_std: float) -> None:
    """Vectors at 1, matrices N(0, weight_std), one tensor at a time.

    Output rows of non-NORMAL tokens (control, byte, unknown) are zeroed: their logit is then
    exactly 0, below the best of the many random ones, so greedy decoding writes words and runs
    to max_tokens instead of stopping at a random EOS or emitting stray UTF-8 bytes. Tied, the
    output rows are the embedding rows, so those are zeroed instead. Such a token then enters the
    model as a zero vector, which is harmless: RMS norm maps it to zero (no NaN), and only a
    prompt made of nothing but special tokens would leave all logits at 0 (a chat prompt always
    ends in text). The cost per token is unchanged, which is what these models are for."""
    rng = np.random.default_rng(seed)
    silent = np.asarray(vocab.token_types) != gguf.TokenType.NORMAL
    for tname, tshape in specs:
        f32 = keeps_f32(tname, tshape)
        data = fill(tname, tshape) if fill else None
        if data is not None:
            data = data.astype(np.float32 if f32 else wdtype)
        elif len(tshape) == 1:
            data = np.ones(tshape, dtype=np.float32)
        else:
            data = (rng.standard_normal(tshape, dtype=np.float32) * weight_std).astype(
                np.float32 if f32 else wdtype)
            if tname == output_rows:
                data[silent] = 0
        writer.write_tensor_data(data)
