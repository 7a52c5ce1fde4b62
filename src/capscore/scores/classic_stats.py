"""Per-item sufficient statistics of the classic metrics and the corpus headlines computed from them.

:class:`ClassicStats` holds, for one metric on one evaluated set, the per-caption values exactly as
pycocoevalcap returns them and the per-item statistics its corpus-level score is made of, so that the
headline of any multiset of items (a bootstrap resample) is a sum and a formula — no Java, no tokenising:

==============  =======================================================================================
``bleu1``…``4``  Per item: candidate length, the ``closest`` reference length (ties to the shorter), the
                 number of candidate n-grams and of clipped matching n-grams for n = 1…4 (Papineni et al.
                 2002, §2.1–2.2.1). Corpus: :func:`bleu_from_stats` on their sums — clipped counts and the
                 brevity penalty over the whole set, with pycocoevalcap's ``tiny``/``small`` constants.
                 The per-caption value is the same formula on one item's row.
``meteor``       Per item: the 23-number statistics line of the METEOR 1.5 jar (lengths, function words,
                 content/function matches per stage, chunks, matched words). Corpus: the jar's aggregate,
                 reproduced by :func:`meteor_from_stats` on the summed lines (a segment whose words all
                 match in one chunk adds no chunk, as the jar's ``MeteorStats.addStats`` does).
``rouge-l``,     The per-caption values; corpus: their mean (pycocoevalcap's ``compute_score``).
``cider``,
``spice``
==============  =======================================================================================

In a run's rows (``capscore score``) the per-item statistics of BLEU and METEOR are the ``stats`` column: the
numbers of one item's row, space-separated (:func:`stats_text`), so a summary, a resumed run, ``compare`` and
``report`` rebuild the headline from the rows alone (:func:`classic_aggregate`: the metric's
:class:`~capscore.scores.aggregate.Summed` aggregate).

CIDEr-D's IDF is computed once over the evaluated set (its references, one document per image), as
pycocoevalcap does; a resample keeps that IDF and averages the resampled items' values. Recomputing the IDF
on each resample would treat an image drawn twice as two documents: its own n-grams' document frequency
doubles, their IDF drops, and exactly the repeated images score lower — a resampling artefact that biases
every resampled CIDEr below the observed one, so the bootstrap distribution would not be centred on the
statistic it tests. The IDF is a property of the reference corpus (shared by every system scored on it),
not of the sample of captions; holding it fixed is the conditional bootstrap of the per-image values.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from capscore.errors import param_error
from capscore.scores.aggregate import Summed

BLEU_TINY, BLEU_SMALL = 1e-15, 1e-9  # pycocoevalcap.bleu.bleu_scorer's smoothing constants
#: METEOR 1.5's English parameters (``-l en``, default ranking task): alpha, beta, gamma, delta, and the
#: weights of its four matching stages (exact, stem, synonym, paraphrase).
METEOR_PARAMS = (0.85, 0.20, 0.60, 0.75)
METEOR_WEIGHTS = (1.0, 0.6, 0.8, 0.6)
#: Columns of one BLEU statistics row.
BLEU_COLUMNS = ("testlen", "reflen", "guess1", "guess2", "guess3", "guess4",
                "correct1", "correct2", "correct3", "correct4")
_RESAMPLE_BLOCK = 256  # resamples per matrix product (bounds the (R, N) count matrix)


def bleu_from_stats(stats: np.ndarray) -> np.ndarray:
    """BLEU-1…4 (last axis) from rows of :data:`BLEU_COLUMNS` — pycocoevalcap's ``BleuScorer.compute_score``
    arithmetic, for one item's row (sentence BLEU) or a sum of rows (corpus BLEU)."""
    s = np.asarray(stats, dtype=float)
    testlen, reflen, guess, correct = s[..., 0], s[..., 1], s[..., 2:6], s[..., 6:10]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        p = np.cumprod((correct + BLEU_TINY) / (guess + BLEU_SMALL), axis=-1)
        out = p ** (1.0 / np.arange(1, 5))
        ratio = (testlen + BLEU_TINY) / (reflen + BLEU_SMALL)
        penalty = np.where(ratio < 1, np.exp(1 - 1 / ratio), 1.0)
    return out * penalty[..., None]


