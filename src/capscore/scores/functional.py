"""The functional core under every face: aligned (image, caption[, references]) in, one value per item out.

As torchmetrics splits its functional API from its stateful modules, capscore's faces are shells over
two functions here:

* :func:`score_batch` — the public, tensor-level function: ``images`` (a 4-D pixel tensor or array, or a
  list of tensors, arrays, PIL images, paths), one caption per image and optional references in, a
  :class:`~capscore.scores.metric.Values` out (NaN where an item could not be scored). It checks its
  arguments once (:mod:`capscore.validate`) and calls :func:`batch_values`, which ``CaptionScore.update``
  calls after its own check.
* :func:`compute_values` — the same on typed records, below every boundary: the record checks every
  metric shares, each image or video read once through the encoder (a bad one raises, or is recorded in
  ``errors``), then the registry row's ``Metric.compute`` on one
  :class:`~capscore.scores.metric.EmbeddingBatch`. The pipeline's ``score_records`` (``capscore score``,
  ``capscore.score``, correlate, the Ray engine's blocks) and :func:`batch_values` reach it; the probes' pair
  scorers (:mod:`capscore.scores.pairs`) hand ``Metric.compute`` the same batch.

So a metric added to the registry is scored by the same code in every face.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from capscore.data.records import Record
from capscore.errors import InputError
from capscore.scores.metric import EmbeddingBatch, Metric, Values, get_metric
from capscore import validate
from capscore.validate import to_image_ref

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_record(rec, metric: Metric) -> InputError | None:
    """The record checks every metric shares: the caption and references are non-empty strings, and a
    reference-based metric has references. Returns the error naming the record (its source, else its id).
    A text-only metric (the classic ones) scores an empty caption as its reference code does (0), since a
    captioning model that wrote nothing is part of the evaluated set its corpus score covers."""
    where = rec.source or f"item {rec.id}"
    if not isinstance(rec.caption, str):
        return InputError(where, "caption is not a string", got=rec.caption)
    if _SURROGATE.search(rec.caption):
        return InputError(where, "the caption holds a lone surrogate (half of a UTF-16 pair): not Unicode text")
    if not rec.caption.strip() and not metric.text_only():
        return InputError(where, "empty caption")
    for r in rec.refs:
        if not isinstance(r, str) or not r.strip():
            return InputError(where, "empty or non-string reference", got=r)
        if _SURROGATE.search(r):
            return InputError(where, "a reference holds a lone surrogate (half of a UTF-16 pair): not Unicode text")
    if metric.needs_refs and not rec.refs:
        return InputError(where, f"{metric.name} needs references; none given")
    return None


def compute_values(encoder, metric: Metric, records: Sequence, *, medium: str = "image", prefix: str = "",
                   options: Mapping | None = None, errors: dict[int, str] | None = None) -> Values:
    """One value per record, in order (``parts``: the metric's extra columns, None where not scored; and
    ``error`` when the formula gives a reason for an item it scored NaN).

    ``prefix`` is the resolved one (``Metric.prefix_for``). A record that fails :func:`check_record`, or
    whose image or video cannot be read, raises :class:`InputError` — or, when ``errors`` is a dict, is
    recorded there (index -> one-line message) and scores NaN. Images are encoded first (one forward also
    gives the patch tokens a metric needs), so a bad file is found before the formula runs; ``encoder=None``
    serves text-only metrics (no media is read).
    """
    options = dict(options or {})
    bad: dict[int, str] = {}
    for i, rec in enumerate(records):
        err = check_record(rec, metric)
        if err is not None:
            if errors is None:
                raise err
            bad[i] = str(err)
    good = [i for i in range(len(records)) if i not in bad]
    batch = EmbeddingBatch(encoder, [], prefix, medium, options)
    if encoder is not None and medium == "video":
        from capscore.data.video import video_of  # noqa: PLC0415  (deferred: numpy)

        failed: dict[int, str] = {}  # collected even without ``errors``, so the first bad item is the one named
        frames = encoder.encode_videos([video_of(records[i]) for i in good], sampling=options.get("sampling"),
                                       errors=failed)
        if failed and errors is None:
            raise InputError.from_message(failed[min(failed)])
        batch.frame_list = [f for j, f in enumerate(frames) if j not in failed]
    elif encoder is not None:
        failed = {}
        vectors = encoder.encode_images([records[i].image for i in good], errors=None if errors is None else failed,
                                        patches="patches" in metric.needs(medium))  # one forward serves both
        batch.image_vectors = vectors if not failed else vectors[[j for j in range(len(good)) if j not in failed]]
    else:
        failed = {}
    for j, msg in failed.items():
        bad[good[j]] = msg
    good = [i for i in good if i not in bad]
    batch.records = [records[i] for i in good]
    values = metric.compute(batch) if good else Values([])
    scores = [math.nan] * len(records)
    parts = {c: [None] * len(records) for c in metric.columns(medium)}
    if "error" in values.parts:  # a formula's reason for each item it could not score (NaN), e.g. a judge's
        parts["error"] = [None] * len(records)
    for k, i in enumerate(good):
        scores[i] = values.scores[k]
        for c, column in parts.items():
            column[i] = values.parts[c][k] if c in values.parts else None
    if errors is not None:
        errors.update(bad)
    return Values(scores, parts)


def batch_values(encoder, metric: Metric, images, captions: Sequence[str], refs=None, *, prefix: str,
                 options: Mapping | None = None) -> Values:
    """:func:`score_batch` below its checks: arguments already validated, ``metric`` a row, ``prefix``
    resolved. Items are named ``images[i]`` / ``captions[i]`` in errors."""
    records = [Record(str(i), to_image_ref(img, f"images[{i}]"), cap,
                      () if refs is None else ((refs[i],) if isinstance(refs[i], str) else tuple(refs[i])),
                      source=f"captions[{i}]")
               for i, (img, cap) in enumerate(zip(images, captions))]
    return compute_values(encoder, metric, records, prefix=prefix, options=options)


def score_batch(encoder, metric: "str | Metric", images, captions: Sequence[str], refs=None, *,
                prefix: str | None = None, options: Mapping | None = None) -> Values:
    """Score aligned (image, caption[, references]) triples with one registered image metric.

    Parameters
    ----------
    encoder : an :class:`~capscore.embed.Encoder` (``capscore.api.get_encoder`` builds one for a model name).
    metric : a registered image metric's name (``capscore.scores.metric_names("image")``) or its row.
    images : a 4-D batch (torch ``(N, C, H, W)`` / numpy ``(N, H, W, C)``, uint8 or float in [0, 1]) or a
        list of such images, PIL images, paths or ``ImageRef`` s.
    captions : one string per image.
    refs : optional, one list of reference strings (or one string) per image.
    prefix : prepended to captions and references; default the metric's own (``Metric.prefix_for``).
    options : the formula's options (``{"abe": {"k": 3}}`` for ABE-CLIP).

    Returns the metric's :class:`~capscore.scores.metric.Values`: ``scores`` (one float per image) and
    ``parts`` (its extra columns, e.g. ``image_score`` and ``ref_score`` for RefCLIP-S). A bad argument
    raises a ``param_error``; a bad item an :class:`InputError` naming it.
    """
    row = get_metric(metric)
    row.formula("image")  # an unknown name, or a video-only metric, fails before anything is read
    validate.check_score_args("capscore.score_batch", images, captions, refs, candidates=False, prefix=prefix)
    return batch_values(encoder, row, list(images), captions, refs, prefix=row.prefix_for("image", prefix),
                        options=options)


__all__ = ["batch_values", "check_record", "compute_values", "score_batch"]
