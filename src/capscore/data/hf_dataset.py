"""A Hugging Face ``datasets`` dataset saved with ``save_to_disk`` (an ``Image`` feature + a text column).

``datasets.load_from_disk`` opens the folder (a ``Dataset`` or a
``DatasetDict``; ``--split`` picks one, and may be left out when there is only
one) and tells which Arrow files hold the rows; each Arrow file is one shard.
The files are then streamed record batch by record batch with ``pyarrow``
(never decoded into PIL by ``datasets``): the ``Image`` feature is stored as a
``{bytes, path}`` struct, which :mod:`capscore.data.parquet` already reads, so
rows become records through the same function as Parquet rows. Column names
follow the same options (image ``image``; caption ``caption`` or ``text``; id
``key``/``id``/``FILE_STEM:ROW``).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from capscore._optional import require
from capscore.data.parquet import columns_for, items_from_batches
from capscore.data.shards import SourceOptions, expect_files
from capscore.errors import CapscoreError, InputError


def list_arrow_files(spec: str, *, split: str | None = None) -> list[str]:
    """The Arrow files of the dataset (of ``split``) saved in folder ``spec``."""
    datasets = require("datasets", purpose="--hf-dataset")
    if not Path(spec).is_dir():
        raise InputError(spec, "no such folder (expected a dataset saved with datasets' save_to_disk)")
    try:
        ds = datasets.load_from_disk(spec)
    except FileNotFoundError as e:
        raise InputError(spec, f"not a dataset saved with save_to_disk ({str(e).splitlines()[0]})") from None
    if isinstance(ds, datasets.DatasetDict):
        splits = sorted(ds)
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in ds:
            given = "no --split given" if split is None else f"no split {split!r}"
            raise InputError(spec, f"{given}; the dataset has splits {splits}")
        ds = ds[split]
    elif split is not None:
        raise InputError(spec, f"--split {split!r} given but the folder holds a single dataset without splits")
    return expect_files([f["filename"] for f in ds.cache_files], spec, "Arrow files of the dataset")


def read_arrow_file(path: str, *, name: str, options: SourceOptions = SourceOptions()) -> Iterator:
    pa = require("pyarrow", purpose="reading Arrow files")
    try:
        reader = pa.ipc.open_stream(pa.memory_map(path))
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(path, f"not a readable Arrow file ({str(e).splitlines()[0]})") from None
    cols = columns_for(path, reader.schema.names, options)
    want = {k: c for k, c in cols.items() if c}

    def batches():
        try:
            for b in reader:
                yield b.select(list(dict.fromkeys(want.values())))
        except pa.ArrowInvalid as e:
            raise InputError(path, f"corrupt Arrow file ({str(e).splitlines()[0]})") from None

    return items_from_batches(batches(), cols, path=path, name=name)
