"""A record's `choices` field, in the shapes data sets come in. One reader for `ggbatch run`
(answer.choices: auto answers with a record's labels, or with its texts when it has none) and for
`ggbatch score` (a gold record's choices, labelled):

    {"A": "4", "B": "8"}                          labels A, B (MMLU and LSAT-RC as ../shared keeps them)
    ["4", "8"]                                    no labels: the texts are what is answered
    {"text": ["4", "8"], "label": ["A", "B"]}     labels A, B (Hugging Face's ARC, OpenBookQA, CommonsenseQA)
    '["4", "8"]', "['4', '8']", '{"A": "4"}'      any of these as text: a CSV cell (JSON, or the Python
                                                  spelling pandas' to_csv writes for a list or a dict,
                                                  numpy's array([...], dtype=object) inside it too)
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

LETTERS = "ABCDEFGHIJ"  # the largest letter set of the common benchmarks (MMLU-Pro has ten choices)


@dataclass(frozen=True)
class Choices:
    texts: tuple[str, ...]
    labels: Optional[tuple[str, ...]]  # None: a bare list, answered by its texts

    @property
    def answered(self) -> tuple[str, ...]:
        """What an answer among them is: their labels, or the texts of a bare list."""
        return self.labels or self.texts

    def by_label(self) -> dict[str, str]:
        """label -> text; a bare list is labelled A, B, ... in order, and past the tenth by its
        position from 1 ("11", "12", ...), which no letter names."""
        labels = self.labels or tuple(LETTERS[i] if i < len(LETTERS) else str(i + 1) for i in range(len(self.texts)))
        return dict(zip(labels, self.texts))


def read_choices(value: Any) -> Optional[Choices]:
    """The choices a `choices` field holds; None when it holds none of the shapes above (a
    missing field: None too). Texts of other kinds (numbers) are kept as text."""
    if isinstance(value, str):
        value = _literal(value)
    if isinstance(value, list):
        return Choices(tuple(_text(v) for v in value), None) if value else None
    if not isinstance(value, Mapping) or not value:
        return None
    if set(value) == {"text", "label"}:
        texts, labels = value["text"], value["label"]
        if isinstance(texts, list) and isinstance(labels, list) and texts and len(texts) == len(labels):
            return Choices(tuple(_text(v) for v in texts), tuple(_text(v) for v in labels))
        return None
    return Choices(tuple(_text(v) for v in value.values()), tuple(_text(k) for k in value))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _literal(text: str) -> Any:
    """A list or mapping spelt in a CSV cell, JSON or Python's repr; the text itself otherwise."""
    stripped = text.strip()
    if not stripped.startswith(("[", "{")):
        return text
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    try:
        return ast.literal_eval(NUMPY_ARRAY.sub(r"\1", stripped))  # literals only: never runs code
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


# A Hugging Face dataset's ARC-style column through pandas' to_csv: its lists are numpy arrays,
# `{'text': array(['a dog', 'a cat'], dtype=object), 'label': array(['A', 'B'], dtype=object)}`
NUMPY_ARRAY = re.compile(r"\barray\((\[.*?\])(?:,\s*dtype=[\w.]+)?\)", re.S)
