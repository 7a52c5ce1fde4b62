"""Bounded, type-strict reading of the files `capscore report` takes in (score rows, JSON, JSONL).

Score rows are recognised by their columns, not by the command that wrote them: a row file is one
whose rows have ``score`` and ``caption`` and one of ``image`` / ``video`` / ``image_id`` (the columns of
:data:`capscore.report.writers.COLUMNS`, of ``VIDEO_COLUMNS`` and of the COCO results format).
``model``, ``metric`` and ``system`` say which distribution a row belongs to; the numeric columns
(``score``, RefCLIP-S/RefPAC-S ``image_score``/``ref_score``, the video parts ``coarse``, ``fine_*``,
``ref_*``) must be numbers:

* In JSONL, COCO JSON and Parquet a number is a JSON/Arrow number. A boolean (``true``) or a string
  (``"0.5"``) in a numeric column is refused with one line naming ``FILE:ROW`` — never read as 1.0 or
  0.5. ``null`` (and NaN, as pandas writes a missing value) is "no score", an error row.
* In CSV every cell is text: an empty cell is "no score", anything else must parse as a number.

Every read is bounded before anything is materialised (:class:`Limits`): only regular files are
opened (a FIFO, a device such as ``/dev/zero`` behind a symlink, or a socket is refused without
opening it); a JSONL/CSV line longer than ``max_line_bytes`` is refused; whole-file JSON (summaries,
``correlate.json``, COCO results) must be at most ``max_json_bytes``; at most ``max_rows`` score rows
are kept per report; and PNGs are checked for their pixel count before decoding.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from capscore.errors import InputError
from capscore.data.jsonl import csv_problem, json_problem, surrogate_problem

#: columns read as numbers (a score and its parts), whichever writer made the file
NUMERIC_COLUMNS = ("score", "image_score", "ref_score", "coarse", "fine_p", "fine_r", "fine_f", "ref_coarse",
                   "ref_fine_f")
#: columns read as text (``id`` may be a COCO integer ``image_id``)
TEXT_COLUMNS = ("id", "image", "video", "caption", "system", "model", "metric", "error")
ROW_SUFFIXES = (".jsonl", ".csv", ".parquet", ".json")


@dataclass(frozen=True)
class Limits:
    """Bounds on what `capscore report` reads; each refusal is one line naming the file."""

    max_rows: int = 20_000_000  #: score rows kept in one report (8 bytes each)
    max_line_bytes: int = 16 * 2**20  #: one JSONL line or CSV record
    max_json_bytes: int = 256 * 2**20  #: a whole-file JSON (summary, correlate.json, COCO results, card)
    max_png_bytes: int = 64 * 2**20  #: an explain PNG (inlined in the page as it is)
    max_png_pixels: int = 40_000_000  #: width × height of an explain PNG
    max_distributions: int = 10_000  #: distinct (model, metric) and (model, metric, system) in one report
    max_text_chars: int = 1_000  #: a caption or error shown on the page is cut to this length


DEFAULT_LIMITS = Limits()


# ====================================================================================== files
def check_regular(path: Path, *, max_bytes: int | None = None) -> int:
    """Refuse anything but a regular file (FIFO, device, socket; a symlink to one) and, if given, a big one.

    Returns the size. ``os.stat`` follows symlinks and never opens the file, so a FIFO cannot block here.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(str(path), f"cannot read file ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else "a device" if
                stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file")
        raise InputError(str(path), f"is {kind}; capscore report reads regular files only")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputError(str(path), f"is {st.st_size:,} bytes, over the {max_bytes:,}-byte limit for this kind "
                                    "of file")
    return st.st_size


def read_json(path: Path, limits: Limits = DEFAULT_LIMITS):
    """A whole JSON file, after the regular-file and size checks."""
    check_regular(path, max_bytes=limits.max_json_bytes)
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except OSError as e:
        raise InputError(str(path), f"cannot read file ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise InputError(str(path), "not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}", f"malformed JSON ({e.msg})") from None
    except (RecursionError, ValueError) as e:
        raise InputError(str(path), f"unreadable JSON ({json_problem(e)})") from None


def _lines(fb, path: Path, limit: int) -> Iterator[tuple[int, bytes, bool]]:
    """``(line number, bytes, ended with a newline)``; a line over ``limit`` bytes is refused unread."""
    n = 0
    while True:
        raw = fb.readline(limit + 1)
        if not raw:
            return
        n += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise InputError(f"{path}:{n}", f"line longer than {limit:,} bytes; not a capscore output line")
        yield n, raw, raw.endswith(b"\n")


def iter_jsonl_objects(path: Path, limits: Limits = DEFAULT_LIMITS, *, tolerate_cut_last: bool = True
                       ) -> Iterator[tuple[str, dict]]:
    """``("FILE:LINE", object)`` per non-blank line, bounded per line.

    A last line without its newline that does not parse is the line a live (or killed) run was
    writing: it is skipped when ``tolerate_cut_last``. Any other bad line is an :class:`InputError`.
    """
    check_regular(path)
    try:
        fb = open(path, "rb")
    except OSError as e:
        raise InputError(str(path), f"cannot read file ({e.strerror or e})") from None
    with fb:
        for n, raw, ended in _lines(fb, path, limits.max_line_bytes):
            where = f"{path}:{n}"
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError:
                raise InputError(where, "not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError, ValueError) as e:
                if not ended and tolerate_cut_last:
                    return
                what = (f"malformed JSON line ({e.msg}, column {e.colno})" if isinstance(e, json.JSONDecodeError)
                        else f"unreadable JSON line ({json_problem(e)})")
                raise InputError(where, what) from None
            if not isinstance(obj, dict):
                raise InputError(where, "a JSONL line must be an object", got=obj)
            if (problem := surrogate_problem(line, obj)) is not None:
                raise InputError(where, problem)
            yield where, obj


# ====================================================================================== score rows
def is_row_columns(columns) -> bool:
    """Do these columns (field names) make a score-rows file?"""
    cols = set(columns or ())
    return "score" in cols and "caption" in cols and bool(cols & {"image", "video", "image_id"})


def row_file_columns(path: Path, limits: Limits = DEFAULT_LIMITS) -> tuple[str, ...] | None:
    """The columns of a candidate row file, read from its head only (None when it is not one we know).

    Never raises on a file that is simply something else; a FIFO or device is not opened.
    """
    name = path.name.lower()
    if not name.endswith(ROW_SUFFIXES):
        return None
    try:
        check_regular(path)
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            return tuple(pq.read_schema(path).names)
        with open(path, "rb") as fb:
            head = fb.read(min(limits.max_line_bytes, 1 << 20))
        text = head.decode("utf-8-sig", errors="replace")
        if name.endswith(".jsonl"):
            first = text.lstrip().split("\n", 1)[0]
            obj = json.loads(first)
            return tuple(obj) if isinstance(obj, dict) else None
        if name.endswith(".csv"):
            return tuple(next(csv.reader(io.StringIO(text.split("\n", 1)[0]))))
        body = text.lstrip()  # COCO results: [{...}, ...]
        if not body.startswith("["):
            return None
        obj, _ = json.JSONDecoder().raw_decode(body[1:].lstrip())
        return tuple(obj) if isinstance(obj, dict) else None
    except (InputError, OSError, ValueError, StopIteration, IndexError):
        return None
    except Exception as e:  # pyarrow's errors on a file that is not Parquet
        if type(e).__module__.startswith("pyarrow"):
            return None
        raise


def _number(value, column: str, where: str, *, from_text: bool) -> float | None:
    """A numeric cell -> float or None (missing / non-finite); booleans and JSON strings are refused."""
    if value is None:
        return None
    if from_text and isinstance(value, str):
        if value.strip() == "":
            return None
        try:
            v = float(value)
        except ValueError:
            raise InputError(where, f"{column} is not a number", got=value) from None
        return v if math.isfinite(v) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = ("a boolean" if isinstance(value, bool) else "a string" if isinstance(value, str)
                else type(value).__name__)
        raise InputError(where, f"{column} is {kind}, not a number (refusing to read it as one)", got=value)
    v = float(value)
    return v if math.isfinite(v) else None


def _text(value) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else (json.dumps(value) if isinstance(value, (dict, list))
                                                 else str(value))


def clean_row(obj: dict, where: str, *, from_text: bool = False) -> dict:
    """One row with its text columns as str/None and its numeric columns as float/None (strictly)."""
    row = {c: _text(obj.get(c)) for c in TEXT_COLUMNS if c in obj}
    if "id" not in row and "image_id" in obj:
        row["id"] = _text(obj["image_id"])
    for c in NUMERIC_COLUMNS:
        if c in obj:
            row[c] = _number(obj[c], c, where, from_text=from_text)
    return row


def iter_score_rows(path: Path, limits: Limits = DEFAULT_LIMITS) -> Iterator[tuple[str, dict]]:
    """``("FILE:ROW", row)`` for every row of a score-rows file (JSONL, journal, CSV, Parquet, COCO JSON)."""
    name = path.name.lower()
    if name.endswith(".jsonl"):
        for where, obj in iter_jsonl_objects(path, limits):
            yield where, clean_row(obj, where)
    elif name.endswith(".csv"):
        yield from _csv_rows(path, limits)
    elif name.endswith(".parquet"):
        yield from _parquet_rows(path)
    elif name.endswith(".json"):
        data = read_json(path, limits)
        if not isinstance(data, list):
            raise InputError(str(path), "not COCO results", expected="[{image_id, caption, score, ...}]", got=data)
        for n, obj in enumerate(data, 1):
            where = f"{path}:row {n}"
            if not isinstance(obj, dict):
                raise InputError(where, "a COCO result must be an object", got=obj)
            yield where, clean_row(obj, where)
    else:
        raise InputError(str(path), "not a score-rows file", expected="a .jsonl, .csv, .parquet or .json file")


def _csv_rows(path: Path, limits: Limits) -> Iterator[tuple[str, dict]]:
    check_regular(path)
    try:
        fb = open(path, "rb")
    except OSError as e:
        raise InputError(str(path), f"cannot read file ({e.strerror or e})") from None

    def text_lines():
        for n, raw, _ in _lines(fb, path, limits.max_line_bytes):
            try:
                yield raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{path}:{n}", "not UTF-8 text") from None

    with fb:
        reader = csv.DictReader(text_lines())
        try:
            if not reader.fieldnames:  # reads the header, so record line numbers start after it
                return
        except csv.Error as e:
            raise InputError(f"{path}:1", csv_problem(e)) from None
        while True:
            start = reader.line_num + 1
            try:
                rec = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise InputError(f"{path}:{start}", csv_problem(e)) from None
            where = f"{path}:{start}"
            if None in rec or None in rec.values():
                raise InputError(where, "a CSV record with a different number of fields than the header",
                                 expected=",".join(reader.fieldnames or ()))
            row = clean_row(rec, where, from_text=True)
            if row.get("error") == "":
                row["error"] = None
            yield where, row


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq

    check_regular(path)
    wanted = set(TEXT_COLUMNS) | set(NUMERIC_COLUMNS) | {"image_id"}
    n = 0
    try:
        f = pq.ParquetFile(path)
        cols = [c for c in f.schema_arrow.names if c in wanted]
        for batch in f.iter_batches(batch_size=4096, columns=cols):
            for obj in batch.to_pylist():
                n += 1
                where = f"{path}:row {n}"
                yield where, clean_row(obj, where)
    except InputError:
        raise
    except Exception as e:  # pyarrow.lib.ArrowInvalid, OSError, ... on a corrupt or foreign file
        if isinstance(e, (OSError, ValueError)) or type(e).__module__.startswith("pyarrow"):
            raise InputError(f"{path}:row {n + 1}", f"unreadable Parquet ({' '.join(str(e).split())[:200]})"
                             ) from None
        raise
