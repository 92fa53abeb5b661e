"""The field a record's id or question is probably in, when the one the job names is missing: a
dataset's own name for it (`id`, `prompt`) or the job's name spelt otherwise (`Question`, as a
spreadsheet's header has it), said in the error with the setting that reads it."""

import shlex
from typing import Iterable, Optional

from ...errors import quote

# key -> (its flag, the names datasets commonly give that field, each as _plain spells it)
_LIKELY = {
    "fields.id": ("--id-field", frozenset({
        "id", "qid", "questionid", "uid", "uuid", "idx", "index", "key", "exampleid", "sampleid", "problemid",
        "taskid", "itemid", "docid", "customid"})),
    "fields.question": ("--question-field", frozenset({
        "prompt", "input", "text", "problem", "query", "instruction", "questiontext", "content", "messages",
        "q", "prompttext", "inputtext"})),
}


def _plain(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def likely_field(key: str, wanted: str, names: Iterable[str]) -> Optional[str]:
    """The one name among `names` that is `wanted` spelt otherwise (case, `_`, `-`, spaces) or,
    failing that, the one a dataset commonly gives the field `key` reads; None where there is no
    such name or more than one."""
    names = list(names)
    same = [n for n in names if _plain(n) == _plain(wanted)]
    if same:
        return same[0] if len(same) == 1 else None
    common = _LIKELY[key][1] if key in _LIKELY else frozenset()
    found = [n for n in names if _plain(n) in common]
    return found[0] if len(found) == 1 else None


def field_hint(key: str, wanted: str, names: Iterable[str]) -> str:
    """'; if 'id' is the id, set fields.id: id (--id-field id)', or '' where no field is likely."""
    name = likely_field(key, wanted, names)
    if name is None or key not in _LIKELY:
        return ""
    what = key.split(".")[-1]
    return f"; if {quote(name)} is the {what}, set {key}: {name} ({_LIKELY[key][0]} {shlex.quote(name)})"
