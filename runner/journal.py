"""The journal: every finished answer appended and flushed beside the output, so a run that dies
at 90% loses nothing and a rerun answers only what is missing.

    <output>.journal.jsonl
    line 1   {"ggbatch_journal": 1, "fingerprint": {setting: value, ...}}
    line 2+  {"qid": ..., "prompt": <hash of the prompt tokens>, "text": ..., ...}   one per answer

The fingerprint holds everything that decides an answer (model identity, prompt and chat
template, sampling, max tokens, ...). A rerun with a different fingerprint is refused, naming the
setting, unless started fresh. An entry is reused only if its prompt hash still matches, so an
edited question under the same id is answered again; a question with settings of its own (an
OpenAI Batch line's max_tokens, temperature, ...) has them in its hash, so editing them on one
line answers that line again. The journal is kept after a complete run:
rerunning the same job then rewrites the same output without answering anything, and a job whose
question file grew answers only the new questions.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from dataclasses import asdict
from typing import Any, Mapping, Optional, Sequence

from .config import JobConfig
from .errors import ConfigError, OutputError, quote
from .model import ModelIdentity
from .question_settings import settings_key
from .versions import package_version
from ..workers.protocol import Answer, FinishReason, GenerationParams, Question

VERSION = 1


def prompt_hash(tokens: array, own: Optional[GenerationParams] = None) -> str:
    """Of a question's prompt tokens, and of its own generation settings if it has any."""
    h = hashlib.blake2b(tokens.tobytes(), digest_size=12)
    if own is not None:
        h.update(settings_key(own))
    return h.hexdigest()


def fingerprint(config: JobConfig, model: ModelIdentity, generation: GenerationParams,
                template_sha: str) -> dict[str, Any]:
    """Everything that decides an answer; a journal is reused only when all of it is unchanged."""
    return {"model": model.digest, "model.n_ctx": "auto" if config.n_ctx is None else config.n_ctx,
            "llama_cpp_python": package_version("llama_cpp_python"),
            "chat_template": template_sha, "system": config.system,
            "prompt.template": config.prompt_template, "fields.question": config.question_field,
            "prompt.template_kwargs": config.template_kwargs,
            "max_tokens": generation.max_tokens, "stop": list(generation.stop),
            "ignore_eos": generation.ignore_eos, "batch_invariant": config.batch_invariant,
            # fixed choices, a schema's or a job's grammar: an answer made under others is not reused
            "answer": asdict(generation.answer) if generation.answer is not None else None,
            # another shard's output holds other questions: refused rather than silently mixed
            "shard": str(config.shard) if config.shard is not None else None,
            **{f"sampling.{k}": v for k, v in asdict(generation.sampling).items()}}


def changed_setting(old: Mapping[str, Any], new: Mapping[str, Any]) -> Optional[str]:
    """The first setting whose value differs, or None."""
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            return key
    return None


def _entry(answer: Answer, prompt: str) -> dict[str, Any]:
    return {"qid": answer.qid, "prompt": prompt, "text": answer.text,
            "finish_reason": answer.finish_reason.value, "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens, "worker_id": answer.worker_id,
            "ttft_s": round(answer.ttft_s, 4), "latency_s": round(answer.latency_s, 4),
            "error": answer.error, "created": answer.created, "choice_logprobs": answer.choice_logprobs}


def _answer(e: Mapping[str, Any]) -> Answer:
    return Answer(e["qid"], e["text"], FinishReason(e["finish_reason"]), e["prompt_tokens"],
                  e["completion_tokens"], e["worker_id"], e["ttft_s"], e["latency_s"], e["error"],
                  e.get("created", 0.0), e.get("choice_logprobs"))


class Journal:
    def __init__(self, path: str, fingerprint: Mapping[str, Any], fresh: bool = False) -> None:
        self.path = path
        self.fingerprint = dict(fingerprint)
        # qid -> (prompt hash, answer) from an earlier run of the same job
        self.previous: dict[str, tuple[str, Answer]] = {}
        self._hashes: dict[str, str] = {}  # qid -> prompt hash, of the questions to answer now
        if not fresh and os.path.exists(path):
            self.previous = self._read()
        try:
            # Rewrite header + kept entries first, so a torn last line of a killed run never
            # ends up in the middle of the file; then append from there.
            tmp = f"{path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps({"ggbatch_journal": VERSION, "fingerprint": self.fingerprint}) + "\n")
                for h, answer in self.previous.values():
                    f.write(json.dumps(_entry(answer, h), ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._file = open(path, "a", encoding="utf-8")
        except OSError as exc:
            raise OutputError(f"{path}: cannot write the journal: {exc.strerror or exc}") from None

    def split(self, questions: Sequence[Question]) -> tuple[list[Question], dict[str, Answer]]:
        """(the questions to answer, in their order; qid -> answer reused from the journal). An
        answer is reused if its prompt is unchanged and it did not fail. The prompt hashes of the
        questions to answer are kept for their entries."""
        todo: list[Question] = []
        reused: dict[str, Answer] = {}
        for q in questions:
            h = prompt_hash(q.tokens, q.generation)
            entry = self.previous.get(q.qid)
            if entry is not None and entry[0] == h and entry[1].error is None:
                reused[q.qid] = entry[1]
            else:
                todo.append(q)
                self._hashes[q.qid] = h
        return todo, reused

    def append(self, answers: Sequence[Answer]) -> None:
        """Append answers (those of one worker message) with one write and one flush."""
        text = "".join(json.dumps(_entry(a, self._hashes.get(a.qid, "")), ensure_ascii=False) + "\n"
                       for a in answers)
        try:
            self._file.write(text)
            self._file.flush()  # in the kernel's hands now: survives kill -9 of this process
        except OSError as exc:
            raise OutputError(f"{self.path}: cannot append to the journal ({exc.strerror or exc}); "
                              "every answer written before this one is kept") from None

    def sync(self) -> None:
        """Make what was appended survive a power cut too (a killed process loses nothing anyway)."""
        try:
            os.fsync(self._file.fileno())
        except OSError:
            pass

    def close(self) -> None:
        self.sync()
        try:
            self._file.close()
        except OSError:
            pass  # a failed append has already said so; everything flushed before it is kept

    def _read(self) -> dict[str, tuple[str, Answer]]:
        with open(self.path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        try:
            old = json.loads(lines[0])["fingerprint"]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{self.path}: not a ggbatch journal; remove it or run with --fresh") from None
        key = changed_setting(old, self.fingerprint)
        if key is not None:
            raise ConfigError(f"{self.path}: '{key}' changed since the journaled run "
                              f"({quote(old.get(key))} -> {quote(self.fingerprint.get(key))}); "
                              "run with --fresh to start over")
        kept: dict[str, tuple[str, Answer]] = {}
        for line in lines[1:]:
            try:
                e = json.loads(line)
                kept[e["qid"]] = (e["prompt"], _answer(e))
            except (ValueError, KeyError, TypeError):
                continue  # the last line of a run killed mid-write: that answer is redone
        return kept
