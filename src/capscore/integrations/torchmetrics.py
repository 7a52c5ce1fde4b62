"""``CaptionScore``: capscore metrics as a torchmetrics ``Metric``, for evaluation inside training loops.

The shell only holds running sums; each batch is scored by the functional core,
:func:`capscore.scores.functional.batch_values` (:func:`~capscore.scores.functional.score_batch`
below its argument checks, which ``update`` makes once): one
:class:`~capscore.embed.Encoder`, the same metric row and prefix as ``capscore score``,
and no run machinery per batch. So ``compute()`` equals the mean that ``capscore score``
prints for the same pairs.

States are ``score_sum`` (float64) and ``count``, both ``dist_reduce_fx="sum"``:
under DDP every process scores its shard and ``compute()`` returns the global
mean. Accumulating over several ``update`` calls equals one big update.

A classic metric (BLEU, METEOR, ROUGE-L, CIDEr-D, SPICE: text only, no model) gives its **headline**, as
``capscore score`` prints it and pycocoevalcap's ``compute_score`` returns it: corpus BLEU-n, the METEOR
jar's aggregate, the mean ROUGE-L / CIDEr-D / SPICE — never a mean of per-batch values. ``update`` checks
the captions and references and keeps them (a list state of UTF-8 JSON lines, ``dist_reduce_fx="cat"``,
so DDP gathers every process's items); ``compute()`` scores everything accumulated as one evaluated set
(CIDEr's IDF needs all of it), in one session of the Java tools (one PTB pass, one METEOR process), and
makes the headline from the items' sufficient statistics with the metric's own aggregate. ``images`` may
be None for these metrics.

Difference from ``torchmetrics.multimodal.CLIPScore``: torchmetrics reports
100·cos and clamps the *mean* (max(mean cos, 0)); capscore clamps *each pair*
(w·max(cos, 0), as the CLIPScore and PAC-S papers and their reference code do)
and uses w = 2.5 (CLIP-S) or 2 (PAC-S) and, by default, the "A photo depicts "
prefix. With ``prefix=""`` and every cosine positive,
``CaptionScore = 2.5/100 · torchmetrics CLIPScore`` on the same embeddings.
"""
from __future__ import annotations

import math

import torch
import json
import warnings

from capscore._optional import require
from capscore.errors import CapscoreError, param_error
from capscore.pipeline import DEFAULT_MODEL, check_fit
from capscore import validate
from capscore._log import warn
from capscore.api import get_encoder
from capscore.data.images import ImageRef
from capscore.data.records import Record
from capscore.scores.aggregate import aggregate_for
from capscore.scores.functional import batch_values, check_record, compute_values
from capscore.scores.metric import get_metric
from capscore.validate import empty_compute_warning

Metric = require("torchmetrics", purpose="capscore.integrations.torchmetrics").Metric


