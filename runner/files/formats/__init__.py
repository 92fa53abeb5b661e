"""Question files and answers files, one module per format.

    questions  json     a JSON array of records                     jsonfile.py
               jsonl    JSON Lines, one record per line             jsonfile.py
               csv      a header row, then one record per row       csvfile.py
               openai   OpenAI Batch input: one request per line    openai_input.py (one body: openai_request.py;
                                                                    /v1/responses: openai_responses.py; the
                                                                    values' checks: openai_checks.py)
    answers    json, jsonl, csv: {id, answer, error} in input order jsonfile.py, csvfile.py
                                  (a row's fields as CSV cells, and back: cells.py)
               openai   OpenAI Batch output lines                   openai_output.py (a response: openai_responses.py)

Which format a file is (the job's input_format / output_format, else its extension and content):
detect.py. A record of any format is a formats.record.Record. An answers file's text, a row at a
time, per format: answers_text.py (TEXT_FORMATS); the rows of an answers or gold file:
table_rows.py. Files that are no text, by their first bytes: magic.py (refused as questions, not
written over: written.py). A missing id or question field's likely name: likely_fields.py.
"""

FORMATS = ("json", "jsonl", "csv", "openai")
