"""One JSONL reader for every loader (captions, judgment datasets, training data).

Read as bytes, line by line, so memory stays flat and a decoding error names its
own line. Blank lines are skipped; a UTF-8 byte-order mark on the first line is
accepted. Bytes that are not UTF-8 always stop the reading (the rest of a file
must never vanish silently); a malformed line or a line that is not a JSON object
is raised as :class:`InputError` (``strict=True``) or yielded as its one-line
message so the caller can write an error row (``strict=False``, ``--skip-bad``). An object that
names one key twice is malformed (:func:`unique_keys`), in JSONL lines and in every JSON file read
with that hook: ``json`` alone would keep the last value without a word. So is a string holding a lone
surrogate (a ``\\ud800`` escape without its pair, :func:`surrogate_problem`): ``json`` accepts it, but it is
not Unicode text, no output file can hold it, and a tokenizer would see something else than was written.
"""
from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from capscore.errors import InputError, short_repr


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (``json`` would keep the last value without a word)."""

    def __init__(self, key: str):
        self.key = key
        super().__init__(f"the key {key!r} appears twice in one object")


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` for ``json.load(s)``: the object as a dict, :class:`DuplicateKey` if a key repeats."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return out


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def surrogate_problem(text: str, obj) -> str | None:
    """Why the JSON ``obj`` parsed from ``text`` is not Unicode text, or None: a string (value or key)
    holding a lone surrogate. ``obj`` is walked only when ``text`` holds a surrogate escape (a pair such
    as ``\\ud83d\\ude00`` decodes to one character and passes)."""
    if "\\u" not in text or not _SURROGATE_ESCAPE.search(text):
        return None
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            if (m := _SURROGATE.search(x)) is not None:
                return (f"the string {short_repr(x)} holds a lone surrogate (\\u{ord(m.group()):04x} without its "
                        "pair): not Unicode text")
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return None


def text_name(name: str) -> str:
    """A file name as text: the bytes of a name that is not UTF-8 (which Python carries as lone surrogates)
    shown as U+FFFD, so a system named after the file can be written to every output."""
    if not _SURROGATE.search(name):
        return name
    try:
        return os.fsencode(name).decode("utf-8", errors="replace")
    except UnicodeEncodeError:  # a surrogate that is no escaped byte
        return _SURROGATE.sub("\ufffd", name)


def json_problem(e: BaseException) -> str:
    """One line for what ``json`` raises besides JSONDecodeError on hostile input."""
    if isinstance(e, DuplicateKey):
        return str(e)
    if isinstance(e, RecursionError):
        return "nested too deeply"
    text = str(e)
    if "integer string conversion" in text:
        return "a number with more than 4300 digits"
    return text.splitlines()[0][:120] if text else type(e).__name__


def csv_problem(e: BaseException) -> str:
    """One line for a csv.Error from a strict reader, naming the usual cause."""
    if "end of data" in str(e):
        return "unterminated quoted field: its opening quote is on this line and no closing quote follows"
    return f"malformed CSV ({' '.join(str(e).split())})"


def iter_csv_rows(reader, path: str | Path) -> Iterator[tuple[int, int, dict]]:
    """Yield ``(first_line, last_line, row)`` from a strict ``csv.DictReader`` (the one CSV row loop).

    A csv.Error or undecodable bytes stop the reading with an :class:`InputError` naming the record's
    first physical line — even with ``--skip-bad``: the reader cannot resync, and the rest of the file
    must never vanish. A header naming one column twice is an error too (the dict would keep the last
    cell). What a short or long row means is each caller's decision (it sees ``None``).
    """
    try:
        header = reader.fieldnames or []
    except (csv.Error, UnicodeDecodeError) as e:
        raise InputError(f"{path}:1", csv_problem(e)) from None
    twice = next((c for i, c in enumerate(header) if c and c in header[:i]), None)  # unnamed: no one reads them
    if twice is not None:
        raise InputError(f"{path}:1", f"the column {twice!r} appears twice in the header")
    while True:
        start = reader.line_num + 1  # first physical line of the next record
        try:
            row = next(reader)
        except StopIteration:
            return
        except (csv.Error, UnicodeDecodeError) as e:
            raise InputError(f"{path}:{start}", csv_problem(e)) from None
        yield start, reader.line_num, row


def iter_jsonl(path: str | Path, *, strict: bool = True) -> Iterator[tuple[str, dict | str]]:
    """Yield ``("FILE:LINE", row)`` per object line; with ``strict=False`` a bad line yields its message."""
    try:
        fb = open(path, "rb")
    except OSError as e:
        raise InputError(str(path), f"cannot read file ({e.strerror or e})") from None
    with fb:
        for lineno, raw in enumerate(fb, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError:
                raise InputError(where, "not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line, object_pairs_hook=unique_keys)
                problem = surrogate_problem(line, row) if isinstance(row, dict) else \
                    f"a JSONL line must be an object; got {short_repr(row)}"
            except json.JSONDecodeError as e:
                problem = f"malformed JSON line ({e.msg}, column {e.colno})"
            except (RecursionError, ValueError) as e:
                problem = f"unreadable JSON line ({json_problem(e)})"
            if problem is None:
                yield where, row
            elif strict:
                raise InputError(where, problem)
            else:
                yield where, problem
