"""The one JSONL reader every loader uses."""
import pytest

from capscore.data.jsonl import iter_jsonl
from capscore.errors import InputError


def test_rows_lines_bom_and_blank_lines(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n{"a": 2}\n')
    assert list(iter_jsonl(p)) == [(f"{p}:1", {"a": 1}), (f"{p}:3", {"a": 2})]


def test_strict_raises_and_lenient_yields_the_message(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text('{"a": 1}\n[1, 2]\n{"a": \n')
    with pytest.raises(InputError, match=r"b\.jsonl:2: a JSONL line must be an object"):
        list(iter_jsonl(p))
    rows = list(iter_jsonl(p, strict=False))
    assert rows[1] == (f"{p}:2", "a JSONL line must be an object; got [1, 2]")
    assert rows[2][0] == f"{p}:3" and rows[2][1].startswith("malformed JSON line")


def test_non_utf8_always_stops(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n{"a": 3}\n')
    with pytest.raises(InputError, match=r"c\.jsonl:2: not UTF-8 text"):
        list(iter_jsonl(p, strict=False))
