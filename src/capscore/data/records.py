"""The record every loader produces: one caption of one image, knowing where it came from."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from capscore.data.images import ImageRef


@dataclass(frozen=True)
class Record:
    """One (image, caption[, references]) item.

    ``id`` is unique within a run (resume keys on it); ``source`` is ``file:line``
    for error messages; ``system`` names the caption set (model) it belongs to,
    for system-level means.
    """

    id: str
    image: ImageRef
    caption: str
    refs: tuple[str, ...] = ()
    system: str = ""
    source: str = ""

    @staticmethod
    def make(id: str, image, caption: str, refs=(), *, system: str = "", source: str = "") -> "Record":
        ref = image if isinstance(image, ImageRef) else ImageRef.of(image)
        if ref.path is not None and not ref.name:
            ref = ImageRef(path=Path(ref.path), name=f"{source}: image {ref.path}" if source else "")
        return Record(str(id), ref, caption, tuple(refs), system, source)
