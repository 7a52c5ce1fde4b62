"""Sources: where a scoring job's items come from, as one small interface.

A source yields :class:`~capscore.data.records.Record` s (and
:class:`~capscore.data.captions.BadItem` s for items that failed to load) in a
stable order, may be read more than once (once per model × metric), and
describes itself for the run's summary (``--resume`` compares descriptions).

* :class:`CaptionFiles` — an image or video index plus caption files (each a
  system) and optional references: ``capscore score --images/--videos --captions``.
* :class:`ShardedSource` — WebDataset tars, Parquet files or a saved HF dataset,
  read shard by shard through :func:`capscore.data.shards.read_shard`.
* :class:`InMemory` — records built in Python (``capscore.score``).
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from capscore.errors import CapscoreError

if TYPE_CHECKING:  # capscore.data.shards imports the engine (torch): not at `capscore --help` time
    from capscore.data.shards import Shard, SourceOptions


def _abs(path) -> str:
    return str(Path(path).expanduser().resolve())


@dataclass
class CaptionFiles:
    """Caption files scored against an image folder/manifest (``medium='image'``) or videos (``'video'``)."""

    media: str  # the --images / --videos argument
    captions: Sequence[str]
    refs: str | None = None
    medium: str = "image"
    _index: object = field(default=None, repr=False)
    _refs: dict | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        stems = [Path(c).stem for c in self.captions]
        dup = next((s for s in stems if stems.count(s) > 1), None)
        if dup is not None:
            raise CapscoreError(f"two caption files are named {dup!r}; the file stem names the system, "
                                "so rename one")

    def open(self) -> "CaptionFiles":
        """Index the media and read the references; whole-file problems surface here, before any model loads."""
        from capscore.data.captions import index_images, load_refs

        if self.medium == "video":
            from capscore.data.video import index_videos

            self._index = index_videos(self.media)
        else:
            self._index = index_images(self.media)
        self._refs = load_refs(self.refs) if self.refs else None
        self.items()  # every caption file's whole-file checks now
        return self

    def items(self) -> Iterator:
        from capscore.data.captions import read_captions

        if self._index is None:
            self.open()
        # a list of readers, not a generator: read_captions checks each whole file when called
        return itertools.chain.from_iterable([read_captions(c, images=self._index, refs=self._refs)
                                              for c in self.captions])

    def count(self) -> int | None:
        return count_captions(self.captions)

    def describe(self) -> dict:
        key = "videos" if self.medium == "video" else "images"
        return {key: _abs(self.media), "captions": [_abs(c) for c in self.captions],
                "refs": _abs(self.refs) if self.refs else None}

    @property
    def spec(self) -> str:
        return ", ".join(self.captions)


@dataclass(frozen=True)
class ShardedSource:
    """WebDataset / Parquet / HF-dataset shards (``kind`` = webdataset | parquet | hf)."""

    kind: str
    spec: str
    shards: tuple[Shard, ...]
    options: SourceOptions
    medium: str = "image"

    @classmethod
    def list(cls, kind: str, spec: str, options: SourceOptions, *, split: str | None = None) -> "ShardedSource":
        from capscore.data.shards import list_shards

        return cls(kind, spec, tuple(list_shards(kind, spec, split=split)), options)

    def items(self) -> Iterator:
        from capscore.data.shards import read_shard

        return itertools.chain.from_iterable(read_shard(s, self.options) for s in self.shards)

    def count(self) -> int | None:
        return None

    def describe(self) -> dict:
        return {"source": self.kind, "spec": self.spec, "options": self.options.__dict__,
                "shards": [s.path for s in self.shards]}


@dataclass(frozen=True)
class InMemory:
    """Records built in memory (``capscore.score``)."""

    records: tuple
    medium: str = "image"
    spec: str = "the given captions"

    def items(self) -> Iterator:
        return iter(self.records)

    def count(self) -> int | None:
        return len(self.records)

    def describe(self) -> dict:
        return {"source": "memory", "items": len(self.records)}


def count_captions(captions) -> int | None:
    """How many captions the files hold, for the progress bar's total and ETA (None when unknown).

    JSON files are parsed (they are loaded whole anyway); JSONL/CSV lines are
    counted (approximate: blank lines, quoted newlines). Only regular files are
    counted: a pipe must be read once, by the reader.
    """
    if not captions:
        return None
    total = 0
    for c in captions:
        p = Path(c)
        suffix = p.suffix.lower()
        try:
            if not p.is_file():
                return None
            if suffix == ".json":
                data = json.loads(p.read_text(encoding="utf-8-sig"))
                total += len(data) if isinstance(data, list) else sum(
                    len(v) if isinstance(v, list) else 1 for v in data.values())
                continue
            if suffix not in (".jsonl", ".csv"):
                return None
            with open(p, "rb") as f:
                lines = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
        except (OSError, ValueError, AttributeError, RecursionError):
            return None  # the reader reports what is wrong with the file
        total += lines - (suffix == ".csv")
    return total
