"""The containers every human-judgment loader returns (:mod:`capscore.meta.datasets`, the synthetic-scenes
oracle :mod:`capscore.meta.oracle`): rated captions (:class:`RatingSet`) and preference pairs (:class:`PairSet`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from capscore.data.images import ImageRef
from capscore.data.records import Record


@dataclass(frozen=True)
class Rated:
    """One caption with its human score. ``group`` = the image (for sample-wise τ)."""

    record: Record
    human: float
    group: str = ""
    lang: str = ""


@dataclass(frozen=True)
class _Set:
    """A loaded evaluation set: its name, where it came from, its items, what was skipped reading it, and
    the parameters it was drawn with."""

    name: str
    source: str
    items: tuple
    skipped: Mapping[str, int] = field(default_factory=dict)
    params: Mapping[str, object] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class RatingSet(_Set):
    """Captions with human scores (``items``: :class:`Rated`)."""


@dataclass(frozen=True)
class Pair:
    """Two captions of one image; ``label`` 0 = humans preferred ``a``, 1 = ``b``."""

    id: str
    image: ImageRef
    a: str
    b: str
    refs: tuple[str, ...]
    category: str
    label: int
    source: str = ""
    votes: tuple[int, int] | None = None


@dataclass(frozen=True)
class PairSet(_Set):
    """Caption pairs with the humans' preference (``items``: :class:`Pair`)."""