def meteor_from_stats(stats: np.ndarray) -> np.ndarray:
    """The METEOR 1.5 score of rows of its 23 statistics (``MeteorScorer.computeMetrics``): weighted
    precision and recall over content (δ) and function (1 − δ) words, Fmean with α, fragmentation penalty
    γ·(chunks / mean matched words)^β, zero for a perfect one-chunk match; NaN becomes 0, negatives 0."""
    alpha, beta, gamma, delta = METEOR_PARAMS
    s = np.asarray(stats, dtype=float)
    tl, rl, tf, rf = s[..., 0], s[..., 1], s[..., 2], s[..., 3]
    stage = s[..., 4:20].reshape(*s.shape[:-1], 4, 4)  # (.., stage, [test content, ref content, test fn, ref fn])
    chunks, tw, rw = s[..., 20], s[..., 21], s[..., 22]
    t_total = stage[..., 0].sum(-1) + stage[..., 2].sum(-1)
    r_total = stage[..., 1].sum(-1) + stage[..., 3].sum(-1)
    t_len = delta * (tl - tf) + (1.0 - delta) * tf
    r_len = delta * (rl - rf) + (1.0 - delta) * rf
    t_match = np.zeros(s.shape[:-1])
    r_match = np.zeros(s.shape[:-1])
    for i, w in enumerate(METEOR_WEIGHTS):  # the jar's order: content stages, then function stages
        t_match = t_match + stage[..., i, 0] * w * delta
    for i, w in enumerate(METEOR_WEIGHTS):
        r_match = r_match + stage[..., i, 1] * w * delta
    for i, w in enumerate(METEOR_WEIGHTS):
        t_match = t_match + stage[..., i, 2] * w * (1.0 - delta)
    for i, w in enumerate(METEOR_WEIGHTS):
        r_match = r_match + stage[..., i, 3] * w * (1.0 - delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision, recall = t_match / t_len, r_match / r_len
        fmean = 1.0 / (((1.0 - alpha) / precision) + (alpha / recall))
        perfect = (t_total == tl) & (r_total == rl) & (chunks == 1)
        frag = np.where(perfect, 0.0, chunks / ((tw + rw) / 2))
        score = fmean * (1.0 - gamma * frag ** beta)
    return np.where(np.isnan(score), 0.0, np.maximum(score, 0.0))


def meteor_summable(stats: np.ndarray) -> np.ndarray:
    """Rows of METEOR statistics as the jar sums them: a segment matched perfectly in one chunk contributes
    no chunk to the aggregate (``MeteorStats.addStats``)."""
    s = np.array(stats, dtype=float)
    stage = s[:, 4:20].reshape(len(s), 4, 4)
    perfect = ((stage[:, :, 0].sum(-1) + stage[:, :, 2].sum(-1) == s[:, 0])
               & (stage[:, :, 1].sum(-1) + stage[:, :, 3].sum(-1) == s[:, 1]) & (s[:, 20] == 1))
    s[perfect, 20] = 0.0
    return s


def aggregate_kind(name: str) -> str:
    """How a metric's corpus score is made from its statistics: ``bleu``, ``meteor`` or ``mean``."""
    return "bleu" if name.startswith("bleu") else "meteor" if name == "meteor" else "mean"


@dataclass(frozen=True, eq=False)
class ClassicStats:
    """One classic metric on one evaluated set (module docstring).

    ``values``: one value per item, in input order, exactly as pycocoevalcap returns it (sentence-level BLEU,
    METEOR per segment, ROUGE-L, CIDEr-D, SPICE F). ``stats``: the per-item sufficient statistics of the
    corpus score ((N, 10) BLEU rows, (N, 23) METEOR lines, or the values as one column). :meth:`corpus`
    is the headline pycocoevalcap's ``compute_score`` prints; ``corpus(indices)`` the same statistic on a
    resample (a multiset of item indices, or a 2-D array of them: one resample per row)."""

    name: str
    values: np.ndarray = field(repr=False)
    stats: np.ndarray = field(repr=False)
    tokenizer: str = "ptb"
    backend: str = "native"
    warnings: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.values)

    @property
    def kind(self) -> str:
        return aggregate_kind(self.name)

    def corpus(self, indices: Sequence[int] | np.ndarray | None = None) -> float | np.ndarray:
        """The corpus-level score over all items, or over ``indices`` (1-D: one resample -> a float; 2-D
        (R, n): R resamples -> R floats). SPICE averages the items whose F is defined (NaN where none)."""
        if indices is None:
            return float(self._from_totals(self._summable().sum(0)) if self.kind != "mean" else self._mean(
                self.values))
        idx = np.asarray(indices)
        if idx.ndim not in (1, 2) or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
            raise param_error("indices", "ClassicStats.corpus", "a non-empty 1-D or 2-D array of item indices",
                              indices)
        if idx.min() < 0 or idx.max() >= len(self):
            raise param_error("indices", "ClassicStats.corpus", f"indices in [0, {len(self) - 1}]",
                              f"{int(idx.min())}..{int(idx.max())}")
        if idx.ndim == 1:
            if self.kind == "mean":
                return self._mean(self.values[idx])
            return float(self._from_totals(self._summable()[idx].sum(0)))
        out = np.empty(len(idx))
        rows = self._summable() if self.kind != "mean" else None
        for start in range(0, len(idx), _RESAMPLE_BLOCK):
            block = idx[start:start + _RESAMPLE_BLOCK]
            rows_of = np.arange(len(block))[:, None] * len(self)
            counts = np.bincount((rows_of + block).ravel(), minlength=len(block) * len(self)).reshape(
                len(block), len(self)).astype(float)  # how often each item is drawn, per resample
            if rows is None:
                ok = ~np.isnan(self.values)
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[start:start + len(block)] = (counts @ np.where(ok, self.values, 0.0)) / (counts @ ok)
            else:
                out[start:start + len(block)] = self._from_totals(counts @ rows)
        return out

    @staticmethod
    def _mean(values: np.ndarray) -> float:
        ok = values[~np.isnan(values)]
        return float(np.mean(ok)) if len(ok) else float("nan")

    def _summable(self) -> np.ndarray:
        if self.kind == "meteor":
            cached = self.__dict__.get("_meteor_rows")
            if cached is None:
                cached = meteor_summable(self.stats)
                object.__setattr__(self, "_meteor_rows", cached)
            return cached
        return self.stats

    def _from_totals(self, totals: np.ndarray) -> np.ndarray:
        if self.kind == "bleu":
            return bleu_from_stats(totals)[..., int(self.name[-1]) - 1]
        return meteor_from_stats(totals)


