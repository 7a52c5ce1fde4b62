"""Property-based (hypothesis): the report's readers yield rows or raise capscore's InputError, never anything else.

Inputs are random rows of JSON values (booleans, strings, NaN, nesting) in each row format, and real row
files cut at random byte offsets. Within the test's time bound every reader either returns well-typed
rows (text or None in text columns, finite float or None in numeric ones) or raises InputError.
"""
from __future__ import annotations

import io
import json
import math
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capscore.errors import InputError
from capscore.report.rows import NUMERIC_COLUMNS, TEXT_COLUMNS, Limits, iter_jsonl_objects, iter_score_rows, read_json

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                            HealthCheck.too_slow])
values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)
keys = st.sampled_from(["id", "image", "video", "caption", "system", "model", "metric", "score", "error",
                        "image_score", "ref_score", "coarse", "image_id", "x"])
rows = st.lists(st.dictionaries(keys, values, max_size=8), max_size=6)
SMALL = Limits(max_rows=1000, max_line_bytes=4096, max_json_bytes=1 << 16)
_n = [0]


def _path(tmp_path, suffix):
    _n[0] += 1
    return tmp_path / f"r{_n[0]}{suffix}"


def _drain(path):
    try:
        got = list(iter_score_rows(path, SMALL))
    except InputError as e:
        assert "\n" not in str(e) and len(str(e)) < 2000
        return None
    for where, row in got:
        assert str(path) in where
        for c in TEXT_COLUMNS:
            assert row.get(c) is None or isinstance(row[c], str)
        for c in NUMERIC_COLUMNS:
            v = row.get(c)
            assert v is None or (type(v) is float and math.isfinite(v)), (c, v)
    return got


def _strict_number(v):
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


@SETTINGS
@given(rows=rows)
def test_jsonl_and_coco_rows(tmp_path, rows):
    p = _path(tmp_path, ".jsonl")
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = _drain(p)
    numbers_ok = all(_strict_number(r.get(c)) for r in rows for c in NUMERIC_COLUMNS if c in r)
    assert (got is not None) == numbers_ok  # refused exactly when a numeric cell is a boolean, string, list, dict
    q = _path(tmp_path, ".json")
    q.write_text(json.dumps(rows))
    assert (_drain(q) is not None) == numbers_ok


@SETTINGS
@given(rows=rows)
def test_csv_rows(tmp_path, rows):
    import csv

    cols = sorted({k for r in rows for k in r})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])
    p = _path(tmp_path, ".csv")
    p.write_text(buf.getvalue())
    _drain(p)


@SETTINGS
@given(rows=st.lists(st.fixed_dictionaries({"caption": st.text(max_size=8), "image": st.text(max_size=4)},
                                           optional={"score": st.none() | st.floats(allow_nan=True)
                                                     | st.booleans() | st.text(max_size=4)}), min_size=1, max_size=5))
def test_parquet_rows(tmp_path, rows):
    scores = [r.get("score") for r in rows]
    kinds = {type(s) for s in scores if s is not None}
    if len(kinds) > 1:  # Arrow needs one type per column
        return
    p = _path(tmp_path, ".parquet")
    pq.write_table(pa.table({"caption": [r["caption"] for r in rows], "image": [r["image"] for r in rows],
                             "score": pa.array(scores)}), p)
    got = _drain(p)
    assert (got is not None) == (kinds <= {float})


@pytest.fixture(scope="module")
def real_bytes():
    rows = [{"id": str(i), "image": f"i{i}.png", "caption": f'say "hi",\n{i}', "system": "s", "model": "m",
             "metric": "clip-s", "score": i / 7, "error": None} for i in range(30)]
    import csv

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    t = pa.Table.from_pylist(rows)
    pbuf = io.BytesIO()
    pq.write_table(t, pbuf)
    return {".jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode(), ".csv": buf.getvalue().encode(),
            ".json": json.dumps(rows).encode(), ".parquet": pbuf.getvalue()}


@SETTINGS
@given(data=st.data())
def test_truncated_and_flipped_real_files(tmp_path, real_bytes, data):
    suffix = data.draw(st.sampled_from(sorted(real_bytes)))
    raw = bytearray(real_bytes[suffix])
    cut = data.draw(st.integers(0, len(raw)))
    raw = raw[:cut]
    if raw and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    p = _path(tmp_path, suffix)
    p.write_bytes(bytes(raw))
    _drain(p)
    try:  # the JSON readers of summaries, correlate.json and logs
        read_json(p, SMALL) if suffix == ".json" else list(iter_jsonl_objects(p, SMALL))
    except InputError:
        pass


@SETTINGS
@given(blob=st.binary(max_size=512))
def test_random_bytes(tmp_path, blob):
    for suffix in (".jsonl", ".csv", ".json", ".parquet"):
        p = _path(tmp_path, suffix)
        p.write_bytes(blob)
        _drain(p)


def test_a_cut_last_jsonl_line_is_a_live_run_not_an_error(tmp_path):
    p = tmp_path / "live.jsonl"
    good = json.dumps({"id": "1", "image": "a", "caption": "c", "score": 0.5}) + "\n"
    p.write_text(good + '{"id": "2", "ima')
    assert [r["id"] for _, r in iter_score_rows(p)] == ["1"]
    p.write_text(good + '{"id": "2", "ima\n' + good)  # a broken line in the middle is an error
    with pytest.raises(InputError, match="live.jsonl:2"):
        list(iter_score_rows(p))


def test_random_seeded_shuffle_of_columns_is_read_by_name(tmp_path):
    row = {"id": "1", "image": "a", "caption": "c", "system": "s", "score": 0.25, "error": None}
    cols = list(row)
    random.Random(0).shuffle(cols)
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({c: row[c] for c in cols}) + "\n")
    ((_, got),) = list(iter_score_rows(p))
    assert got["score"] == 0.25 and got["system"] == "s"


def test_csv_rows_are_named_by_their_first_physical_line(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text('id,image,caption,score\n1,a,"two\nlines",0.5\n2,b,c,nope\n')
    with pytest.raises(InputError, match=r"x.csv:4: score is not a number"):
        list(iter_score_rows(p))


def test_distinct_systems_and_long_text_are_bounded(tmp_path):
    from capscore.report.runs import discover

    p = tmp_path / "many.jsonl"
    p.write_text("".join(json.dumps({"id": str(i), "image": "a", "caption": "x" * 5000, "system": f"s{i}",
                                     "score": 0.5, "error": None}) + "\n" for i in range(30)))
    with pytest.raises(InputError, match=r"many.jsonl:20: more than 20 distinct"):
        discover([p], limits=Limits(max_distributions=20))
    run = discover([p], limits=Limits(max_text_chars=100)).scores[0]
    (block,) = run.blocks.values()
    assert len(block.systems) == 30 and all(len(c) == 100 and c.endswith("…") for *_, c in block.highest)
