"""What a journaled run decided for itself on auto, kept so that its rerun decides the same.

Some settings left on auto are decided from the questions the run holds, and move the answers:
flash attention on auto is off on a CPU up to a context per sequence (runner/plan/attention.py),
and a rerun that holds only the questions left to answer sizes a shorter context. So the
journal's second line says what the run decided, written once the layout is settled and before
any answer:

    line 1   {"ggbatch_journal": 1, "fingerprint": {...}}
    line 2   {"ggbatch_ran": {"flash_attn": false}}

A rerun on auto takes what the journaled run ran; a rerun that names a value is compared with it,
as with any setting in the fingerprint. A journal with answers but no such line was written by a
version before it existed, and those ran flash attention on unless it was named off, the job was
batch-invariant, or it scored choices by log-likelihood (legacy_ran): its rerun runs the same.
"""

from __future__ import annotations

import json
from typing import IO, Any, Mapping, Optional

RAN = b'{"ggbatch_ran"'
KNOWN = {"flash_attn": bool}  # what a run may say it decided, and its type
UNREADABLE = object()  # a ran line that is not JSON


def ran_line(ran: Mapping[str, Any]) -> bytes:
    return (json.dumps({"ggbatch_ran": dict(ran)}) + "\n").encode()


def read_ran(f: IO[bytes]) -> Any:
    """The value of the ran line at `f`'s position, as written (ran_problem says whether it is
    one), and `f` after it; UNREADABLE for such a line that is not JSON. None where the line is no
    ran line (an answer, in a journal written before it existed), and `f` where it was: a line
    cut short by a kill is none either (the run answered nothing)."""
    at = f.tell()
    line = f.readline()
    if line.lstrip().startswith(RAN) and line.endswith(b"\n"):
        try:
            written = json.loads(line)
        except ValueError:
            return UNREADABLE
        if isinstance(written, dict) and "ggbatch_ran" in written:
            return written["ggbatch_ran"]
    f.seek(at)
    return None


def ran_problem(ran: Any) -> Optional[str]:
    """What is wrong with a ran line's value (a hand-edited journal), or None: a rerun would
    otherwise decide afresh without a word, and answer otherwise. A key this version does not
    know (a later one's) is left alone."""
    if ran is None:
        return None
    if ran is UNREADABLE or not isinstance(ran, dict):
        return "its second line, what the run decided on auto, is not what ggbatch writes there"
    for key, kind in KNOWN.items():
        if key in ran and not isinstance(ran[key], kind):
            return f"its second line says the run decided {key} {json.dumps(ran[key])}, which is not {kind.__name__}"
    return None


def as_ran(old: Mapping[str, Any], ran: Optional[Mapping[str, Any]], new: Mapping[str, Any]) -> dict[str, Any]:
    """The journaled run's fingerprint, to compare with the rerun's: a setting the rerun leaves
    on auto (absent from its fingerprint) takes what the journaled run had, whatever that was; a
    setting it names is compared with what the journaled run ran, named or decided on auto."""
    ran = ran or {}
    was = {**ran, **old}  # a value named in the fingerprint is what ran
    return {key: value for key, value in was.items() if key not in ran or key in new}


def adopted(old: Mapping[str, Any], ran: Optional[Mapping[str, Any]], key: str) -> Any:
    """What a rerun on auto runs for `key`: the journaled run's value (named, or decided on auto),
    or None where it is not known."""
    if key in old:
        return old[key]
    return (ran or {}).get(key)


def legacy_ran(old: Mapping[str, Any]) -> dict[str, Any]:
    """What a run that wrote answers but no ran line decided: flash attention, which every such
    version (before flash_attn: auto could be off on a CPU) ran on, but for a batch-invariant job
    and for log-likelihood scoring (auto: off). Named in its fingerprint, the name stands."""
    off = bool(old.get("batch_invariant")) or old.get("answer.choice_scoring") == "loglikelihood"
    return {"flash_attn": not off}
