"""The one Metric protocol and the one registry every face (CLI, API, torchmetrics, probes, report) reads.

A metric is a row (:class:`Metric`) holding everything capscore knows about it, once: its name, its
citation, the formula for each medium it scores, what the formula needs from the encoder, its
prefix on each medium (:meth:`Metric.prefix_for`), its score range, the backbone its paper used,
and its published constants (``Metric.w``, ``Metric.clamp``, read from its formula). A formula's
``compute`` turns an :class:`EmbeddingBatch` (records of one medium plus lazy access to their
embeddings) into one value per item. Metrics never own models; the faces hand them a batch whose
vectors come from the one encoder and cache of that backbone, through
:mod:`capscore.scores.functional` (``score_batch``, ``compute_values``) or, for the probes' pairs,
:mod:`capscore.scores.pairs`.

A metric may score images, videos or both (CLIP-S on a video is CLIP-S on the mean frame; PAC-S on a
video is the EMScore-style PAC-S of the paper's §4.3): ``image`` and ``video`` hold the formula for
each medium, ``None`` where the metric does not apply.

Adding a metric is one formula (a class with ``needs``, ``columns`` and ``compute``) plus one
:func:`register` call in its family's module; every ``--metric`` choice list, ``capscore.score``,
``score_batch``, ``CaptionScore``, the probes' ``--scorer`` (a reference-free image metric) and the
report then know it (tests/test_conformance.py and tests/test_metric_registry.py run each registered
metric through every face).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

from capscore._log import warn
from capscore.errors import CapscoreError, unknown_name

#: What a formula may need from the encoder (declared, so a face can check a backbone before scoring):
#: ``global`` vectors, text ``tokens``, image ``patches``, video ``frames``, ``refs`` (references),
#: ``parse`` (a parser such as spaCy), ``corpus`` (the whole evaluated set at once, e.g. CIDEr's IDF),
#: ``weights`` (the formula brings its own models, loaded from the released files of ``--metric-weights``,
#: and reads the items' images itself: Polos, DENEB, the judges; :mod:`capscore.scores.learned`).
NEEDS = frozenset({"global", "tokens", "patches", "frames", "refs", "parse", "corpus", "weights"})
#: The needs that take a backbone: a metric needing none of them reads text only (the classic metrics).
VECTOR_NEEDS = frozenset({"global", "tokens", "patches", "frames"})


@dataclass
class Values:
    """What a formula returns for a batch: one score per item (NaN = could not be scored) and, per extra
    column, one value per item (``image_score``/``ref_score`` for RefCLIP-S, EMScore's parts for videos)."""

    scores: list[float]
    parts: dict[str, list] = field(default_factory=dict)


class Formula(Protocol):
    """How a metric scores one medium: declared needs, extra row columns, and the computation."""

    needs: frozenset
    columns: tuple[str, ...]

    def compute(self, batch: "EmbeddingBatch") -> Values: ...


@dataclass
class EmbeddingBatch:
    """Validated records of one medium and lazy, memoised access to their embeddings.

    ``records`` carry image or video references, captions and references; ``prefix`` is prepended to
    captions and references alike. Every accessor goes through the one encoder (its dedupe, batching,
    device/dtype and cache), so two metrics on the same backbone share one encoding pass.
    """

    encoder: Any  # capscore.embed.Encoder
    records: Sequence  # capscore.data.records.Record
    prefix: str = ""
    medium: str = "image"
    options: Mapping = field(default_factory=dict)  # formula options (abe: k/p/omega/pool; video: sampling, idf)
    image_vectors: Any = None  # (N, D) when the pipeline already encoded the images to check them
    frame_list: Any = None  # list of (F, D) per video when the pipeline already encoded them

    def __len__(self) -> int:
        return len(self.records)

    @property
    def captions(self) -> list[str]:
        return [self.prefix + r.caption for r in self.records]

    def images(self):
        """(N, D) normalised image vectors."""
        if self.image_vectors is None:
            self.image_vectors = self.encoder.encode_images([r.image for r in self.records])
        return self.image_vectors

    def texts(self):
        """(N, D) normalised caption vectors (prefixed)."""
        return self.encoder.encode_texts(self.captions)

    def refs(self):
        """(N, R, D) reference vectors (prefixed) and their (N, R) mask, R = the most references of an item."""
        import torch  # noqa: PLC0415  (deferred: torch)

        R = max((len(r.refs) for r in self.records), default=0)
        flat = [self.prefix + ref for r in self.records for ref in r.refs]
        emb = self.encoder.encode_texts(flat)
        out = torch.zeros(len(self.records), R, emb.shape[-1])
        mask = torch.zeros(len(self.records), R, dtype=torch.bool)
        k = 0
        for row, r in enumerate(self.records):
            n = len(r.refs)
            out[row, :n] = emb[k: k + n]
            mask[row, :n] = True
            k += n
        return out, mask

    def frames(self):
        """One (F, D) tensor of frame vectors per video."""
        if self.frame_list is None:
            from capscore.data.video import video_of  # noqa: PLC0415  (deferred: numpy)

            self.frame_list = self.encoder.encode_videos([video_of(r) for r in self.records],
                                                         sampling=self.options.get("sampling"))
        return self.frame_list

    def text_tokens(self):
        """Per-token features of the captions (prefixed)."""
        return self.encoder.text_tokens(self.captions)

    def ref_tokens(self) -> dict:
        """Per-token features of every distinct reference (prefixed), by text."""
        uniq = list(dict.fromkeys(self.prefix + ref for r in self.records for ref in r.refs))
        return dict(zip(uniq, self.encoder.text_tokens(uniq)))


#: The backbone a metric's paper scored with when the row names none, and the default ``--model`` of every
#: face: CLIP-S's (Hessel et al. 2021, ViT-B/32 with OpenAI's weights). Offline: ``scenes-tiny``.
DEFAULT_MODEL = "ViT-B-32/openai"


@dataclass(frozen=True)
class Metric:
    """One row of the registry: everything capscore knows about a metric, written once.

    ``image`` / ``video``: the formula for each medium (None: not defined). ``needs_refs`` defaults to
    whether a formula declares ``refs`` in its needs. ``prefix`` / ``video_prefix``: the text the
    metric's reference code prepends to captions and references on each medium (:meth:`prefix_for`).
    ``range``: the score's range on images. ``default_model``: the backbone the metric's paper used (a
    name ``capscore models`` knows; "" for text-only metrics). ``weights_check(spec, family)``: a warning
    when a backbone's weights are not the ones the metric was made for (the numbers are still computed),
    else None; None = any CLIP-style weights fit. The published constants of a formula (the weight ``w``,
    the clamp) are read through the row (:attr:`w`, :attr:`clamp`).
    """

    name: str
    citation: str
    image: Formula | None = None
    video: Formula | None = None
    needs_refs: bool | None = None
    prefix: str = ""
    video_prefix: str = ""
    range: tuple[float, float] = (0.0, math.inf)
    note: str = ""
    default_model: str = DEFAULT_MODEL
    weights_check: Any = None
    # a zero-argument factory of the metric's own headline (capscore.scores.aggregate.Aggregate, e.g. a
    # corpus-level score from per-item statistics); None: the headline is the mean of the per-item scores
    aggregate: Any = None

    def __post_init__(self) -> None:
        if self.needs_refs is None:
            refs = any("refs" in getattr(self, m).needs for m in self.media)
            object.__setattr__(self, "needs_refs", refs)

    @property
    def media(self) -> tuple[str, ...]:
        return tuple(m for m in ("image", "video") if getattr(self, m) is not None)

    def formula(self, medium: str) -> Formula:
        f = getattr(self, medium, None) if medium in ("image", "video") else None
        if f is None:
            other = [m for m in self.media if m != medium]
            raise CapscoreError(f"metric {self.name!r} does not score {medium}s"
                                + (f"; it scores {other[0]}s" if other else ""))
        return f

    def needs(self, medium: str = "image") -> frozenset:
        return self.formula(medium).needs | ({"refs"} if self.needs_refs else frozenset())

    def text_only(self, medium: str | None = None) -> bool:
        """Whether the metric reads only the text (captions, references) on ``medium`` (default: on every
        medium it scores): no backbone, image or video is loaded for it, and its rows and summary record no
        model (the classic metrics)."""
        media = self.media if medium is None else (medium,)
        return not any(self.formula(m).needs & (VECTOR_NEEDS | {"weights"}) for m in media)

    def backbone_free(self, medium: str | None = None) -> bool:
        """Whether the metric needs no ``--model`` on ``medium`` (default: on every medium it scores): the
        text-only metrics, and those that bring their own models (need ``weights``: Polos, DENEB, FLEUR).
        Such a metric is scored once per run, its rows and summary naming no model."""
        media = self.media if medium is None else (medium,)
        return not any(self.formula(m).needs & VECTOR_NEEDS for m in media)

    @property
    def own_models(self) -> bool:
        """Whether the metric loads its own released models (need ``weights``; ``--metric-weights``)."""
        return any("weights" in self.formula(m).needs for m in self.media)

    def columns(self, medium: str = "image") -> tuple[str, ...]:
        """Extra row columns beside the score (e.g. image_score, ref_score)."""
        return tuple(self.formula(medium).columns)

    def prefix_for(self, medium: str = "image", override: str | None = None) -> str:
        """The prefix a run prepends to captions and references: ``override`` when given (``""`` = none),
        else the metric's own on ``medium``. Every face resolves it here, so they all score the same text."""
        if override is not None:
            return override
        return self.video_prefix if medium == "video" else self.prefix

    def compute(self, batch: EmbeddingBatch) -> Values:
        return self.formula(batch.medium).compute(batch)

    @property
    def w(self) -> float:
        """The weight of a CLIPScore-style formula (2.5 for CLIP-S, 2 for PAC-S, 1 for cosine); NaN for others."""
        w = getattr(self.image or self.video, "w", None)
        return math.nan if w is None else w

    @property
    def clamp(self) -> bool | None:
        """Whether each pair's cosine is clamped at 0 (CLIP-S, PAC-S) or not (cosine); None where it does not apply."""
        return getattr(self.image or self.video, "clamp", None)


METRICS: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Add a row (a name is registered once; a second row of the same name is a programming error)."""
    if metric.name in METRICS:
        raise ValueError(f"metric {metric.name!r} is registered twice")
    METRICS[metric.name] = metric
    return metric


#: The entry-point group through which an installed package registers metrics (docs/metric-plugins.md).
PLUGIN_GROUP = "capscore.metrics"
#: What went wrong loading each plug-in (entry-point name -> one line), for ``capscore models``.
PLUGIN_ERRORS: dict[str, str] = {}
_plugins_loaded = False


def load_plugins() -> None:
    """Register the metrics of every installed ``capscore.metrics`` entry point. An entry point names a
    :class:`Metric` row, a list of rows, or a zero-argument callable returning either (or registering its
    rows itself). A plug-in that fails to import, or gives something else, is one warning line naming it
    and its package; the built-in metrics and the other plug-ins still load."""
    for ep in entry_points(group=PLUGIN_GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, Metric):
                obj = obj()
            rows = [obj] if isinstance(obj, Metric) else list(obj or [])
            for row in rows:
                if not isinstance(row, Metric):
                    raise TypeError(f"gave {type(row).__name__}, not a capscore.scores.metric.Metric")
                if METRICS.get(row.name) is not row:
                    register(row)
        except Exception as e:  # noqa: BLE001  (a broken plug-in must not stop capscore)
            why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            PLUGIN_ERRORS[ep.name] = why
            warn(f"metric plug-in {ep.name!r} ({ep.value}, package {dist}) was not loaded: {why}")


def registry() -> dict[str, Metric]:
    """Every registered metric, by name (each family registers its rows when imported; the package's
    ``__init__`` imports them all, and it runs before any module of the package); the installed plug-ins'
    rows join at the first call (:func:`load_plugins`)."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        load_plugins()
    return METRICS


def get_metric(name: "str | Metric") -> Metric:
    """The registry row named ``name`` (a did-you-mean error for an unknown one)."""
    if isinstance(name, Metric):
        return name
    rows = registry()
    if name not in rows:
        raise unknown_name("metric", name, rows)
    return rows[name]


def metric_names(medium: str | None = None) -> tuple[str, ...]:
    """Names of the registered metrics (that score ``medium``, when given), in registration order."""
    return tuple(n for n, m in registry().items() if medium is None or getattr(m, medium) is not None)
