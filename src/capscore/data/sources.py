"""Sources: where a scoring job's items come from, as one small interface.

A source yields :class:`~capscore.data.records.Record` s (and
:class:`~capscore.data.captions.BadItem` s for items that failed to load) in a
stable order, may be read more than once (once per model × metric), says
whether its records carry references (``has_refs``: the default metric is then
the reference-based one, wherever the references were written), and describes
itself for the run's summary (``--resume`` compares descriptions).

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from capscore.errors import CapscoreError
from capscore.data.captions import index_images, load_refs, read_captions
from capscore.data.jsonl import text_name
from capscore.data.shards import list_shards, read_shard

if TYPE_CHECKING:  # capscore.data.shards imports the engine (torch): not at `capscore --help` time
    from capscore.data.shards import Shard, SourceOptions


def _abs(path) -> str:
    return str(Path(path).expanduser().resolve())


@dataclass
class CaptionFiles:
    """Caption files scored against an image folder/manifest (``medium='image'``) or videos (``'video'``);
    ``media=None`` for text-only metrics (no image is needed: each record names its image by id)."""

    media: str | None  # the --images / --videos argument
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
        if self.media is None:
            self._index = False  # opened, without an index
        elif self.medium == "video":
            from capscore.data.video import index_videos  # noqa: PLC0415  (deferred: numpy)

            self._index = index_videos(self.media)
        else:
            self._index = index_images(self.media)
        self._refs = load_refs(self.refs) if self.refs else None
        self.items()  # every caption file's whole-file checks now
        return self

    def items(self) -> Iterator:
        if self._index is None:
            self.open()
        # a list of readers, not a generator: read_captions checks each whole file when called
        return itertools.chain.from_iterable([read_captions(c, images=self._index or None, refs=self._refs)
                                              for c in self.captions])

    def count(self) -> int | None:
        return count_captions(self.captions)

    def has_refs(self) -> bool:
        """Whether any record carries references: from ``--refs``, or a ``refs`` field of the captions."""
        if self.refs:
            return True
        return any(getattr(x, "refs", ()) for x in self.items())

    def describe(self) -> dict:
        key = "videos" if self.medium == "video" else "images"
        return {key: _abs(self.media) if self.media is not None else None, "captions": [_abs(c) for c in self.captions],
                "refs": _abs(self.refs) if self.refs else None}

    @property
    def spec(self) -> str:
        return ", ".join(self.captions)


@dataclass(frozen=True)
class ShardedSource:
    """WebDataset / Parquet / HF-dataset shards (``kind`` = webdataset | parquet | hf).

    Every engine reads a shard through :meth:`read`, so its records carry the source's
    :attr:`system` name (as a captions file names its system) in every engine.
    """

    kind: str
    spec: str
    shards: tuple[Shard, ...]
    options: SourceOptions
    medium: str = "image"

    @classmethod
    def list(cls, kind: str, spec: str, options: SourceOptions, *, split: str | None = None) -> "ShardedSource":
        return cls(kind, spec, tuple(list_shards(kind, spec, split=split)), options)

    @property
    def system(self) -> str:
        """The caption set's name: the input's stem, as ``--captions FILE`` names its system after the file
        (a folder's name; for a brace pattern or glob, its folder's name)."""
        p = Path(self.spec.rstrip("/\\") or self.spec)
        name = p.name if p.is_dir() else p.stem
        if any(c in name for c in "{*?["):
            name = p.parent.name
        return text_name(name) or self.kind

    def read(self, shard: Shard) -> Iterator:
        """One shard's items in order, each tagged with :attr:`system`."""
        system = self.system
        for item in read_shard(shard, self.options):
            yield item if item.system else replace(item, system=system)

    def items(self) -> Iterator:
        return itertools.chain.from_iterable(self.read(s) for s in self.shards)

    def count(self) -> int | None:
        return None

    def has_refs(self) -> bool:
        return self.options.refs_key is not None

    def settings(self) -> dict:
        """How each shard is read (what a shard's output depends on besides its own bytes)."""
        return {"source": self.kind, "options": dict(self.options.__dict__)}

    def describe(self) -> dict:
        return {**self.settings(), "spec": self.spec, "shards": [s.path for s in self.shards]}


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

    def has_refs(self) -> bool:
        return any(getattr(r, "refs", ()) for r in self.records)

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
