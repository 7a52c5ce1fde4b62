"""The one-line Python API: ``capscore.score`` and ``capscore.score_frame``.

Both are thin shells over what ``capscore score`` runs: the arguments are checked
once (:mod:`capscore.validate`), the inputs become
:class:`~capscore.data.records.Record` s, one :class:`~capscore.embed.Encoder`
per backbone encodes them (dedupe, batching, device/dtype, cache), and the
pipeline (:func:`capscore.pipeline.iter_rows`) scores them with any registered
metric through :func:`capscore.scores.functional.compute_values`, the core
under :func:`~capscore.scores.functional.score_batch` and the torchmetrics
Metric, with the prefix decided by the metric's row (``Metric.prefix_for``).
So the same inputs give the same numbers here, on the CLI and in the
torchmetrics Metric.

Images may be paths, PIL images, ``ImageRef`` s, or pixel arrays:

* ``torch.Tensor``: ``(C, H, W)`` or a batch ``(N, C, H, W)``, C = 1 or 3
  (torchvision / torchmetrics layout);
* ``numpy.ndarray``: ``(H, W, C)`` or a batch ``(N, H, W, C)``, C = 1, 3 or 4
  (PIL / imageio layout); ``(H, W)`` is grayscale for both;
* dtype ``uint8`` (0–255) or floating point in [0, 1]. Floats are rounded to
  8 bits — the backbone's preprocessing starts from a PIL image, exactly as for
  a PNG file — so a float array and the PNG it would save as score the same.

Anything else (channels in the wrong place, floats outside [0, 1], int16…)
is rejected with an error saying what was expected, rather than guessed.
"""
from __future__ import annotations

from capscore import validate
from capscore._optional import require
from capscore.errors import CapscoreError, param_error
from capscore import pipeline
from capscore.pipeline import DEFAULT_MODEL, Summary, default_metric
from capscore.data.captions import BadItem
from capscore.data.images import ImageRef
from capscore.data.records import Record
from capscore.data.sources import InMemory
from capscore.embed.factory import Encoding, load_model, make_encoder
from capscore.scores.metric import get_metric

_BACKBONES: dict[tuple, object] = {}  # loaded backbones, reused across calls (weights are read once)


# ------------------------------------------------------------------------------------ engine
def get_encoder(model, *, device: str = "cpu", dtype: str = "fp32", cache=None, batch_size: int = 64,
                seed: int = 0, context_length: int | None = None, trust_remote_code: bool = False):
    """An :class:`~capscore.embed.Encoder` for a ``--model`` string (backbones are loaded once per process),
    a loaded :class:`~capscore.backbones.Backbone`, or an Encoder (returned as is); built by
    :func:`capscore.embed.make_encoder`. ``cache``: None or False keeps vectors in memory, True uses the
    persistent cache (``~/.cache/capscore`` or ``$CAPSCORE_CACHE``), a path one in that folder, and an
    opened cache is used as given."""
    from capscore.backbones import Backbone  # noqa: PLC0415  (deferred: numpy, torch)
    from capscore.embed.cache import EmbeddingCache  # noqa: PLC0415  (deferred: numpy)
    from capscore.embed.engine import Encoder, MemoryCache  # noqa: PLC0415  (deferred: numpy, torch)

    if isinstance(model, Encoder):
        return model
    if not isinstance(model, (str, Backbone)):
        raise param_error("model", "capscore.score", "a --model string (e.g. 'scenes-tiny'), a Backbone or an "
                          "Encoder", model)
    store = cache if isinstance(cache, (EmbeddingCache, MemoryCache)) else None
    persistent = store is None and cache is not None and cache is not False
    encoding = Encoding(device=device, dtype=dtype, seed=seed, context_length=context_length,
                        trust_remote_code=trust_remote_code, batch_size=batch_size, cache=persistent,
                        cache_dir=str(cache) if persistent and cache is not True else None)
    if isinstance(model, str):
        key = (model, device, dtype, seed, context_length, trust_remote_code)
        if key not in _BACKBONES:
            _BACKBONES[key] = load_model(model, encoding)
        model = _BACKBONES[key]
    return make_encoder(model, encoding, store=store)


