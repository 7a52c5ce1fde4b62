"""Per-item result writers (JSONL, CSV, Parquet) that survive being killed, and resume.

Rows have the columns of :data:`COLUMNS`, plus any extra columns the caller
names (``columns=``: ``model`` for several models, ``image_score``/``ref_score``
for RefCLIP-S/RefPAC-S). Rows are appended chunk by chunk and
flushed (and ``fsync``-ed) after each chunk, so a killed run keeps every chunk
it finished; at most the last line can be cut short.

* JSONL: one JSON object per line. A last line without its newline, or one
  that does not parse, is cut off when resuming.
* CSV: ``csv`` module, header first, ``\\n`` line ends, fields quoted when
  needed (a caption may contain newlines). A record is complete when it ends
  with a newline outside quotes (an even number of ``"`` so far) and has all
  columns; anything after the last complete record is cut off when resuming.
  ``score``/``error`` cells are empty for "none".
* One writer per output: a second process writing or resuming the same file
  gets an error at once (an ``fcntl.flock`` on ``OUT.lock``, removed when done).
* Parquet cannot be appended to, and a half-written file is unreadable. Rows
  go to a journal ``OUT.parquet.partial.jsonl`` (the JSONL rules above); when
  the run finishes, the journal is converted to ``OUT.parquet`` (written to a
  temporary name, then renamed) and deleted. ``--resume`` continues the
  journal; an existing complete ``OUT.parquet`` is read back as-is.
* JSON (``.json``) is the COCO results format, ``[{"image_id", "caption",
  "score", ...}]``: one array, so it is journaled and converted like Parquet.
  ``image_id`` is the item id (an integer when it is one; a ``#k`` candidate
  suffix is dropped).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from capscore._optional import require
from capscore.errors import CapscoreError, InputError
from capscore.report.outputs import output_file

#: ``model`` and ``metric`` record in every row what produced its score, so ``--resume`` can refuse to
#: mix metrics or models even when the summary file next to the output was lost.
COLUMNS = ("id", "image", "caption", "system", "model", "metric", "score", "error")
# `capscore score --videos`: the final score and its parts (EMScore/PAC-S coarse, fine P/R/F, reference side)
VIDEO_COLUMNS = ("id", "video", "caption", "system", "score", "coarse", "fine_p", "fine_r", "fine_f",
                 "ref_coarse", "ref_fine_f", "error")
TEXT_COLUMNS = frozenset(("id", "image", "video", "caption", "system", "model", "metric", "error"))  # the rest are numbers
FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet", ".json": "json"}
JOURNALED = ("parquet", "json")  # whole-file formats: rows go to a JSONL journal until the run ends


def output_format(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputError(str(path), f"unsupported --out format {suffix or '(no suffix)'!r}",
                         expected="a .jsonl, .csv, .parquet or .json (COCO results) file")
    if FORMATS[suffix] == "parquet":  # fail before scoring, not when the finished run is converted
        require("pyarrow.parquet", purpose=f"{Path(path).name} (a .parquet file)")
    return FORMATS[suffix]


def journal_path(path: Path) -> Path:
    """Where rows go while a Parquet output is being written."""
    return path.with_name(path.name + ".partial.jsonl")


# ------------------------------------------------------------------------------ repair (pure on bytes)
def complete_jsonl_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` made of complete, parseable JSONL lines."""
    end = 0
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return end
        line = data[pos:nl].strip()
        if line:
            try:
                json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return end
        end = pos = nl + 1


def complete_csv_prefix(data: bytes, n_columns: int = len(COLUMNS)) -> int:
    """Length of the longest prefix of ``data`` made of complete CSV records of ``n_columns`` fields.

    A record ends at a ``\\n`` outside quotes (``"`` count even so far, as the
    csv module doubles quotes inside quoted fields).
    """
    end = 0
    start = 0
    quotes = 0
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return end
        quotes += data.count(b'"', pos, nl)
        pos = nl + 1
        if quotes % 2:
            continue  # newline inside a quoted field
        record = data[start:pos]
        try:
            fields = next(csv.reader(io.StringIO(record.decode("utf-8"), newline="")))
        except (csv.Error, UnicodeDecodeError, StopIteration):
            return end
        if len(fields) != n_columns:
            return end
        end = start = pos


# ------------------------------------------------------------------------------ reading rows back
def _row_from_json(obj: dict, where: str, columns: tuple = COLUMNS) -> dict:
    if not isinstance(obj, dict) or any(c not in obj for c in columns):
        raise InputError(where, "not a capscore result row", expected=f"fields {', '.join(columns)}", got=obj)
    return {c: obj[c] for c in columns}


def _row_from_csv(fields: dict, where: str) -> dict:
    row = dict(fields)
    for c in row:
        if c in TEXT_COLUMNS:
            continue
        try:
            row[c] = float(row[c]) if row[c] not in ("", None) else None
        except ValueError:
            raise InputError(where, f"{c} is not a number", got=row[c]) from None
    row["error"] = row["error"] or None
    return row


