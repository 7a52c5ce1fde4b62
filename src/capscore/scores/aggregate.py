"""How a run's per-item rows become a headline number: the :class:`Aggregate` protocol and its default.

A run's summary (:class:`capscore.pipeline.Summary`) keeps, per (model, metric) and per system, the
count and the mean of the per-item scores, and — when the metric defines one — the metric's own
aggregate: a metric row sets ``Metric.aggregate`` to a zero-argument factory of an :class:`Aggregate`
(corpus-level BLEU, for one, is computed from per-item n-gram statistics, not as a mean of per-item
BLEU). The contract an aggregate keeps:

* ``add(row)`` sees each scored row as written (every column of the metric, so per-item statistics the
  aggregate needs must be row columns); resume rebuilds the aggregate from the rows already written;
* ``state()`` is JSON-able and ``merge(state)`` adds another aggregate's state, so the parts of a run
  scored apart (shards, Ray blocks, a resumed run) combine into the number one pass would give, in any
  order and grouping;
* ``value()`` is the headline (None when nothing was added).

An aggregate may also say what its rows' ``score`` is, as ``per_caption`` (``"sentence-level BLEU-4"``:
the summary and the printout name the mean of the scores with it, beside the headline).

Most corpus scores are a function of the column sums of one vector per row (:class:`Summed`: corpus BLEU
from n-gram counts, METEOR's aggregate from the jar's statistics, a mean from ``(score, 1)``). Such an
aggregate also serves resampling: a paired bootstrap or randomisation over image clusters sums the drawn
clusters' vectors and applies :meth:`Summed.finish` (:func:`capscore.meta.significance.compare_summed`),
as significance tests for BLEU do in machine translation.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol


class Aggregate(Protocol):
    """A mergeable accumulator of scored rows (see the module docstring)."""

    name: str  # what the headline is, as printed ("mean", "corpus-bleu4", ...)

    def add(self, row: Mapping) -> None: ...

    def state(self) -> dict: ...

    def merge(self, state: Mapping) -> None: ...

    def value(self) -> float | None: ...


def _grow(partials: list[float], x: float) -> None:
    """Add ``x`` to the exact sum held as non-overlapping ``partials`` (Shewchuk's algorithm, as ``math.fsum``)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


class Mean:
    """The mean of the rows' ``score``, from an exact sum: the same number whatever the order or grouping in
    which rows and states are added (a sharded or resumed run gives the one-pass mean to the last bit)."""

    name = "mean"

    def __init__(self) -> None:
        self.n = 0
        self._partials: list[float] = []

    def add(self, row: Mapping) -> None:
        self.n += 1
        _grow(self._partials, float(row["score"]))

    def state(self) -> dict:
        return {"n": self.n, "sum": list(self._partials)}

    def merge(self, state: Mapping) -> None:
        self.n += int(state["n"])
        for x in state["sum"]:
            _grow(self._partials, float(x))

    def value(self) -> float | None:
        return math.fsum(self._partials) / self.n if self.n else None


class Summed:
    """A headline that is a function of the column sums of one vector per row: ``finish(Σ vector(row))``.

    Subclasses set ``name``, ``width`` and ``per_caption`` and define :meth:`vector` (one row -> ``width``
    numbers; a bad row raises ``ValueError`` naming what is wrong) and :meth:`finish` (a ``(..., width)``
    array of sums -> the headline(s), vectorised over the leading axes). Sums are exact (as :class:`Mean`'s;
    whole numbers — n-gram counts — as Python integers, the rest as exact float partials), so the state of any
    grouping of the rows merges to the one-pass number."""

    name = "summed"
    width = 1
    per_caption: str | None = None

    def __init__(self) -> None:
        self.n = 0
        self._ints = [0] * self.width
        self._partials: list[list[float]] = [[] for _ in range(self.width)]

    def vector(self, row: Mapping) -> list[float]:
        raise NotImplementedError

    def finish(self, totals):
        raise NotImplementedError

    def add(self, row: Mapping) -> None:
        v = self.vector(row)
        self.n += 1
        for j, x in enumerate(v):
            if x.is_integer():
                self._ints[j] += int(x)
            else:
                _grow(self._partials[j], x)

    def state(self) -> dict:
        return {"n": self.n, "ints": list(self._ints), "sums": [list(p) for p in self._partials]}

    def merge(self, state: Mapping) -> None:
        self.n += int(state["n"])
        for j, (k, xs) in enumerate(zip(state["ints"], state["sums"])):
            self._ints[j] += int(k)
            for x in xs:
                _grow(self._partials[j], float(x))

    def totals(self) -> list[float]:
        return [math.fsum([*p, k]) for p, k in zip(self._partials, self._ints)]

    def value(self) -> float | None:
        import numpy as np  # noqa: PLC0415  (deferred: numpy)

        return float(self.finish(np.asarray(self.totals()))) if self.n else None


def aggregate_for(metric) -> Aggregate | None:
    """A fresh instance of ``metric``'s own aggregate, or None when its headline is the mean of its scores."""
    factory = getattr(metric, "aggregate", None)
    return None if factory is None else factory()
