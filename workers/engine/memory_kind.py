"""What a model's memory can do: the one place that decides which KV operations ggbatch may ask of it.

An attention KV cache holds a cell per position, so a sequence can be cut back to any position
(`llama_memory_seq_rm(mem, seq, p0, -1)`): a prompt may start from any part of another stream
copied in. A recurrent state (Mamba, RWKV) holds no positions: llama.cpp refuses a partial
removal (returns false) and copies between sequences are whole-state only. A hybrid (LFM2,
Granite 4.0-H, Qwen3.5, Jamba) has both, and its recurrent part decides.

So on recurrent and hybrid memory a sequence takes a stream's content only whole: the shared
prefix (decoded once into a sequence of its own) is copied into a slot when the prompt starts
with all of it and goes on past it, and any other prompt is computed from its first token. The
prefix cache, which starts prompts from part of a held prompt, is off.

Pure: llama.cpp's answers (llama_model_is_recurrent / _is_hybrid) come in from model_runner.py.
"""

from __future__ import annotations

import enum


class MemoryKind(str, enum.Enum):
    ATTENTION = "attention"  # a KV cache only: cut anywhere
    RECURRENT = "recurrent"  # a state per sequence only
    HYBRID = "hybrid"  # attention layers and recurrent ones

    @classmethod
    def of(cls, is_recurrent: bool, is_hybrid: bool) -> "MemoryKind":
        """From llama_model_is_recurrent and llama_model_is_hybrid (a hybrid is not 'recurrent')."""
        if is_hybrid:
            return cls.HYBRID
        return cls.RECURRENT if is_recurrent else cls.ATTENTION

    @property
    def cuts(self) -> bool:
        """Whether llama.cpp removes a sequence's positions from p0 > 0 on (keeping the ones before)."""
        return self is MemoryKind.ATTENTION

    @property
    def prefix_cache(self) -> bool:
        """Whether the prefix cache can run: it starts a prompt from part of another's, which needs cuts."""
        return self.cuts

    def start_len(self, n: int, n_held: int) -> int:
        """Of the n tokens (n <= n_held) a prompt could take from a stream holding n_held, how
        many it takes: all of them where the stream can be cut after n; on a recurrent state
        only the whole stream (n == n_held), else none: the prompt is computed from the start."""
        return n if self.cuts or n == n_held else 0

    def note(self) -> str:
        """One sentence for the log and the report on what this memory changes; '' for attention."""
        if self.cuts:
            return ""
        return (f"the model's memory is {self.value} (llama.cpp cannot cut a sequence's state back to a "
                "position): the prefix cache is off, and a prompt starts from the shared prefix only when "
                "it holds all of it and goes on past it, otherwise it is computed from its first token")


class KvRefused(RuntimeError):
    """llama.cpp refused a KV operation whose result the engine relies on: going on would decode
    from the wrong state (or have llama_decode refuse the next batch)."""
