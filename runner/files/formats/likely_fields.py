"""The field a record's id or question is probably in, when the one the job names is missing: a
dataset's own name for it (`id`, `prompt`) or the job's name spelt otherwise (`Question`, as a
spreadsheet's header has it), said in the error with the setting that reads it."""

import shlex
from typing import Iterable, Optional

from ...errors import quote

_IDS = frozenset({"id", "qid", "questionid", "uid", "uuid", "idx", "index", "key", "exampleid", "sampleid",
                  "problemid", "taskid", "itemid", "docid", "customid"})
_QUESTIONS = frozenset({"prompt", "input", "text", "problem", "query", "instruction", "questiontext", "content",
                        "messages", "q", "prompttext", "inputtext"})
_GOLDS = frozenset({"label", "gold", "target", "correct", "correctanswer", "solution", "expected", "groundtruth",
                    "reference", "answerkey", "output", "y"})
_ANSWERS = frozenset({"response", "prediction", "predicted", "pred", "output", "completion", "generation",
                      "generated", "modelanswer", "modeloutput", "result", "text"})
# a job key, or a flag of its own (ggbatch score's) -> (its flag, what the field is, the names datasets
# commonly give it, each as _plain spells it)
_LIKELY = {
    "fields.id": ("--id-field", "id", _IDS),
    "fields.question": ("--question-field", "question", _QUESTIONS),
    "--id-field": ("--id-field", "id", _IDS),
    "--gold-field": ("--gold-field", "gold answer", _GOLDS),
    "--answer-field": ("--answer-field", "answer", _ANSWERS),
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
    common = _LIKELY[key][2] if key in _LIKELY else frozenset()
    found = [n for n in names if _plain(n) in common]
    return found[0] if len(found) == 1 else None


def field_hint(key: str, wanted: str, names: Iterable[str]) -> str:
    """'; if 'id' is the id, set fields.id: id (--id-field id)' (for a flag's own key: '; if
    'label' is the gold answer, give --gold-field label'), or '' where no field is likely."""
    name = likely_field(key, wanted, names)
    if name is None or key not in _LIKELY:
        return ""
    flag, what, _ = _LIKELY[key]
    setting = f"{flag} {shlex.quote(name)}"
    return f"; if {quote(name)} is the {what}, " + (f"give {setting}" if key.startswith("-") else
                                                   f"set {key}: {name} ({setting})")
