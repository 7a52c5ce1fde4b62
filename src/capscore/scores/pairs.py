"""Pair scorers: the one protocol through which probes, suites and retrieval re-ranking score.

A pair scorer takes an :class:`~capscore.embed.Encoder` and aligned sequences
of images and texts and returns one float per (image, text) pair, higher =
better match. Every named scorer is a registered metric
(:mod:`capscore.scores.metric`) that needs no references: ``cosine`` (the
default), ``clip-s``, ``pac-s``, ``mcs``, ``abe`` (ABE-CLIP) and any metric
registered later. :class:`MetricPairScorer` hands the metric's own
``Metric.compute`` one :class:`~capscore.scores.metric.EmbeddingBatch` of the
pairs, with the prefix resolved by the row (``Metric.prefix_for``), so a probe
scores exactly what ``capscore score`` scores. Probes never see models, only a
scorer and an encoder, so one encoding pass (and its cache) serves them all.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from capscore.data.records import Record
from capscore.embed.engine import Encoder
from capscore.errors import CapscoreError, OptionError, braced, unknown_name
from capscore.scores.metric import EmbeddingBatch, Metric, get_metric, registry
from capscore.scores.abe import make_config
from capscore.validate import check_str

PairScorer = Callable[[Encoder, Sequence, Sequence[str]], torch.Tensor]


@dataclass(frozen=True)
class MetricPairScorer:
    """A registered reference-free image metric as a pair scorer: ``metric.compute`` on the pairs.

    ``prefix`` is prepended to every text the probe scores (resolved from the row when the scorer is made);
    ``options`` are the formula's (``{"abe": {...}}`` for ABE-CLIP). The pairs are trusted (a probe builds
    them), so no record check runs: an empty perturbed caption is scored as the encoder encodes it.
    Returns float64 scores, one per pair.
    """

    metric: Metric
    prefix: str = ""
    options: Mapping = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.metric.name

    def __call__(self, encoder: Encoder, images: Sequence, texts: Sequence[str]) -> torch.Tensor:
        records = [Record(str(i), image, text) for i, (image, text) in enumerate(zip(images, texts, strict=True))]
        values = self.metric.compute(EmbeddingBatch(encoder, records, self.prefix, "image", self.options))
        return torch.tensor(values.scores, dtype=torch.float64)


def cosine_pairs(encoder: Encoder, images: Sequence, texts: Sequence[str]) -> torch.Tensor:
    """cos(image_i, text_i) for each i (unclamped, unweighted): the registered metric ``cosine``."""
    return get_pair_scorer("cosine")(encoder, images, texts)


def text_text_cosine(encoder: Encoder, a: Sequence[str], b: Sequence[str]) -> torch.Tensor:
    """cos(a_i, b_i) between texts (SugarCrepe++'s text-only TOT): no image, so no image metric applies."""
    return (encoder.encode_texts(a) * encoder.encode_texts(b)).sum(-1)


def pair_scorer_names() -> list[str]:
    """Every name :func:`get_pair_scorer` accepts: the registered image metrics that need no references and
    score with the probe's backbone (not those with their own models: FLEUR, EXPERT)."""
    return [n for n, m in registry().items() if m.image is not None and not m.needs_refs and not m.own_models]


def get_pair_scorer(name: str, *, prefix: str | None = None, **options) -> PairScorer:
    """The pair scorer of the registered metric ``name`` (see :func:`pair_scorer_names`).

    ``cosine`` (global CLIP similarity), ``clip-s``, ``pac-s``, ``mcs``, ``abe`` (ABE-CLIP; ``options``
    are its :class:`~capscore.scores.abe.AbeConfig` fields and ``ablation``): each pair scores as the
    metric scores it. ``prefix``: ``None`` gives the metric's own (``Metric.prefix_for``: "A photo
    depicts " for clip-s and pac-s, none for mcs, abe and cosine); ``""`` none. The scorer prepends it
    itself, so callers pass captions as written. Reference-based metrics (refclip-s, refpac-s) have no
    pair form: a probe scores (image, text) pairs only.
    """
    check_str(prefix, "prefix", "get_pair_scorer", optional=True)
    names = pair_scorer_names()
    if name not in names:
        if name in registry() and registry()[name].needs_refs:
            raise CapscoreError(f"scorer {name!r} needs references; a probe scores (image, text) pairs: "
                                f"use one of {', '.join(names)}")
        raise unknown_name("scorer", name, names)
    if options and name != "abe":
        raise OptionError(f"ABE-CLIP's {{options:--abe-k/--abe-p/--abe-omega/--concept-pool}} apply to "
                          f"{{scorer:--scorer}} abe only; got {braced(repr(name))}")
    if options:
        make_config(**options)  # unknown options and bad values fail here, before any pair is scored
    row = get_metric(name)
    return MetricPairScorer(row, row.prefix_for("image", prefix), {"abe": dict(options)} if options else {})