def read_rows(path: str | os.PathLike, columns: tuple[str, ...] = COLUMNS) -> Iterator[dict]:
    """Lazily read the complete rows of a result file (JSONL, CSV, Parquet, COCO JSON, or a journal)."""
    path = Path(path)
    fmt = "jsonl" if path.name.endswith(".partial.jsonl") else output_format(path)
    if fmt == "json":
        with open(path, encoding="utf-8") as f:
            for n, obj in enumerate(json.load(f), 1):
                yield {c: (obj.get("id", obj.get("image_id")) if c == "id" else obj.get(c)) for c in columns}
        return
    if fmt == "parquet":
        pq = require("pyarrow.parquet", purpose="reading Parquet")
        for batch in pq.ParquetFile(path).iter_batches(batch_size=8192):
            for row in batch.to_pylist():
                yield {c: row.get(c) for c in columns}
        return
    # streamed as-is: open_writer's repair step has already cut an incomplete last record off
    with open(path, encoding="utf-8", newline="") as f:
        if fmt == "jsonl":
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield _row_from_json(json.loads(line), f"{path}:{n}", columns)
        else:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != tuple(columns):
                raise InputError(f"{path}:1", "not a capscore result file (or one with other columns)",
                                 expected=",".join(columns),
                                 got=reader.fieldnames)
            for row in reader:
                yield _row_from_csv(row, f"{path}:{reader.line_num}")


# ------------------------------------------------------------------------------ writers
class OutputLock:
    """An exclusive, non-blocking OS lock on ``OUT.lock`` for as long as one process writes ``OUT``.

    ``fcntl.flock`` is released by the kernel when the process dies (kill -9
    included), so a stale lock file never blocks a later ``--resume``. The
    file is removed on release; a process that opened the old file just before
    it was removed notices (the path no longer names the file it locked) and
    tries again. Where ``fcntl`` does not exist (Windows) there is no lock.
    """

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + ".lock")
        self._fd: int | None = None
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return
        for _ in range(20):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise CapscoreError(f"--out {path}: cannot write in {path.parent} ({e.strerror or e})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise CapscoreError(f"{path} is being written by another capscore process (it holds {self.path}); "
                                    "wait for it to finish, then --resume if needed") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return
            os.close(fd)  # the holder removed it between our open and our lock: take the new one
        raise CapscoreError(f"{path}: could not take the lock {self.path}")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None


class RowWriter:
    """Append rows to ``path``; ``close()`` finishes the file. Use :func:`open_writer`.

    ``run`` fills the ``model`` and ``metric`` columns of rows that do not carry them.
    """

    def __init__(self, path: Path, fmt: str, *, existing: bool, columns: tuple[str, ...] = COLUMNS,
                 run: dict | None = None, lock: "OutputLock | None" = None):
        self.path = path
        self.columns = tuple(columns)
        self.format = fmt
        self.run = dict(run or {})
        self.file_path = journal_path(path) if fmt in JOURNALED else path
        self._lock = lock
        self._existing = existing
        self.rows_written = 0
        self._f = open(self.file_path, "a", encoding="utf-8", newline="")
        self._csv = csv.writer(self._f, lineterminator="\n") if fmt == "csv" else None
        if self._csv is not None and not existing:
            self._csv.writerow(self.columns)
            self._flush()

    def write(self, rows: Iterable[dict]) -> None:
        """Append rows and flush them to disk (call once per chunk)."""
        for row in rows:
            row = {**{c: self.run.get(c) for c in ("model", "metric")}, **row}
            self.rows_written += 1
            score = row["score"]
            if score is not None and not math.isfinite(score):
                raise ValueError(f"non-finite score in row {row['id']!r}")  # a bug, never user input
            if self._csv is not None:
                self._csv.writerow(["" if row.get(c) is None else row[c] for c in self.columns])
            else:
                self._f.write(json.dumps({c: row.get(c) for c in self.columns}, ensure_ascii=False) + "\n")
        self._flush()

    def _flush(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self, *, complete: bool = True) -> None:
        """Close; for Parquet and ``complete``, convert the journal and delete it.

        An incomplete run that wrote no row into a file it created removes the
        file again: a failed first run leaves no empty or header-only output.
        """
        if self._f.closed:
            return
        self._f.close()
        try:
            if self.format in JOURNALED and complete:
                convert = _journal_to_parquet if self.format == "parquet" else _journal_to_coco
                convert(self.file_path, self.path, self.columns)
                self.file_path.unlink()
            elif not complete and not self._existing and self.rows_written == 0:
                self.file_path.unlink(missing_ok=True)
        finally:
            if self._lock is not None:
                self._lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(complete=exc[0] is None)


