"""Result writers: crash-safe appends, repair of a cut last record, Parquet via a journal, no clobbering."""
import json

import pandas as pd
import pytest

from capscore.errors import CapscoreError
from capscore.report.writers import (
    COLUMNS,
    complete_csv_prefix,
    complete_jsonl_prefix,
    journal_path,
    open_writer,
    read_rows,
)

ROWS = [
    {"id": "1", "image": "a.png", "caption": 'say "hi",\nthen go', "system": "s", "model": "m", "metric": "clip-s", "score": 0.125, "error": None},
    {"id": "2", "image": "b.png", "caption": "é ünïcode", "system": "s", "model": "m", "metric": "clip-s", "score": None, "error": "b.png: not found"},
    {"id": "3", "image": "c.png", "caption": "plain", "system": "t", "model": "m", "metric": "clip-s", "score": 1 / 3, "error": None},
]


def test_jsonl_prefix_stops_before_a_cut_or_broken_line():
    good = b'{"a": 1}\n\n{"b": 2}\n'
    assert complete_jsonl_prefix(good) == len(good)
    assert complete_jsonl_prefix(good + b'{"c": 3') == len(good)  # no newline yet
    assert complete_jsonl_prefix(good + b'{"c": \n{"d": 4}\n') == len(good)  # garbage line, then more


def test_csv_prefix_respects_quoted_newlines_and_column_count():
    rec1 = b'1,a.png,"two\nlines",s,m,clip-s,0.5,\n'
    rec2 = b'2,b.png,"say ""x""",s,m,clip-s,,err\n'
    data = rec1 + rec2
    assert complete_csv_prefix(data) == len(data)
    assert complete_csv_prefix(rec1 + b'2,b.png,"say ""x') == len(rec1)  # cut inside quotes
    assert complete_csv_prefix(rec1 + b'2,b.png,"open\n') == len(rec1)  # newline inside an open quote
    assert complete_csv_prefix(rec1 + b"3,c.png,cut\n") == len(rec1)  # too few columns


@pytest.mark.parametrize("ext", ["jsonl", "csv", "parquet"])
def test_round_trip_and_resume_after_a_cut_last_record(tmp_path, ext):
    out = tmp_path / f"r.{ext}"
    w, prior = open_writer(out)
    assert prior is None
    w.write(ROWS[:2])
    w.close(complete=False)  # killed: Parquet stays a journal
    target = journal_path(out) if ext == "parquet" else out
    assert target.exists() and (ext != "parquet" or not out.exists())
    with open(target, "ab") as f:
        f.write(b'3,c.png,"half a rec' if ext == "csv" else b'{"id": "3", "ima')
    with pytest.raises(CapscoreError, match="--resume .* --overwrite"):
        open_writer(out)
    w, prior = open_writer(out, resume=True)
    assert [r["id"] for r in read_rows(prior)] == ["1", "2"]
    w.write(ROWS[2:])
    w.close()
    back = list(read_rows(out))
    assert back == ROWS  # exact: captions with quotes/newlines, None score/error, floats round-trip
    if ext == "parquet":
        assert not journal_path(out).exists()
        df = pd.read_parquet(out)
        assert list(df.columns) == list(COLUMNS) and df["score"].isna().tolist() == [False, True, False]
    if ext == "csv":
        df = pd.read_csv(out, keep_default_na=False)
        assert df["caption"].tolist() == [r["caption"] for r in ROWS]


def test_overwrite_replaces_and_finished_parquet_is_read_only(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(ROWS[0]) + "\n")
    w, prior = open_writer(out, overwrite=True)
    assert prior is None and out.stat().st_size == 0
    w.close()
    pq = tmp_path / "r.parquet"
    w, _ = open_writer(pq)
    w.write(ROWS)
    w.close()
    w, prior = open_writer(pq, resume=True)
    assert w is None and prior == pq and len(list(read_rows(prior))) == 3
    with pytest.raises(CapscoreError, match="unsupported output format '.txt'"):
        open_writer(tmp_path / "r.txt")


def test_resume_never_cuts_a_file_that_is_not_a_result_file(tmp_path):
    theirs = tmp_path / "theirs.csv"
    theirs.write_bytes(b"a,b\n1,2\n3,")
    with pytest.raises(CapscoreError, match="not a capscore result file"):
        open_writer(theirs, resume=True)
    assert theirs.read_bytes() == b"a,b\n1,2\n3,"
    other = tmp_path / "other.jsonl"
    other.write_bytes(b'{"x": 1}\n{"x": 2')
    with pytest.raises(CapscoreError, match="not a capscore result row"):
        open_writer(other, resume=True)
    assert other.read_bytes() == b'{"x": 1}\n{"x": 2'
