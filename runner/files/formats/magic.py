"""Files that are not text, known by their first bytes: a question file that is one is refused
naming what it is and what to give instead (textfile.no_binary), and an output path holding
one is not written over (written.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

ZIP_MAGIC = b"PK\x03\x04"  # .xlsx, .ods
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # .xls
# other files that are not text, by their first bytes (their zero bytes alone would read as UTF-16)
TEXT_FILE = "give a text file: JSON, JSON Lines or CSV, in UTF-8"
_TO_JSON_LINES = "convert it to JSON Lines (pandas: {}(PATH).to_json('questions.jsonl', orient='records', lines=True))"
# first bytes -> what the file is, and what to do instead (the formats a dataset comes in, and
# what ends up given by mistake)
BINARY_MAGIC = {b"\x7fELF": ("a program (ELF)", TEXT_FILE),
                b"GGUF": ("a GGUF model", "a model is given as --model, and questions as a text file: JSON, JSON Lines "
                                          "or CSV, in UTF-8"),
                b"\x1f\x8b": ("a gzip archive", "decompress it (gunzip) and give the question file inside"),
                b"\xfd7zXZ\x00": ("an xz archive", "decompress it (unxz) and give the question file inside"),
                b"\x28\xb5\x2f\xfd": ("a zstd archive", "decompress it (unzstd) and give the question file inside"),
                # bzip2: "BZh", the block size 1-9, then a block's magic (pi's digits)
                **{b"BZh%d1AY&SY" % level: ("a bzip2 archive", "decompress it (bunzip2) and give the question file "
                                                             "inside") for level in range(1, 10)},
                b"PAR1": ("a Parquet file", _TO_JSON_LINES.format("read_parquet")),
                b"ARROW1": ("an Arrow file", _TO_JSON_LINES.format("read_feather")),
                b"SQLite format 3\x00": ("an SQLite database", "export the table as CSV (sqlite3 -header -csv)"),
                b"\x89PNG": ("a PNG image", TEXT_FILE), b"\xff\xd8\xff": ("a JPEG image", TEXT_FILE),
                b"%PDF-": ("a PDF document", TEXT_FILE)}
SPREADSHEET_SUFFIXES = {".xlsx", ".xlsm", ".xls", ".ods"}
# names a workbook's first ZIP entries hold (a piped workbook has no suffix to tell it by)
SPREADSHEET_MARKS = (b"xl/", b"opendocument.spreadsheet")


def binary_kind(path: str, start: bytes) -> Optional[tuple[str, str]]:
    """(what the file is, what to give instead) for a spreadsheet saved as a workbook (.xlsx and
    .ods are ZIP archives, .xls an OLE compound file), another ZIP archive, a file known by its
    first bytes (a program, a model, an image) or one with zero bytes on both sides of its byte
    pairs (UTF-16 text has them on one side only); None for text. `instead` may name the file as
    PATH."""
    suffix = Path(path).suffix.lower()
    if start.startswith(OLE_MAGIC) or start.startswith(ZIP_MAGIC) and (
            suffix in SPREADSHEET_SUFFIXES or any(mark in start for mark in SPREADSHEET_MARKS)):
        return "a spreadsheet workbook (Excel or OpenDocument)", "save it as CSV (UTF-8) and give that file"
    if start.startswith(ZIP_MAGIC):
        return "a ZIP archive", "unzip it and give the question file inside (a spreadsheet: save it as CSV (UTF-8))"
    known = next((known for magic, known in BINARY_MAGIC.items() if start.startswith(magic)), None)
    even, odd = start[0::2].count(0), start[1::2].count(0)
    if known is None and min(even, odd) * 8 > len(start) > 0:  # UTF-16's zeros are on one side only
        known = ("binary data", TEXT_FILE)
    return known