def coco_image_id(item_id: str):
    """A row id -> COCO ``image_id``: the part before a ``#k`` candidate suffix, an int when it is one."""
    head = str(item_id).split("#", 1)[0]
    return int(head) if head.isdigit() else head


def _journal_to_coco(journal: Path, out: Path, columns: tuple[str, ...] = COLUMNS) -> None:
    """COCO results: ``[{"image_id", "caption", "score", ...}]`` (every row column kept, ``id`` too)."""
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("[")
        for n, row in enumerate(read_rows(journal, columns)):
            obj = {"image_id": coco_image_id(row["id"]), **row}
            f.write(("," if n else "") + "\n" + json.dumps(obj, ensure_ascii=False))
        f.write("\n]\n")
    os.replace(tmp, out)


def _journal_to_parquet(journal: Path, out: Path, columns: tuple[str, ...] = COLUMNS, batch: int = 65536) -> None:
    pa, pq = require("pyarrow", purpose="a .parquet output"), require("pyarrow.parquet", purpose="a .parquet output")
    schema = pa.schema([(c, pa.string() if c in TEXT_COLUMNS else pa.float64()) for c in columns])
    tmp = out.with_name(out.name + ".tmp")
    with pq.ParquetWriter(tmp, schema) as w:
        rows: list[dict] = []
        for row in read_rows(journal, columns):
            rows.append(row)
            if len(rows) >= batch:
                w.write_table(pa.Table.from_pylist(rows, schema=schema))
                rows = []
        w.write_table(pa.Table.from_pylist(rows, schema=schema))
    os.replace(tmp, out)


def existing_output(path: Path) -> Path | None:
    """The file holding rows of an earlier run at ``path`` (journal first), or None when there is none."""
    if output_format(path) in JOURNALED:
        j = journal_path(path)
        if j.exists():
            return j
    if path.exists() and path.stat().st_size > 0:
        return path
    return None


def repair(path: Path, columns: tuple[str, ...] = COLUMNS) -> int:
    """Cut a partial last record off a JSONL/CSV/journal file; returns the number of bytes removed."""
    data = path.read_bytes()
    if path.suffix.lower() == ".csv":
        header_end = data.find(b"\n") + 1
        if header_end and data[:header_end].decode("utf-8", "replace").strip() != ",".join(columns):
            raise InputError(f"{path}:1", "not a capscore result file with these columns; refusing to cut it",
                             expected=",".join(columns), got=data[:header_end].decode("utf-8", "replace").strip())
        keep = header_end + complete_csv_prefix(data[header_end:], len(columns)) if header_end else 0
    else:
        keep = complete_jsonl_prefix(data)
        first = data[: data.find(b"\n")] if keep else b""
        if first.strip():
            _row_from_json(json.loads(first), f"{path}:1", columns)  # raises on a file that is not ours
    if keep < len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
    return len(data) - keep


def open_writer(path: str | os.PathLike, *, resume: bool = False, overwrite: bool = False,
                run: dict | None = None, columns: tuple[str, ...] = COLUMNS) -> tuple[RowWriter | None, Path | None]:
    """Prepare ``path`` for writing; returns ``(writer, file with earlier rows or None)``.

    Without ``resume``, an existing non-empty output is refused unless
    ``overwrite``. With ``resume``, a partial last record is cut off and the
    earlier rows are returned for the caller to skip (read them with
    :func:`read_rows` *before* writing). A finished Parquet file cannot be
    appended: the writer is None and the caller only reads it back.
    """
    path = Path(path)
    fmt = output_format(path)
    path = output_file(path, "--out", what="a .jsonl, .csv or .parquet file")
    lock = OutputLock(path)
    try:
        writer, prior = _open_locked(path, fmt, resume=resume, overwrite=overwrite, run=run, lock=lock,
                                     columns=columns)
    except BaseException:
        lock.release()
        raise
    if writer is None:
        lock.release()
    return writer, prior


def _open_locked(path: Path, fmt: str, *, resume: bool, overwrite: bool, run: dict | None, lock: OutputLock,
                 columns: tuple):
    prior = existing_output(path)
    if prior is not None and not resume:
        if not overwrite:
            raise CapscoreError(f"{prior} already exists and is not empty; "
                                "use --resume to continue that run or --overwrite to replace it")
        prior.unlink()
        if fmt in JOURNALED and path.exists():
            path.unlink()
        prior = None
    path.parent.mkdir(parents=True, exist_ok=True)
    if prior is not None and prior == path and fmt in JOURNALED:
        return None, prior  # finished: nothing to append
    if prior is not None:
        repair(prior, columns)
        if prior.suffix.lower() == ".csv" and prior.stat().st_size == 0:
            prior = None  # even the header was cut short: start again
    return RowWriter(path, fmt, existing=prior is not None, columns=columns, run=run, lock=lock), prior