def _names(value, what: str) -> list:
    if isinstance(value, (list, tuple)):
        if not value:
            raise param_error(what, "capscore.score", f"a {what} name or a non-empty list", value)
        return list(value)
    return [value]


def _items(images: list, captions, refs, bad: dict, name) -> tuple[list, list]:
    """The items the pipeline scores (a Record per caption; a BadItem for each item ``bad`` holds, which
    becomes an error row) and each one's (image index, candidate index)."""
    items, index = [], []
    for i, (img, cap) in enumerate(zip(images, captions)):
        several = isinstance(cap, (list, tuple))
        ref = None if i in bad else validate.to_image_ref(img, name("images", i))
        rs = () if refs is None or i in bad else ((refs[i],) if isinstance(refs[i], str) else tuple(refs[i]))
        for j, c in enumerate(list(cap) if several else [cap]):
            rid = f"{i}/{j}" if several else str(i)
            if i in bad:
                items.append(BadItem(rid, name("images", i), c if isinstance(c, str) else repr(c), "", bad[i].where,
                                     bad[i].what))
            else:
                items.append(Record.make(rid, ref, c, rs, source=name("captions", i) + (f"[{j}]" if several else "")))
            index.append((i, j))
    return items, index


def score(
    images,
    captions,
    refs=None,
    *,
    model=DEFAULT_MODEL,
    metric=None,
    prefix: str | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    cache=None,
    batch_size: int = 64,
    seed: int = 0,
    context_length: int | None = None,
    skip_bad: bool = False,
    as_frame: bool = False,
    aggregate: bool = False,
    metric_weights: str | None = None,
):
    """Score captions against images; the numbers ``capscore score`` writes for the same inputs.

    Parameters
    ----------
    images : sequence of paths, PIL images, tensors or arrays, or a batched tensor/array (module docstring);
        ``None`` when every metric reads text only (bleu1-4, meteor, rouge-l, cider, spice).
    captions : one string per image, or one list of candidate strings per image (one row per candidate).
    refs : optional, one list of reference strings (or one string) per image; needed by refclip-s/refpac-s
        and the classic metrics.
    model : a model name (``capscore models``), a Backbone or an Encoder; or a list of names. Default
        ``ViT-B-32/openai``, CLIP-S's backbone; offline, ``model="scenes-tiny"`` is the bundled model. The
        text-only metrics load no model (their rows' ``model`` is None).
    metric : any registered image metric (``capscore.scores.metric_names("image")``), or a list. Default:
        refclip-s when ``refs`` are given (its rows also carry the CLIP-S part, ``image_score``), else clip-s.
    prefix : prepended to captions and references; default the metric's own ("A photo depicts " for the
        CLIP-S/PAC-S family, "" for mcs, abe and cosine) — ``Metric.prefix_for``.
    device, dtype : where and in what precision the backbone runs ("cpu"/"cuda[:N]", "fp32"/"fp16"/"bf16").
    cache : None (in memory), True (the default cache folder), a folder path, or a cache object.
    skip_bad : a bad item gives None (and an ``error`` in the frame) instead of raising.
    as_frame : return a pandas DataFrame (needed for several models or metrics) with columns
        ``model, metric, index, candidate, caption, score, error`` (+ each metric's extra columns, e.g.
        ``image_score, ref_score`` for the reference-based metrics, ``stats`` for BLEU and METEOR); its
        ``attrs["headlines"]`` holds each (model, metric)'s headline (as ``aggregate=True`` gives it).
    aggregate : return the headline instead of the per-caption scores: what ``capscore score`` prints and
        papers report — corpus BLEU-n, METEOR's aggregate (the jar's), the mean for ROUGE-L, CIDEr-D, SPICE
        and every other metric. A float for one metric (``metric="bleu4"``), a ``{metric: value}`` dict for a
        list of metrics; one model. The per-caption values are sentence-level (docs/classic.md).
    metric_weights : the folder of the released files of the metrics with their own models (polos, deneb,
        fleur, reffleur, expert: docs/learned.md); default ``$CAPSCORE_METRIC_WEIGHTS`` or
        ``~/.cache/capscore/metric-weights``. Those metrics load no ``model`` (their rows' ``model`` is None).

    Returns ``list[float | None]`` (one per caption, in order), a DataFrame, or the headline(s).
    """
    return _score(images, captions, refs, func="capscore.score", name=validate.item_name, model=model,
                  metric=metric, prefix=prefix, device=device, dtype=dtype, cache=cache, batch_size=batch_size,
                  seed=seed, context_length=context_length, skip_bad=skip_bad, as_frame=as_frame,
                  aggregate=aggregate, metric_weights=metric_weights)


