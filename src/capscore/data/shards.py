"""Sharded web-scale inputs: WebDataset tars, Parquet files, a saved Hugging Face dataset.

A *shard* is the unit every engine reads, resumes and writes by: one ``.tar``
of a WebDataset, one ``.parquet`` file, one Arrow file of a ``save_to_disk``
dataset. :func:`list_shards` finds them (brace patterns, folders) and
:func:`read_shard` yields the shard's items in order: a
:class:`~capscore.data.records.Record` per sample (``id`` = the sample key,
``source`` = ``shard:key``, the image as in-memory bytes) or a
:class:`~capscore.data.captions.BadItem` for a sample that cannot be scored.
A problem with one sample never loses the rest of its shard; a problem with
the shard itself (truncated archive, missing column) is an error row or an
:class:`~capscore.errors.InputError` naming the shard.

The single-process engine chains the shards; the Ray engine
(:mod:`capscore.engines.ray`) calls the same :func:`read_shard` in its read
tasks, so both see exactly the same items.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from capscore.data.shard_options import SourceOptions
from capscore.errors import CapscoreError, InputError
from capscore.data.captions import BadItem
from capscore.data.hf_dataset import list_arrow_files, read_arrow_file
from capscore.data.parquet import list_parquet_files, read_parquet_file
from capscore.data.webdataset import list_tar_shards, read_tar_shard

KINDS = ("webdataset", "parquet", "hf")


@dataclass(frozen=True)
class Shard:
    """One input file. ``name`` is unique within a run and names the output partition."""

    kind: str
    path: str
    name: str

    def fingerprint(self) -> dict:
        """Size and modification time: a shard that changed since its output was written is redone."""
        st = os.stat(self.path)
        return {"path": os.path.abspath(self.path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def list_shards(kind: str, spec: str, *, split: str | None = None) -> list[Shard]:
    """Shards of a source; raises InputError naming what is missing."""
    if kind == "webdataset":
        paths = list_tar_shards(spec)
    elif kind == "parquet":
        paths = list_parquet_files(spec)
    elif kind == "hf":
        paths = list_arrow_files(spec, split=split)
    else:  # pragma: no cover - callers pass one of KINDS
        raise CapscoreError(f"unknown source kind {kind!r}")
    return [Shard(kind, p, n) for p, n in zip(paths, partition_names(paths))]


def read_shard(shard: Shard, options: SourceOptions = SourceOptions()) -> Iterator:
    """Items of one shard, in order (see the module docstring).

    A shard that cannot be read at all (not a tar, a missing column, a corrupt
    Arrow file) ends with one :class:`BadItem` naming it, after whatever it
    yielded before: an error row with ``--skip-bad``, a one-line error without.
    """
    try:
        yield from _reader(shard, options)
    except InputError as e:
        what = str(e)[len(e.where) + 2:] if str(e).startswith(f"{e.where}: ") else str(e)
        yield BadItem(f"{shard.name}:<unreadable>", shard.path, "", "", e.where, what)


def _reader(shard: Shard, options: SourceOptions) -> Iterator:
    if shard.kind == "webdataset":
        return read_tar_shard(shard.path, name=shard.name, options=options)
    if shard.kind == "parquet":
        return read_parquet_file(shard.path, name=shard.name, options=options)

    return read_arrow_file(shard.path, name=shard.name, options=options)


def partition_names(paths: list[str]) -> list[str]:
    """Output partition names: the file stem, or the path below the common folder when stems repeat."""
    stems = [Path(p).name.split(".")[0] for p in paths]
    if len(set(stems)) == len(stems):
        return stems
    common = os.path.commonpath([os.path.abspath(p) for p in paths]) if paths else ""
    names = []
    for p in paths:
        rel = os.path.relpath(os.path.abspath(p), common) if common else p
        names.append(rel.replace(os.sep, "__").split(".")[0])
    if len(set(names)) != len(names):  # a.tar and a.tar.gz in one folder: fall back to a hash suffix
        names = [f"{n}-{hashlib.sha1(p.encode()).hexdigest()[:8]}" for n, p in zip(names, paths)]
    return names