class CaptionScore(Metric):
    """Mean caption score over every (image, caption[, refs]) seen.

    Args:
        model: a model name (any capscore backbone; default ViT-B-32/openai, offline ``scenes-tiny``), a
            Backbone or an Encoder.
        metric: any registered image metric (default clip-s; ``capscore.scores.metric_names("image")``).
        prefix: default the metric's own (``Metric.prefix_for``).
        backbone_device: where the backbone runs; default the Metric's device at the first update.
        dtype, cache, batch_size, seed, context_length: as in :func:`capscore.score`.
        tokenizer, classic_backend: the classic metrics' options (``"ptb"``/``"simple"``/``"none"``;
            ``"native"``/``"pycocoevalcap"``; docs/classic.md).
        kwargs: torchmetrics ``Metric`` options (``sync_on_compute``, ``dist_sync_fn``...).

    ``update(images, captions, refs=None)``: images as :func:`capscore.score`
    takes them (tensors ``(N, C, H, W)`` uint8 or float in [0, 1], PIL images,
    paths); one caption per image; refs one list per image.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    score_sum: torch.Tensor
    count: torch.Tensor
    texts: list  # classic metrics: one uint8 tensor of JSON lines [caption, [refs]] per update

    def __init__(self, model=DEFAULT_MODEL, metric: str = "clip-s", *, prefix: str | None = None,
                 backbone_device: str | None = None, dtype: str = "fp32", cache=None, batch_size: int = 64,
                 seed: int = 0, context_length: int | None = None, tokenizer: str = "ptb",
                 classic_backend: str = "native", metric_weights: str | None = None, **kwargs):
        super().__init__(**kwargs)

        validate.check_options("CaptionScore", batch_size=batch_size, seed=seed, context_length=context_length,
                               prefix=prefix, dtype=dtype)
        row = get_metric(metric)
        row.formula("image")  # an unknown name, or a video-only metric, fails here
        self._text = row.text_only("image")
        self._classic = {"tokenizer": tokenizer, "classic_backend": classic_backend}
        if self._text and hasattr(row.image, "_options"):
            row.image._options(self._classic)  # a bad tokenizer or backend fails here, not at compute()
        elif "corpus" in row.needs("image"):  # a running mean of per-update values would be wrong
            raise CapscoreError(f"CaptionScore keeps a running mean; {metric}'s values depend on the whole evaluated "
                                "set (CIDEr's IDF), so score the set at once with capscore.score")
        self.model_spec = model
        self.metric_name = metric
        self._metric = row
        self.prefix = row.prefix_for("image", prefix)
        self._options = dict(dtype=dtype, cache=cache, batch_size=batch_size, seed=seed,
                             context_length=context_length)
        self._backbone_device = backbone_device
        self._own = dict(metric_weights=metric_weights, dtype=dtype) if row.own_models else None  # Polos, ...
        self._encoder = None
        self._warned_refs = False
        self.add_state("score_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("texts", default=[], dist_reduce_fx="cat")

    @property
    def encoder(self):
        if self._encoder is None:
            device = self._backbone_device or str(self.device)
            self._encoder = get_encoder(self.model_spec, device=device, **self._options)
            check_fit(self._metric, self._encoder.backbone)  # once, not per batch
        return self._encoder

    def update(self, images, captions, refs=None) -> None:
        if self._text:
            return self._keep_texts(images, captions, refs)
        validate.check_update_args(images, captions, refs)
        if isinstance(captions, str):
            captions = [captions]
        if len(captions) == 0:
            return
        if refs is not None and not self._metric.needs_refs and not self._warned_refs:
            self._warned_refs = True
            warn(f"metric {self._metric.name} ignores the references given; a reference-based metric uses them "
                 "(refclip-s, refpac-s)")
        if self._own is not None:  # a metric with its own models: no backbone, its models on the device
            own = {**self._own, "device": self._backbone_device or str(self.device)}
            values = batch_values(None, self._metric, list(images), captions, refs, prefix=self.prefix,
                                  options=own).scores
        else:
            values = batch_values(self.encoder, self._metric, list(images), captions, refs, prefix=self.prefix).scores
        if not all(math.isfinite(v) for v in values):  # a formula gave NaN (no item error reaches here)
            raise CapscoreError("CaptionScore: an item could not be scored")
        self.score_sum += torch.tensor(sum(values), dtype=torch.float64, device=self.score_sum.device)
        self.count += len(values)

    def _keep_texts(self, images, captions, refs) -> None:
        """A classic metric's update: check the items (one line naming ``captions[i]`` / ``refs[i]``) and keep
        their texts for :meth:`compute`."""
        if isinstance(captions, str):
            captions = [captions]
        if images is None:  # the text-only metrics read no image
            if isinstance(captions, (bytes, dict)) or not hasattr(captions, "__len__"):
                raise param_error("captions", "CaptionScore.update", "a list of strings", captions)
            images = [ImageRef(name=f"captions[{i}]") for i in range(len(captions))]
        validate.check_update_args(images, captions, refs)
        if refs is None:
            raise param_error("refs", "CaptionScore.update", f"one list of references per caption ({self.metric_name} "
                              "compares each caption with its references)", refs)
        lines = []
        for i, caption in enumerate(captions):
            rs = (refs[i],) if isinstance(refs[i], str) else tuple(refs[i])
            err = check_record(Record(str(i), ImageRef(), caption, rs, source=f"captions[{i}]"), self._metric)
            if err is not None:
                raise err
            lines.append(json.dumps([caption, list(rs)], ensure_ascii=False) + "\n")
        if lines:
            data = "".join(lines).encode("utf-8")
            self.texts.append(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.score_sum.device))

    def _classic_headline(self) -> float:
        """Every kept item scored as one evaluated set, and the metric's headline from their statistics (NaN
        when there is none; a SPICE item without an F is left out, as the summary of a run leaves it out)."""
        chunks = self.texts if isinstance(self.texts, list) else [self.texts]  # "cat" leaves one tensor after a sync
        data = b"".join(t.cpu().numpy().tobytes() for t in chunks)
        items = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
        if not items:
            return math.nan
        records = [Record(str(i), ImageRef(name=f"item {i}"), c, tuple(rs)) for i, (c, rs) in enumerate(items)]
        texts = lambda: (self.prefix + t for c, rs in items for t in (c, *rs))  # noqa: E731
        with self._metric.image.session(texts, self._classic):
            values = compute_values(None, self._metric, records, prefix=self.prefix, options=self._classic)
        own = aggregate_for(self._metric)
        for k, score in enumerate(values.scores):
            if math.isfinite(score):
                own.add({"score": score, **{c: v[k] for c, v in values.parts.items()}})
        value = own.value()
        return math.nan if value is None else value

    def compute(self) -> torch.Tensor:
        """The mean score (float32); NaN with a warning when nothing was scored (capscore.validate's choice).
        A classic metric: its headline over everything accumulated (module docstring), as float64 (the
        precision at which it equals pycocoevalcap's)."""
        if self._text:
            value = self._classic_headline()
            if math.isnan(value):
                warnings.warn(empty_compute_warning(), UserWarning, stacklevel=2)
            return torch.tensor(value, dtype=torch.float64, device=self.score_sum.device)
        if int(self.count) == 0:
            warnings.warn(empty_compute_warning(), UserWarning, stacklevel=2)
            return torch.tensor(float("nan"), dtype=torch.float32, device=self.score_sum.device)
        return (self.score_sum / self.count).to(torch.float32)
