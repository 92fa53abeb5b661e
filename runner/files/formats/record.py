"""One record of a question file, whatever its format."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ...errors import InputError, half_surrogate, quote
from .openai_request import Request

INTEGER = re.compile(r"-?[1-9][0-9]*|0")  # an integer as JSON writes it: no sign but -, no leading zero


@dataclass(slots=True)  # not frozen: a frozen dataclass is slow to make, and a big file makes millions
class Record:
    qid: str  # ids are kept as strings: "007" stays "007"
    fields: Mapping[str, Any]  # the whole record, for prompt templates
    line: int
    # An OpenAI Batch line: its messages or prompt and its own settings (or why it cannot be
    # answered). None for the records of json, jsonl and csv files: prompt.template makes their prompt.
    request: Optional[Request] = None
    digest: int = 0  # a 64-bit hash of the record as written (runner/journal/journal.py reuses answers by it)
    key: int = 0  # a 64-bit hash of its id (runner/files/compact.py text_key), once read

    def integer_id(self, id_field: str) -> bool:
        """Whether the file wrote its id as a JSON integer. A line the journal answered before is
        not parsed again (its fields are empty): an id that reads as an integer is taken for one."""
        if not self.fields:
            return INTEGER.fullmatch(self.qid) is not None
        return type(self.fields.get(id_field)) is int  # bool, an int's subclass, is no id


def checked_id(where: str, qid: str, name: str) -> str:
    """The id as it is, or an InputError naming the line: an empty id (a spreadsheet's blank
    cell), or one holding a lone surrogate (JSON's "\\ud800" spells one), which no UTF-8 file, the
    journal and the answers file included, can hold."""
    if not qid.strip():
        raise InputError(f"{where}: '{name}' is empty" + (f" ({quote(qid)})" if qid else ""))
    if why := half_surrogate(qid):
        raise InputError(f"{where}: '{name}' {quote(qid)}: {why}: ids must be text that UTF-8 can write")
    return qid