# ------------------------------------------------------------------------------------ headlines from rows
def stats_text(values) -> str:
    """One item's statistics as the rows' ``stats`` column: its numbers space-separated (integral ones
    without a point), e.g. ``"14 13 14 13 12 11 13 9 6 4"`` for a BLEU row of :data:`BLEU_COLUMNS`."""
    return " ".join(format(float(x), ".17g") for x in values)


def parse_stats(text, width: int, metric: str) -> list[float]:
    """The numbers of a ``stats`` cell (:func:`stats_text`); ``ValueError`` saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"{metric} needs the per-item statistics of its corpus score in the 'stats' column "
                         f"({width} numbers); got {'none' if text is None else type(text).__name__}")
    try:
        values = [float(x) for x in text.split()]
    except ValueError:
        raise ValueError(f"the 'stats' column of a {metric} row holds something other than numbers: "
                         f"{text[:60]!r}") from None
    if len(values) != width or not all(np.isfinite(values)) or min(values) < 0:
        raise ValueError(f"the 'stats' column of a {metric} row must hold {width} non-negative numbers; got "
                         f"{text[:80]!r}")
    return values


class CorpusBleu(Summed):
    """Corpus BLEU-n from the rows' summed :data:`BLEU_COLUMNS` (pycocoevalcap's ``Bleu(4)`` headline)."""

    width = len(BLEU_COLUMNS)

    def __init__(self, n: int) -> None:
        self.order = n
        self.name = f"corpus-bleu{n}"
        self.per_caption = f"sentence-level BLEU-{n}"
        super().__init__()

    def vector(self, row) -> list[float]:
        return parse_stats(row.get("stats"), self.width, f"bleu{self.order}")

    def finish(self, totals):
        return bleu_from_stats(totals)[..., self.order - 1]


class CorpusMeteor(Summed):
    """The METEOR jar's aggregate from the rows' summed statistics lines (:func:`meteor_summable` first)."""

    name = "corpus-meteor"
    width = 23
    per_caption = "segment-level METEOR"

    def vector(self, row) -> list[float]:
        return meteor_summable(np.array([parse_stats(row.get("stats"), self.width, "meteor")]))[0].tolist()

    def finish(self, totals):
        return meteor_from_stats(totals)


class ItemMean(Summed):
    """The mean of the rows' scores (ROUGE-L, CIDEr-D, SPICE: pycocoevalcap's headline), as a sum of
    ``(score, 1)`` so that resampling tests treat it like the corpus scores; ``per_caption`` names the
    per-caption value."""

    name = "mean"
    width = 2

    def __init__(self, per_caption: str | None = None) -> None:
        self.per_caption = per_caption
        super().__init__()

    def vector(self, row) -> list[float]:
        return [float(row["score"]), 1.0]

    def finish(self, totals):
        t = np.asarray(totals, dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            return t[..., 0] / t[..., 1]


_ITEM_VALUE = {"rouge-l": "ROUGE-L", "cider": "CIDEr-D", "spice": "SPICE F"}  # what a mean-headline row's score is


def classic_aggregate(name: str) -> Summed:
    """A fresh headline aggregate of the classic metric ``name`` (the registry rows' ``aggregate``)."""
    kind = aggregate_kind(name)
    if kind == "bleu":
        return CorpusBleu(int(name[-1]))
    return CorpusMeteor() if kind == "meteor" else ItemMean(_ITEM_VALUE.get(name, name))

