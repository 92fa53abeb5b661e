"""A file that is not text given as questions: one line saying what it is and what to do (a
dataset's Parquet or Arrow file, an archive, a program, a model), never a CSV reader's error
about its stray bytes."""

import bz2
import gzip
import json
import struct
import sys

import pytest

from ggbatch.runner.errors import InputError
from ggbatch.runner.files.inputs import read_records

JSONL = json.dumps({"questionID": "1", "question": "Once"}) + "\n"


def error_of(path, **kw):
    with pytest.raises(InputError) as err:
        read_records(str(path), **kw)
    return str(err.value)


TEXT_FILE = "give a text file: JSON, JSON Lines or CSV, in UTF-8"


@pytest.mark.parametrize("content, said", [
    (open(sys.executable, "rb").read(3000), f"a program (ELF), not text; {TEXT_FILE}"),
    (b"GGUF\x03\x00\x00\x00" + bytes(64), "a GGUF model, not text; a model is given as --model, and questions as "
     "a text file: JSON, JSON Lines or CSV, in UTF-8"),
    (b"".join(struct.pack("<I", i) for i in range(1000)), f"binary data, not text; {TEXT_FILE}"),  # zeros both sides
    (gzip.compress(JSONL.encode()), "a gzip archive, not text; decompress it (gunzip) and give the question file "
     "inside"),
    *[(bz2.compress(JSONL.encode(), level), "a bzip2 archive, not text; decompress it (bunzip2) and give the "
       "question file inside") for level in (1, 9)],  # was 'q.jsonl:1: not UTF-8 text (byte 0xf9 at column 13)'
])
@pytest.mark.parametrize("fmt", [None, "csv", "jsonl"])
def test_a_binary_file_is_said_to_be_binary(tmp_path, content, said, fmt):
    """/bin/ls named .jsonl was 'this looks like CSV; name it .csv', and read as CSV 'UTF-16 text
    without a byte order mark'."""
    path = tmp_path / "q.jsonl"
    path.write_bytes(content)
    assert error_of(path, fmt=fmt) == f"{path}: {said}"


# A Parquet file starts (and ends) with PAR1, its first page header after it; an Arrow IPC file
# (Feather 2) with ARROW1 and two bytes of padding: the first bytes pyarrow writes.
@pytest.mark.parametrize("name, start, said", [
    ("train.parquet", b"PAR1\x15\x04\x15\x14\x15\x18L\x15\x04\x15\x00\x12\x00\x00",
     "a Parquet file, not text; convert it to JSON Lines (pandas: read_parquet('{path}').to_json('questions.jsonl', "
     "orient='records', lines=True))"),
    ("train.arrow", b"ARROW1\x00\x00\xff\xff\xff\xff",
     "an Arrow file, not text; convert it to JSON Lines (pandas: read_feather('{path}').to_json('questions.jsonl', "
     "orient='records', lines=True))"),
    ("q.csv", b"\xfd7zXZ\x00\x00\x04", "an xz archive, not text; decompress it (unxz) and give the question file "
     "inside"),
    ("q.db", b"SQLite format 3\x00\x10\x00", "an SQLite database, not text; export the table as CSV (sqlite3 "
     "-header -csv)"),
])
def test_a_datasets_file_says_how_to_make_it_text(tmp_path, name, start, said):
    """A Parquet file (a Hugging Face dataset's) was read as CSV: "q.parquet:1: the header has no
    column 'questionID' (fields.id); its columns: 'PAR1\\x15\\x04...'"."""
    path = tmp_path / name
    path.write_bytes(start + bytes(200))
    assert error_of(path) == f"{path}: {said.format(path=path)}"