def _own_encoding(device: str, dtype: str, cache) -> Encoding:
    """Where the metrics with their own models run, and where their towers' vectors go: ``cache`` read as
    :func:`get_encoder` reads it (a cache object: in memory, for a run without a backbone)."""
    persistent = cache is not None and cache is not False and not hasattr(cache, "get_many")
    return Encoding(device=device, dtype=dtype, cache=persistent,
                    cache_dir=str(cache) if persistent and cache is not True else None)


def _score(images, captions, refs, *, func: str, name, model, metric, prefix, device, dtype, cache, batch_size, seed,
           context_length, skip_bad, as_frame, aggregate=False, metric_weights=None):
    validate.check_bool(aggregate, "aggregate", func)
    models = _names(model, "model")
    several_metrics = isinstance(metric, (list, tuple))
    metrics = _names(default_metric(has_refs=refs is not None, models=models) if metric is None else metric,
                     "metric")
    text_only = all(get_metric(m).text_only("image") for m in metrics)  # an unknown name fails here
    if images is None:
        if not text_only:
            raise param_error("images", func, "the images the metrics score (None only when every metric reads "
                              "text only: bleu1-4, meteor, rouge-l, cider, spice)", images)
        if isinstance(captions, (str, bytes)) or not hasattr(captions, "__len__"):
            raise param_error("captions", func, "a list of strings, one per item", captions)

        images = [ImageRef(name=name("captions", i)) for i in range(len(captions))]
    bad = validate.check_score_args(func, images, captions, refs, name=name, batch_size=batch_size, seed=seed,
                                    context_length=context_length, skip_bad=skip_bad, as_frame=as_frame,
                                    prefix=prefix, device=device, dtype=dtype)

    if all(get_metric(m).backbone_free("image") for m in metrics):
        models = []  # the text-only metrics, and those with their own models ($CAPSCORE_METRIC_WEIGHTS), load none
    if aggregate and (as_frame or len(models) > 1):
        raise CapscoreError(f"{func}: aggregate=True gives the headline of one model's metrics; for several models "
                            "pass as_frame=True (its attrs['headlines'] holds each one)")
    if (len(models) > 1 or len(metrics) > 1) and not (as_frame or aggregate):
        raise CapscoreError(f"{func}: several models or metrics give a table; pass as_frame=True")
    if text_only and refs is None:  # the text-only metrics are all reference-based
        raise param_error("refs", func, f"one list of references per image ({', '.join(metrics)} compare each "
                          "caption with its references)", refs)
    items, index = _items(list(images), captions, refs, bad, name)
    # the job checks the metric names (did-you-mean, the medium) before any model is loaded
    job = pipeline.ScoreJob(source=InMemory(tuple(items)), models=tuple(models), metrics=tuple(metrics), prefix=prefix,
                            skip_bad=skip_bad, chunk_size=max(1, len(items)), progress=False,
                            encoding=_own_encoding(device, dtype, cache),  # where metrics with their own models run
                            options={"metric_weights": metric_weights} if metric_weights is not None else {})
    encoders = {}
    for mdl in models if job.encodes else ():
        enc = get_encoder(mdl, device=device, dtype=dtype, cache=cache, batch_size=batch_size, seed=seed,
                          context_length=context_length)
        encoders[mdl if isinstance(mdl, str) else enc.backbone.spec] = enc
    rows, summaries = [], {}
    for k, r in enumerate(pipeline.iter_rows(job, encoders=encoders)):
        i, j = index[k % len(items)]
        key = (r["model"], r["metric"])
        if key not in summaries:
            summaries[key] = Summary(r["metric"], model=r["model"])
        summaries[key].add(r)
        extra = {c: r[c] for c in r if c not in _ROW_KEYS}
        rows.append({"model": r["model"], "metric": r["metric"], "index": i, "candidate": j, "caption": r["caption"],
                     "score": r["score"], "error": r["error"], **extra})
    heads = [_headline(s) for s in summaries.values()]
    if aggregate:
        values = {h["metric"]: h["value"] for h in heads}
        return values if several_metrics else values[metrics[0]]
    if not as_frame:
        return [r["score"] for r in rows]
    pd = require("pandas", purpose="a DataFrame result (as_frame=True)")
    frame = pd.DataFrame(rows)
    frame.attrs["headlines"] = heads
    return frame


