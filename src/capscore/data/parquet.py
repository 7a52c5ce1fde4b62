"""Parquet inputs: one row per caption, the image as bytes or as a path (column names configurable).

Columns (see :class:`~capscore.data.shards.SourceOptions`):

* image (``--image-column``, default ``image``): binary bytes of an encoded
  image, a ``{bytes, path}`` struct (how Hugging Face ``datasets`` stores its
  ``Image`` feature), or a string path, relative to the Parquet file's folder;
* caption (``--caption-column``): default ``caption``, or ``text`` when the
  file has no ``caption`` column;
* id (``--id-column``): default ``key`` (img2dataset's column), then ``id``;
  without either, ``FILE_STEM:ROW``;
* references (``--refs-column``): a list of strings, for RefCLIP-S/RefPAC-S.

Files are read row group by row group and record batch by record batch
(``pyarrow``), so memory is bounded by one batch, not the file. A folder means
every ``*.parquet`` below it, sorted; each file is one shard. A missing column is
an error naming the file and the columns it has; a bad row is a :class:`BadItem`
named ``file:id``.

Bounds, checked before anything is materialised: a row group whose columns
declare more than ``8 × max_member_bytes`` (2 GiB by default) uncompressed is
not read (one error row naming ``file:row-group``); an image cell over
``max_member_bytes`` (256 MiB) is an error row; an image *path* is only opened
if it names a regular file (``/dev/zero`` or a FIFO would never end or block;
:meth:`~capscore.data.images.ImageRef.read` refuses them). A corrupt page stops
the file with one error naming it and the row reached (an error row under
``--skip-bad``, and the next shard is read).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from capscore._optional import require
from capscore.data.captions import BadItem
from capscore.data.records import Record
from capscore.data.shard_options import SourceOptions, expect_files
from capscore.data.images import ImageRef
from capscore.errors import InputError

BATCH_ROWS = 1024


def list_parquet_files(spec: str) -> list[str]:
    p = Path(spec).expanduser()
    if p.is_dir():
        return expect_files(sorted(str(f) for f in p.rglob("*.parquet")), spec, "*.parquet files in the folder")
    return expect_files([str(p)], spec, "Parquet file")


def columns_for(path: str, names: list[str], options: SourceOptions) -> dict[str, str | None]:
    """Resolve the configured column names against a file's columns; InputError if one is missing."""
    have = set(names)

    def need(col: str, flag: str) -> str:
        if col not in have:
            raise InputError(path, f"no column {col!r} (set it with {flag}); columns are {sorted(have)}")
        return col

    caption = options.caption_column or ("caption" if "caption" in have or "text" not in have else "text")
    ident = options.id_column or next((c for c in ("key", "id") if c in have), None)
    return {
        "image": need(options.image_column, "--image-column"),
        "caption": need(caption, "--caption-column"),
        "id": need(ident, "--id-column") if ident else None,
        "refs": need(options.refs_key, "--refs-column") if options.refs_key else None,
    }


def read_parquet_file(path: str, *, name: str, options: SourceOptions = SourceOptions()) -> Iterator:
    pq = require("pyarrow.parquet", purpose="reading Parquet")

    if not os.path.isfile(path):  # a FIFO or a device would block or never end
        raise InputError(path, "not a regular file (expected a .parquet file)")
    try:
        f = pq.ParquetFile(path)
        names = f.schema_arrow.names
    except Exception as e:  # noqa: BLE001  (pyarrow raises ArrowInvalid/OSError/... for anything not Parquet)
        raise InputError(path, f"not a readable Parquet file ({_first_line(e)})") from None
    cols = columns_for(path, names, options)
    want = [c for c in dict.fromkeys(cols.values()) if c]
    group_limit = 8 * options.max_member_bytes

    def batches():
        row = 0
        for g in range(f.num_row_groups):
            try:
                meta = f.metadata.row_group(g)
                declared = sum(meta.column(j).total_uncompressed_size for j in range(meta.num_columns)
                               if meta.column(j).path_in_schema.split(".")[0] in want)
            except Exception as e:  # noqa: BLE001  (corrupt metadata: pyarrow raises several types)
                raise InputError(path, f"corrupt Parquet metadata in row group {g} ({_first_line(e)})") from None
            if declared > group_limit:
                yield _Skip(g, row, meta.num_rows, f"row group {g} (rows {row}-{row + meta.num_rows - 1}) declares "
                                                   f"{declared:,} bytes uncompressed, over the {group_limit:,}-byte "
                                                   "limit (8 x max_member_bytes); not read")
                row += meta.num_rows
                continue
            try:
                for b in f.iter_batches(batch_size=BATCH_ROWS, columns=want, row_groups=[g]):
                    yield b
                    row += b.num_rows
            except Exception as e:  # noqa: BLE001  (a corrupt page: OSError/ArrowInvalid/ArrowException...)
                raise InputError(path, f"corrupt Parquet data in row group {g} after row {row} "
                                       f"({_first_line(e)})") from None

    return items_from_batches(batches(), cols, path=path, name=name, max_cell=options.max_member_bytes)


