"""Helpers the tests share: the command line in a subprocess, answers built by hand, and question
files written by the test itself (GSM8K-like word problems, so no data set is needed)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ggbatch.workers.protocol import Answer, FinishReason

ROOT = Path(__file__).resolve().parents[1]


def ggbatch_command(*args: object) -> list[str]:
    """The command line of `python -m ggbatch ARGS`, for a test that starts it itself (Popen)."""
    return [sys.executable, "-m", "ggbatch", *map(str, args)]


def ggbatch(*args: object, timeout: float = 200, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`python -m ggbatch ARGS` from the project's root, its output captured as text."""
    return subprocess.run(ggbatch_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          **kwargs)


def answer(qid: str, text: str = "x", error: Optional[str] = None, finish: FinishReason = FinishReason.STOP,
           prompt_tokens: int = 3, tokens: int = 2, latency_s: float = 0.2, **fields: Any) -> Answer:
    """A finished answer as a worker would send it: an error makes it FinishReason.ERROR."""
    return Answer(qid=qid, text=text, finish_reason=FinishReason.ERROR if error else finish,
                  prompt_tokens=prompt_tokens, completion_tokens=tokens, worker_id=0, ttft_s=0.1,
                  latency_s=latency_s, error=error, **fields)


_NAMES = ["Janet", "Josh", "Maria", "Tom", "Aisha", "Ken", "Lucia", "Omar", "Priya", "Sam"]
_THINGS = ["eggs", "apples", "books", "marbles", "stickers", "cookies", "pencils", "shells"]
_TEMPLATES = [
    "{a} has {x} {t}. {b} gives {a} {y} more, and {a} uses {z} of them. How many {t} does {a} have now?",
    "{a} buys {x} boxes of {t} with {y} {t} in each box. {a} gives away {z}. How many {t} are left?",
    "{a} sells {t} for ${y} each. On Monday {a} sells {x} and on Tuesday {z} more. How much money does {a} make?",
    "A shop had {x} {t}. It sold {z} in the morning and got {y} more in the afternoon. How many {t} does the "
    "shop have at the end of the day, if {a} then buys half of them?",
]


def word_problem(i: int) -> tuple[str, str]:
    """Question i of a fixed family of GSM8K-like word problems, and its answer as a string."""
    rng = random.Random(i)
    a, b = rng.sample(_NAMES, 2)
    x, y, z = rng.randint(10, 90), rng.randint(2, 30), rng.randint(1, 9)
    kind = i % len(_TEMPLATES)
    text = _TEMPLATES[kind].format(a=a, b=b, t=rng.choice(_THINGS), x=x, y=y, z=z)
    gold = [x + y - z, x * y - z, y * (x + z), (x - z + y) - (x - z + y) // 2][kind]
    return text, str(gold)


def question_records(n: int, gold: bool = False, prefix: str = "q") -> list[dict]:
    """n GSM8K-like records {"questionID", "question"[, "answer"]}, the same for the same n."""
    records = []
    for i in range(n):
        text, answer_ = word_problem(i)
        records.append({"questionID": f"{prefix}{i}", "question": text, **({"answer": answer_} if gold else {})})
    return records


def choice_records(n: int, prefix: str = "m") -> list[dict]:
    """n MMLU-like records: a word problem with four lettered options, its "choices" and its "answer"."""
    records = []
    for i in range(n):
        text, gold = word_problem(i)
        options = [gold, str(int(gold) + 1), str(int(gold) - 2), str(int(gold) * 2)]
        random.Random(i).shuffle(options)
        choices = dict(zip("ABCD", options))
        lettered = "\n".join(f"{k}. {v}" for k, v in choices.items())
        records.append({"questionID": f"{prefix}{i}", "question": f"{text}\n\n{lettered}",
                        "answer": next(k for k, v in choices.items() if v == gold), "choices": choices})
    return records


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_questions(path: str | Path, n: int, gold: bool = False, prefix: str = "q") -> Path:
    """A .jsonl of n GSM8K-like questions (with their answers when `gold`)."""
    return write_jsonl(path, question_records(n, gold, prefix))


# A run's journal begins with its header (the fingerprint) and what the run decided on auto
# (runner/journal/ran.py); its answers follow.
JOURNAL_HEAD = 2


def journal_entries(out: str | Path) -> int:
    """How many answers the journal of the answers file `out` holds so far (a line being written included)."""
    path = Path(f"{out}.journal.jsonl")
    return max(0, len(path.read_text(encoding="utf-8").splitlines()) - JOURNAL_HEAD) if path.exists() else 0


def journaled(path: str | Path) -> list[dict]:
    """The entries of a journal (its answers, in file order), past its head lines."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()[JOURNAL_HEAD:]]


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "the condition",
             every: float = 0.02) -> Any:
    """Poll `condition` until it returns something truthy, which is returned; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(every)


def answers_of(engine: Any, questions: Iterable[Any]) -> dict[str, Answer]:
    """qid -> answer of every question, the engine (made by the caller, with the settings the
    test is about) stepped until none is unfinished."""
    for q in questions:
        engine.add(q)
    out: dict[str, Answer] = {}
    while engine.n_unfinished:
        for a in engine.step():
            out[a.qid] = a
    return out


# -- a model's answers, engine against each prompt decoded alone --------------------------------

STORY_WORDS = "the a cat dog ran sat big small red blue tree house little girl boy happy sad".split()


def repack_runs() -> bool:
    """Whether llama.cpp's repacked kernels run on this CPU (runner/plan/repack_check.py, asked once
    a session): a test that builds a llama.cpp model itself, where ggbatch's plan would not, asks
    for repacked weights only where the plan would give them (an x86 VM listing AMX dies with
    SIGILL on a quantized model's first decode with them)."""
    return not repack_refusal()


def repack_refusal() -> str:
    """Why this CPU refuses llama.cpp's repacked kernels, as the plan says it ("" where they run)."""
    from ggbatch.runner.plan.repack_check import repack_refused

    return repack_refused()


def alone(model: str, tokens: Iterable[int], max_tokens: int, flash_attn: bool = True) -> str:
    """The greedy answer of one prompt decoded alone in a fresh llama.cpp context. flash_attn as
    the engine has it: with random weights a near-tie between two tokens can go either way
    between flash attention and the plain kernels."""
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=1024, n_batch=512, flash_attn=flash_attn, verbose=False)
    try:
        return llm.create_completion(list(tokens), max_tokens=max_tokens, temperature=0)["choices"][0]["text"]
    finally:
        llm.close()