def _headline(summary) -> dict:
    """A (model, metric)'s headline from its summary: the metric's own aggregate (corpus BLEU, ...), else the
    mean; with the mean of the per-caption scores and what they are."""
    d = summary.as_dict()
    own = d.get("aggregate") or {}
    return {"model": d["model"], "metric": d["metric"], "headline": own.get("name", "mean"),
            "value": own["value"] if own else d["mean"], "mean": d["mean"], "count": d["count"],
            "per_caption": own.get("per_caption", "")}


_ROW_KEYS = frozenset({"id", "image", "caption", "system", "model", "metric", "score", "error"})


def score_frame(df, image_col: str, caption_col: str, refs_col: str | None = None, *, model=DEFAULT_MODEL,
                metric=None, prefix: str | None = None, device: str = "cpu", dtype: str = "fp32", cache=None,
                batch_size: int = 64, seed: int = 0, context_length: int | None = None, skip_bad: bool = False,
                metric_weights: str | None = None):
    """``df`` with score columns added (a copy), one row per row of ``df``.

    One model and one metric add ``score`` (and ``image_score``, ``ref_score``
    for reference-based metrics); several add ``score[MODEL|METRIC]`` per pair.
    The keyword options are those of :func:`score`. A bad cell is an error naming its row and column
    (with ``skip_bad=True``, an ``error`` in that row).
    """
    func = "capscore.score_frame"
    validate.check_frame_args(df, image_col, caption_col, refs_col, func=func)
    if any(isinstance(c, (list, tuple)) for c in df[caption_col]):
        raise CapscoreError(f"{func}: column {caption_col!r} holds lists; give one caption per row "
                            "(explode the frame first), or use capscore.score for several candidates per image")
    column = {"images": image_col, "captions": caption_col, "refs": refs_col}
    labels = list(df.index)

    def name(kind: str, i: int) -> str:
        return f"row {i} (index {labels[i]!r}), column {column[kind]!r}"

    refs = None if refs_col is None else list(df[refs_col])
    long = _score(list(df[image_col]), list(df[caption_col]), refs, func=func, name=name, model=model, metric=metric,
                  prefix=prefix, device=device, dtype=dtype, cache=cache, batch_size=batch_size, seed=seed,
                  context_length=context_length, skip_bad=skip_bad, as_frame=True, metric_weights=metric_weights)
    out = df.copy()
    out.attrs["headlines"] = long.attrs["headlines"]
    pairs = list(dict.fromkeys(zip(long["model"], long["metric"])))
    for mdl, met in pairs:
        part = long[(long["model"] == mdl) & (long["metric"] == met)]
        suffix = "" if len(pairs) == 1 else f"[{mdl}|{met}]"
        for col in ("score", "image_score", "ref_score", "error"):
            if col in part and (col != "error" or part[col].notna().any()):
                out[col + suffix] = part[col].to_numpy()
    return out
