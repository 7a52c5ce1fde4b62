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

Files are read record batch by record batch (``pyarrow``), so memory is bounded
by one batch, not the file. A folder means every ``*.parquet`` below it,
sorted; each file is one shard. A missing column is an error naming the file
and the columns it has; a bad row is a :class:`BadItem` named ``file:id``.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from capscore._optional import require
from capscore.data.captions import BadItem
from capscore.data.records import Record
from capscore.data.shards import SourceOptions, expect_files
from capscore.embed.images import ImageRef
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
    try:
        f = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for anything that is not Parquet
        raise InputError(path, f"not a readable Parquet file ({str(e).splitlines()[0]})") from None
    cols = columns_for(path, f.schema_arrow.names, options)
    want = [c for c in dict.fromkeys(cols.values()) if c]
    return items_from_batches(f.iter_batches(batch_size=BATCH_ROWS, columns=want), cols, path=path, name=name)


def items_from_batches(batches: Iterable, cols: dict, *, path: str, name: str) -> Iterator:
    """Arrow record batches -> Record/BadItem, one per row (shared by Parquet and HF Arrow files)."""
    base = Path(path).parent
    row = 0
    for batch in batches:
        data = {k: batch.column(c).to_pylist() for k, c in cols.items() if c}
        for j in range(batch.num_rows):
            ident = str(data["id"][j]) if "id" in data and data["id"][j] is not None else f"{name}:{row}"
            yield _item(ident, data["image"][j], data["caption"][j], data["refs"][j] if "refs" in data else None,
                        path=path, base=base)
            row += 1


def _item(ident: str, image, caption, refs, *, path: str, base: Path):
    where = f"{path}:{ident}"
    if isinstance(image, dict):  # {bytes, path}: HF Image feature
        image = image.get("bytes") or image.get("path")
    if isinstance(image, (bytes, bytearray)):
        ref = ImageRef(name=where, data=bytes(image))
    elif isinstance(image, str) and image:
        p = Path(image).expanduser()
        ref = ImageRef(path=p if p.is_absolute() else base / p, name=f"{where}: image {image}")
    else:
        return BadItem(ident, where, str(caption or ""), "", where, "no image (null or empty image cell)")
    if not isinstance(caption, str):
        return BadItem(ident, where, "", "", where, f"caption is not a string; got {type(caption).__name__}")
    if refs is not None and not (isinstance(refs, list) and all(isinstance(r, str) for r in refs)):
        return BadItem(ident, where, caption, "", where, "references are not a list of strings")
    return Record(ident, ref, caption, tuple(refs or ()), "", where)