def loaded_memory(model: str) -> tuple[Any, int]:
    """(MemoryKind, sliding window) of a model as llama.cpp loads it."""
    import llama_cpp

    from ggbatch.workers.engine.memory_kind import MemoryKind

    llm = llama_cpp.Llama(model_path=model, n_ctx=256, verbose=False)
    try:
        kind = MemoryKind.of(llama_cpp.llama_model_is_recurrent(llm.model), llama_cpp.llama_model_is_hybrid(llm.model))
        return kind, llama_cpp.llama_model_n_swa(llm.model)
    finally:
        llm.close()


def answers_after_starts(model: str, tokenizer: Any, end: str, n_tokens: int = 8) -> set[str]:
    """The greedy answers, each decoded alone, of three prompts that differ only in their first
    words: three different answers show that a model's answer reads the whole prompt."""
    return {alone(model, tokenizer.tokenize(start + end), n_tokens) for start in ("Once a cat", "A small boy",
                                                                                "The blue tree")}

def chat_questions(tokenizer: Any, texts: list[str], system: Optional[str] = None) -> list[Any]:
    """Questions as the coordinator makes them: each text in the model's chat template, tokenized."""
    from array import array

    from ggbatch.runner.questions.prompts import PromptBuilder
    from ggbatch.workers.protocol import Question

    b = PromptBuilder(tokenizer.chat_template, system=system, bos_token=tokenizer.bos_text,
                      eos_token=tokenizer.eos_text)
    out = []
    for i, text in enumerate(texts):
        prompt = b.render(text)
        out.append(Question(f"q{i}", array("i", tokenizer.tokenize(prompt, add_bos=b.needs_bos(prompt))), i))
    return out


def passage_texts(n_passages: int, per_passage: int, seed: int = 1, words: int = 60) -> list[str]:
    """Questions on shared passages (the prefix cache's case), shuffled."""
    rng = random.Random(seed)
    passages = [" ".join(rng.choice(STORY_WORDS) for _ in range(words)) for _ in range(n_passages)]
    texts = [f"Story: {p}\nQuestion {j}: what did the {rng.choice(STORY_WORDS)} do?" for p in passages
             for j in range(per_passage)]
    rng.shuffle(texts)
    return texts


def engine_run(config: Any, questions: Iterable[Any], stats: Optional[dict] = None) -> dict[str, Answer]:
    """qid -> Answer from a LlamaEngine built on `config` (an EngineConfig) and stepped until every
    question is answered, then closed; `stats` gets the engine's counters and its memory kind."""
    from ggbatch.workers.llama.engine import LlamaEngine

    engine = LlamaEngine(config, worker_id=0)
    try:
        answers = answers_of(engine, questions)
        if stats is not None:
            stats.update(engine.stats(), memory=engine.memory_kind)
        return answers
    finally:
        engine.close()


def engine_answers(model: str, questions: list[Any], slots: int, prefix: Any, max_tokens: int,
                   stats: Optional[dict] = None, **config: Any) -> dict[str, str]:
    """qid -> text from a LlamaEngine of `slots` slots (n_ctx_seq 512, n_batch 256) with the shared
    prefix `prefix` and the EngineConfig fields in `config`; every answer must be without error.
    `stats` gets the engine's counters and its memory kind."""
    from ggbatch.workers.protocol import EngineConfig, GenerationParams

    answers = engine_run(EngineConfig(model_path=model, n_threads=1, slots=slots, n_ctx_seq=512, n_batch=256,
                                      prefix_tokens=prefix, generation=GenerationParams(max_tokens=max_tokens),
                                      **config), questions, stats)
    assert all(a.error is None for a in answers.values()), answers
    return {qid: a.text for qid, a in answers.items()}


def children() -> set[int]:
    """This process's children, but multiprocessing's resource tracker, which lives as long as we do."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}
