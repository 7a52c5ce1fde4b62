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
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
import hashlib
import shutil
import uuid

from capscore._optional import require
from capscore.errors import CapscoreError, InputError
from capscore.report.outputs import output_file

#: ``model`` and ``metric`` record in every row what produced its score, so ``--resume`` can refuse to
#: mix metrics or models even when the summary file next to the output was lost.
COLUMNS = ("id", "image", "caption", "system", "model", "metric", "score", "error")
# `capscore score --videos`: the final score and its parts (EMScore/PAC-S coarse, fine P/R/F, reference side)
VIDEO_COLUMNS = ("id", "video", "caption", "system", "score", "coarse", "fine_p", "fine_r", "fine_f",
                 "ref_coarse", "ref_fine_f", "error")
# the rest are numbers; ``stats``: a classic metric's per-item statistics, space-separated (classic_stats.stats_text)
TEXT_COLUMNS = frozenset(("id", "image", "video", "caption", "system", "model", "metric", "error", "stats"))
FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet", ".json": "json"}
JOURNALED = ("parquet", "json")  # whole-file formats: rows go to a JSONL journal until the run ends


def output_format(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputError(str(path), f"unsupported output format {suffix or '(no suffix)'!r}",
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
    if "model" in row:  # a text-only metric's rows name no model: CSV writes None as ""
        row["model"] = row["model"] or None
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
            import fcntl  # noqa: PLC0415  (deferred: POSIX only)
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


_SURROGATE = re.compile("[\ud800-\udfff]")


def _writable(value):
    """A cell as UTF-8 can hold it: a string's lone surrogates (an id or file name that was not text, kept
    in an error row) become U+FFFD; anything else unchanged."""
    if isinstance(value, str) and _SURROGATE.search(value):
        return _SURROGATE.sub("\ufffd", value)
    return value


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
            cells = {c: _writable(row.get(c)) for c in self.columns}
            if self._csv is not None:
                self._csv.writerow(["" if v is None else v for v in cells.values()])
            else:
                self._f.write(json.dumps(cells, ensure_ascii=False) + "\n")
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
    schema = arrow_schema(columns)
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


# ------------------------------------------------------------------------------ a folder of shard files
SIDECAR_DIR = "_shards"
PARTS_DIR = "parts"  # DIR/_shards/parts/<name>/: a shard's rows until its commit
JOURNAL = "journal.jsonl"  # the single-process engine's rows of one shard in progress (in its parts folder)
JOURNAL_INPUT = "input.json"  # beside it: the shard's size and mtime when the journal was begun


def shard_output_name(path: str | os.PathLike) -> str:
    """``<stem>-<first 8 hex digits of sha1(absolute path)>``: a function of the shard alone, never of the
    other shards of the run (``shards/00000.tar`` -> ``00000-3f2a…``; ``a/x.tar`` and ``b/x.tar`` differ)."""
    path = os.path.abspath(path)
    stem = Path(path).name.split(".")[0] or "shard"
    return f"{stem}-{hashlib.sha1(os.fsencode(path)).hexdigest()[:8]}"


def output_names(paths: Iterable) -> list[str]:
    """Each shard's output name (:func:`shard_output_name`); the k-th time (k ≥ 2) the same file is listed,
    ``~k`` is added, so a shard given twice gives two files of the same rows, as one file would hold them
    twice."""
    seen: dict[str, int] = {}
    names = []
    for p in paths:
        base = shard_output_name(p)
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}~{seen[base]}")
    return names


def part_name(model: int, metric: int, first: int, n: int, fmt: str) -> str:
    """``m<model>-k<metric>-<first position>-<rows>.<fmt>``: a block scored again writes the same name."""
    return f"m{model}-k{metric}-{first:012d}-{n}.{fmt}"


def parse_part(name: str) -> tuple[int, int, int, int] | None:
    stem, _, _ = name.partition(".")
    try:
        m, k, first, n = stem.split("-")
        return int(m[1:]), int(k[1:]), int(first), int(n)
    except ValueError:
        return None


def arrow_schema(columns: tuple):
    pa = require("pyarrow", purpose="a .parquet output")
    return pa.schema([(c, pa.string() if c in TEXT_COLUMNS else pa.float64()) for c in columns])


def write_part(path: Path, rows: list[dict], fmt: str, columns: tuple) -> None:
    """Write one block's ``rows`` to ``path`` atomically (a unique temporary name, then a rename): the same
    block written twice gives the same file. JSONL/CSV parts are written by :class:`RowWriter` (CSV without
    a header: the commit adds one). Parquet parts are not fsynced: an uncommitted shard's parts are redone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if fmt == "parquet":
            pa, pq = require("pyarrow", purpose="a .parquet output"), require("pyarrow.parquet", purpose="Parquet")
            pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(columns)), tmp)
        else:
            w = RowWriter(tmp, fmt, existing=True, columns=columns)  # existing: no CSV header in a part
            w.write(rows)
            w.close(complete=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as JSON atomically (a temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # a lone surrogate (a path given on the command line that is not UTF-8) is written as its JSON escape,
    # so the summary reads back to the same string (resume compares paths)
    tmp.write_bytes((json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8", errors="backslashreplace"))
    os.replace(tmp, path)


def load_json(path: Path):
    """The JSON in ``path``, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def count_rows(path: Path) -> int:
    """Complete rows in a row file (raises when it is unreadable)."""
    if path.suffix == ".parquet":
        pq = require("pyarrow.parquet", purpose="reading Parquet")
        return pq.ParquetFile(path).metadata.num_rows
    with open(path, encoding="utf-8", newline="") as f:
        if path.suffix == ".csv":
            return sum(1 for _ in csv.DictReader(f))
        return sum(1 for line in f if line.strip() and json.loads(line) is not None)


class ShardFiles:
    """The files of a folder output (the layout both engines write; see :mod:`capscore.pipeline`):

    ``DIR/<name>.<fmt>`` (a shard's rows), ``DIR/_shards/<name>.json`` (its sidecar: settings, input
    fingerprint, file, row count, per-(model, metric) totals), ``DIR/_shards/parts/<name>/`` (its rows until
    the commit), ``DIR/_summary.json`` and the lock ``DIR/_run.lock``. File mechanics only: what the
    sidecars mean is the run protocol's business.
    """

    def __init__(self, out: Path, fmt: str):
        self.out, self.fmt = Path(out), fmt

    @property
    def summary(self) -> Path:
        return self.out / "_summary.json"

    def path(self, name: str) -> Path:
        return self.out / f"{name}.{self.fmt}"

    def sidecar(self, name: str) -> Path:
        return self.out / SIDECAR_DIR / f"{name}.json"

    def parts(self, name: str) -> Path:
        return self.out / SIDECAR_DIR / PARTS_DIR / name

    def existing(self) -> dict[str, Path]:
        """Sidecars in the folder, by output name."""
        if not self.out.is_dir():
            return {}
        return {p.name[: -len(".json")]: p for p in sorted(self.out.glob(f"{SIDECAR_DIR}/*.json"))}

    def remove(self, name: str) -> None:
        """The output of ``name``: its file (and the one its sidecar names, if in this folder), sidecar, parts."""
        meta = load_json(self.sidecar(name))
        files = {self.path(name)}
        if isinstance(meta, dict) and isinstance(meta.get("file"), str):
            files.add(self.out / meta["file"])
        for q in files:
            if q.parent == self.out and q.is_file():
                q.unlink()
        self.sidecar(name).unlink(missing_ok=True)
        shutil.rmtree(self.parts(name), ignore_errors=True)

    def clear(self) -> None:
        for name in self.existing():
            self.remove(name)
        shutil.rmtree(self.out / SIDECAR_DIR / PARTS_DIR, ignore_errors=True)

    def clear_leftovers(self, *, keep_journals: bool = False) -> None:
        """Parts of an interrupted run (its single-process journals too, unless ``keep_journals``) and the
        temporaries of a commit killed mid-write."""
        root = self.out / SIDECAR_DIR / PARTS_DIR
        for folder in sorted(root.iterdir()) if root.is_dir() else ():
            if keep_journals and (folder / JOURNAL).is_file():
                for p in folder.iterdir():
                    if p.name not in (JOURNAL, JOURNAL_INPUT):
                        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            elif folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)
            else:
                folder.unlink(missing_ok=True)
        for p in [*self.out.glob(".*.tmp"), *self.out.glob(f"{SIDECAR_DIR}/*.json.tmp")]:
            p.unlink(missing_ok=True)

    def complete(self, name: str, meta: dict) -> bool:
        """Whether ``name``'s file is the one its sidecar ``meta`` names, with that many rows."""
        if meta.get("file") != self.path(name).name:
            return False
        try:
            return count_rows(self.path(name)) == meta.get("rows")
        except Exception:  # unreadable, missing or half-written: redo it
            return False

    def commit(self, name: str, meta: dict, columns: tuple, *, parts: list[Path] | None = None,
               journal: Path | None = None) -> dict:
        """Make ``DIR/<name>.<fmt>`` from the shard's rows — block ``parts`` in this format, in order, or one
        JSONL ``journal`` — sidecar first (it names the file and its row count), then the file (temporary
        name, fsync, rename), then the parts folder is removed. Returns ``meta``."""
        write_json(self.sidecar(name), meta)
        tmp = self.out / f".{name}.{self.fmt}.tmp"
        if journal is not None:
            {"parquet": _journal_to_parquet, "csv": _journal_to_csv, "jsonl": _journal_copy}[self.fmt](
                journal, tmp, columns)
        elif self.fmt == "parquet":
            pq = require("pyarrow.parquet", purpose="a .parquet output")
            schema = arrow_schema(columns)
            with pq.ParquetWriter(tmp, schema) as w:
                for p in parts or ():
                    w.write_table(pq.read_table(p, schema=schema))
                if not parts:
                    w.write_table(schema.empty_table())
        else:
            with open(tmp, "wb") as f:
                if self.fmt == "csv":
                    head = io.StringIO()
                    csv.writer(head, lineterminator="\n").writerow(columns)
                    f.write(head.getvalue().encode("utf-8"))
                for p in parts or ():
                    with open(p, "rb") as part:
                        shutil.copyfileobj(part, f, 1 << 20)
        _fsync(tmp)
        os.replace(tmp, self.path(name))
        shutil.rmtree(self.parts(name), ignore_errors=True)
        return meta


def _journal_copy(journal: Path, out: Path, columns: tuple[str, ...] = COLUMNS) -> None:
    shutil.copyfile(journal, out)


def _journal_to_csv(journal: Path, out: Path, columns: tuple[str, ...] = COLUMNS) -> None:
    w = RowWriter(out, "csv", existing=False, columns=columns)
    w.write(read_rows(journal, columns))
    w.close(complete=True)