class _Skip:
    """A block of rows that is not read (over a declared-size bound): one error row names it."""

    def __init__(self, group: int, row: int, num_rows: int, why: str):
        self.group, self.row, self.num_rows, self.why = group, row, num_rows, why


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def items_from_batches(batches: Iterable, cols: dict, *, path: str, name: str,
                       max_cell: int = SourceOptions.max_member_bytes) -> Iterator:
    """Arrow record batches -> Record/BadItem, one per row (shared by Parquet and HF Arrow files)."""
    base = Path(path).parent
    row = 0
    seen: dict[str, int] = {}  # an id column's value -> its row (one set per file, as for caption files)
    for batch in batches:
        if isinstance(batch, _Skip):
            where = f"{path}:row-group-{batch.group}"
            yield BadItem(f"{name}:row-group-{batch.group}", path, "", "", where, batch.why)
            row += batch.num_rows
            continue
        try:
            data = {k: batch.column(c).to_pylist() for k, c in cols.items() if c}
        except ValueError as e:  # e.g. a string column holding bytes that are not UTF-8 (UnicodeDecodeError)
            raise InputError(path, f"unreadable values after row {row} ({_first_line(e)})") from None
        for j in range(batch.num_rows):
            ident = str(data["id"][j]) if "id" in data and data["id"][j] is not None else f"{name}:{row}"
            if "id" in data and ident in seen:  # two rows with one id: two output rows no one can tell apart
                yield BadItem(ident, f"{path}:{ident}", "", "", f"{path}:row-{row}",
                              f"duplicate id {ident!r} (also at row {seen[ident]})")
            else:
                if "id" in data:  # FILE:ROW ids are unique by construction
                    seen[ident] = row
                yield _item(ident, data["image"][j], data["caption"][j], data["refs"][j] if "refs" in data else None,
                            path=path, base=base, max_cell=max_cell)
            row += 1


def _describe_cell(image) -> str | None:
    """Why an image cell holds no image (None when it does), naming what it holds."""
    if image is None:
        return "no image (null image cell)"
    if isinstance(image, (bytes, bytearray, str)) and not image:
        return "no image (empty image cell)"
    if isinstance(image, (bytes, bytearray, str)):
        return None
    if isinstance(image, dict):
        return (f"image struct has neither non-empty 'bytes' nor 'path' (fields: {sorted(image)[:10]}); "
                "expected an HF Image {bytes, path} struct")
    kind = "a list" if isinstance(image, list) else f"a {type(image).__name__}"
    return f"image cell is {kind}; expected bytes, a {{bytes, path}} struct or a path string"


def _item(ident: str, image, caption, refs, *, path: str, base: Path,
          max_cell: int = SourceOptions.max_member_bytes):
    where = f"{path}:{ident}"
    if isinstance(image, dict) and (image.get("bytes") or image.get("path")):  # {bytes, path}: HF Image feature
        image = image.get("bytes") or image.get("path")
    problem = _describe_cell(image)
    if problem is not None:
        return BadItem(ident, where, caption if isinstance(caption, str) else "", "", where, problem)
    if isinstance(image, (bytes, bytearray)):
        if len(image) > max_cell:
            return BadItem(ident, where, "", "", where, f"image cell holds {len(image):,} bytes, over the "
                                                        f"{max_cell:,}-byte limit (max_member_bytes)")
        ref = ImageRef(name=where, data=bytes(image))
    else:
        try:
            p = Path(image).expanduser()
        except RuntimeError:  # ~user that does not exist
            p = Path(image)
        ref = ImageRef(path=p if p.is_absolute() else base / p, name=f"{where}: image {image}")
    if not isinstance(caption, str):
        return BadItem(ident, where, "", "", where, f"caption is not a string; got {type(caption).__name__}")
    if refs is not None and not (isinstance(refs, list) and all(isinstance(r, str) for r in refs)):
        return BadItem(ident, where, caption, "", where, "references are not a list of strings")
    return Record(ident, ref, caption, tuple(refs or ()), "", where)
