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

The folder's own metadata is checked before ``datasets`` reads it: ``state.json``
and ``dataset_dict.json`` must be small JSON objects of the shape
``save_to_disk`` writes, every data file must be a plain file name inside the
dataset's folder (a ``state.json`` naming ``/etc/passwd`` or ``../x`` is refused,
never opened), and a dataset without data files (saved with no rows) is an
error naming the folder. Anything ``datasets`` or ``pyarrow`` then raise on a
damaged folder or Arrow file is an :class:`~capscore.errors.InputError` naming it.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from capscore._optional import require
from capscore.data.parquet import _first_line, columns_for, items_from_batches
from capscore.data.shard_options import SourceOptions, expect_files
from capscore.errors import InputError


def list_arrow_files(spec: str, *, split: str | None = None) -> list[str]:
    """The Arrow files of the dataset (of ``split``) saved in folder ``spec``."""
    datasets = require("datasets", purpose="--hf-dataset")
    if not Path(spec).is_dir():
        raise InputError(spec, "no such folder (expected a dataset saved with datasets' save_to_disk)")
    check_saved_folder(Path(spec))
    try:
        ds = datasets.load_from_disk(spec)
    except Exception as e:  # noqa: BLE001  (datasets/pyarrow raise many types on a damaged folder)
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(spec, f"not a readable dataset saved with save_to_disk ({text})") from None
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


MAX_METADATA_BYTES = 1 << 20  # state.json / dataset_dict.json are a few hundred bytes


def _small_json(path: Path, what: str):
    try:
        st = os.stat(path)
        if not os.path.isfile(path):
            raise InputError(str(path), f"{what} is not a regular file")
        if st.st_size > MAX_METADATA_BYTES:
            raise InputError(str(path), f"{what} is {st.st_size:,} bytes; expected a small JSON file")
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (ValueError, RecursionError) as e:
        raise InputError(str(path), f"{what} is not valid JSON ({str(e).splitlines()[0][:120]})") from None
    except OSError as e:
        raise InputError(str(path), f"cannot read {what} ({e.strerror or e})") from None


def check_saved_folder(folder: Path) -> None:
    """Refuse a save_to_disk folder whose metadata is malformed or points outside it (see module docstring)."""
    if (folder / "dataset_dict.json").exists():
        meta = _small_json(folder / "dataset_dict.json", "dataset_dict.json")
        splits = meta.get("splits") if isinstance(meta, dict) else None
        if not isinstance(splits, list) or not splits or not all(_plain_name(s) for s in splits):
            raise InputError(str(folder / "dataset_dict.json"), "malformed dataset_dict.json",
                             expected='{"splits": [names of sub-folders]}', got=meta)
        for s in splits:
            if not (folder / s).is_dir():
                raise InputError(str(folder), f"split {s!r} is listed in dataset_dict.json but has no folder")
            _check_state(folder / s)
        return
    if not (folder / "state.json").exists():
        raise InputError(str(folder), "not a dataset saved with save_to_disk (no state.json or dataset_dict.json)")
    _check_state(folder)


def _plain_name(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name \
        and "\0" not in name


def _check_state(folder: Path) -> None:
    where = str(folder / "state.json")
    state = _small_json(folder / "state.json", "state.json")
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("filename"), str)
                                              for f in files):
        raise InputError(where, "malformed state.json", expected='{"_data_files": [{"filename": "data-....arrow"}]}',
                         got=state)
    if not files:
        raise InputError(str(folder), "the saved dataset has no data files (it was saved with no rows)")
    root = os.path.realpath(folder)
    for f in files:
        name = f["filename"]
        real = os.path.realpath(folder / name) if _plain_name(name) else None
        if real is None or os.path.dirname(real) != root:
            raise InputError(where, f"data file {name!r} is not a file name inside the dataset's folder; refused")
        if not os.path.isfile(real):
            raise InputError(where, f"data file {name!r} is missing or not a regular file")


def read_arrow_file(path: str, *, name: str, options: SourceOptions = SourceOptions()) -> Iterator:
    pa = require("pyarrow", purpose="reading Arrow files")

    if not os.path.isfile(path):
        raise InputError(path, "not a regular file (expected an Arrow file)")
    try:
        # read, not memory-mapped: a corrupt file whose buffers point past its end would fault (SIGBUS)
        reader = pa.ipc.open_stream(pa.OSFile(path, "rb"))
        names = reader.schema.names
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(path, f"not a readable Arrow file ({_first_line(e)})") from None
    cols = columns_for(path, names, options)
    want = {k: c for k, c in cols.items() if c}

    def batches():
        row = 0
        try:
            for b in reader:
                b = b.select(list(dict.fromkeys(want.values())))
                b.validate(full=True)  # offsets and lengths checked before any value is read
                yield b
                row += b.num_rows
        except (pa.ArrowException, OSError, ValueError) as e:
            raise InputError(path, f"corrupt or truncated Arrow file after row {row} ({_first_line(e)})") from None

    return items_from_batches(batches(), cols, path=path, name=name, max_cell=options.max_member_bytes)
