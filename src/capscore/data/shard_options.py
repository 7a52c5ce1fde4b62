"""What the shard readers share: where a sample keeps its caption, image, id and references
(:class:`SourceOptions`, set from the command line), and the check that the listed shard files exist.

:mod:`capscore.data.shards` lists and reads shards through the readers (:mod:`~capscore.data.webdataset`,
:mod:`~capscore.data.parquet`, :mod:`~capscore.data.hf_dataset`); each reader imports this module, not that one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from capscore.errors import InputError


@dataclass(frozen=True)
class SourceOptions:
    """Where the caption, image, id and references live in a sample (all configurable on the CLI)."""

    caption_key: str = "txt"  # WebDataset: the member extension holding the caption
    refs_key: str | None = None  # WebDataset: a field of KEY.json; Parquet/HF: a list<string> column
    image_column: str = "image"  # Parquet/HF: bytes, {bytes, path} struct (HF Image) or a path string
    caption_column: str | None = None  # Parquet/HF: default "caption", or "text" when there is none
    id_column: str | None = None  # Parquet/HF: default "key", then "id", then FILE:ROW
    #: Largest WebDataset member (declared size in its tar header) or Parquet/Arrow image cell read into
    #: memory, in bytes; a bigger one makes its sample an error row naming ``shard:key`` / ``file:row``.
    max_member_bytes: int = 256 * 2**20


def expect_files(paths: list[str], spec: str, what: str) -> list[str]:
    if not paths:
        raise InputError(spec, f"no {what} found")
    for p in paths:
        if not os.path.isfile(p):
            raise InputError(p, f"{what} not found")
    return paths
