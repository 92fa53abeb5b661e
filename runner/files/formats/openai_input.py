"""OpenAI Batch input files: one request per line (JSON Lines), each checked by openai_request.py.

A line that is not a request at all (malformed JSON, not an object, no custom_id string) stops
the run naming its line, like any question file's. A request ggbatch cannot answer as asked
(streaming, another url such as embeddings, an unknown body field, ...) becomes a record that
says why (Request.error): it is answered with that error and the rest of the file is answered.
The custom_id is the question's id: duplicates are refused (exit 2, naming both lines), as OpenAI
refuses them.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Mapping

from ...errors import InputError, quote
from ..compact import text_key
from .detect import is_openai_output
from .openai_request import parse_request
from .record import Record, checked_id

log = logging.getLogger("ggbatch")

# Said of a line of answers given as questions or requests (following it, every line would be refused)
OUTPUT_NOT_REQUESTS = ("an OpenAI Batch output line (answers: custom_id and response), not a request: this file "
                       "holds a batch's answers; give the file of requests it answered as the input")


def say_models(path: str, models: Mapping[str, int]) -> None:
    """Once per file: the models its lines name (lines -> count), which the job's model replaces."""
    if models:
        top = Counter(models).most_common(3)
        named = ", ".join(f"{quote(m)} ({n} line{'s' if n > 1 else ''})" for m, n in top)
        log.info("%s names model %s%s: ignored, the job's model answers every line", path, named,
                 f" and {len(models) - 3} more" if len(models) > 3 else "")


def openai_record(where: str, line: int, obj: Any, digest: int = 0) -> Record:
    """One line's record; the caller checks that custom_ids are unique (as OpenAI refuses a batch
    with two)."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: each line of an OpenAI Batch file must be a JSON object, "
                         f"got {type(obj).__name__}")
    if is_openai_output(obj):
        raise InputError(f"{where}: {OUTPUT_NOT_REQUESTS}")
    qid = obj.get("custom_id")
    if not isinstance(qid, str):
        raise InputError(f"{where}: a batch request needs a custom_id string, got {quote(qid)}")
    checked_id(where, qid, "custom_id")
    return Record(qid, obj, line, parse_request(obj), digest, text_key(qid))
