"""The one-line Python API: ``capscore.score`` and ``capscore.score_frame``.

Both are thin shells over what ``capscore score`` runs: the inputs become
:class:`~capscore.data.records.Record` s, one :class:`~capscore.embed.Encoder`
per backbone encodes them (dedupe, batching, device/dtype, cache), and the
pipeline (:func:`capscore.pipeline.iter_rows`) scores them with any registered
metric, with the prefix decided by
:func:`~capscore.scores.clipscore.resolve_prefix`. So the same inputs give the
same numbers here, on the CLI and in the torchmetrics Metric.

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

import os
from collections.abc import Sequence
from pathlib import Path

from capscore import validate
from capscore._optional import require
from capscore.errors import CapscoreError, InputError, param_error
from capscore.pipeline import DEFAULT_MODEL
from capscore.scores.metric import get_metric

_BACKBONES: dict[tuple, object] = {}  # loaded backbones, reused across calls (weights are read once)


# ------------------------------------------------------------------------------------ images
def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _is_numpy(x) -> bool:
    return type(x).__module__.split(".")[0] == "numpy" and hasattr(x, "shape")


def _as_batch(images) -> list:
    """A batched tensor/array -> list of single images; a sequence -> list."""
    validate.check_images_container(images)
    if _is_torch(images) and images.ndim == 4:
        return list(images)
    if _is_numpy(images) and images.ndim == 4:
        return list(images)
    if _is_torch(images) or _is_numpy(images):
        raise param_error("images", "capscore.score", "a sequence of images or a 4-D batch "
                          "(torch (N, C, H, W) / numpy (N, H, W, C))", f"a {images.ndim}-D array")
    if isinstance(images, (str, os.PathLike)) or not isinstance(images, Sequence):
        raise param_error("images", "capscore.score", "a sequence (list) of images", images)
    return list(images)


def pixels_to_pil(x, where: str = "image"):
    """A torch (C, H, W) / numpy (H, W, C) uint8 or [0, 1] float array -> RGB PIL image (module docstring)."""
    import numpy as np
    from PIL import Image

    torch_layout = _is_torch(x)
    arr = x.detach().cpu().numpy() if torch_layout else np.asarray(x)
    layout = "(C, H, W)" if torch_layout else "(H, W, C)"
    kind = "torch tensor" if torch_layout else "numpy array"
    if arr.ndim == 3:
        if torch_layout:
            if arr.shape[0] not in (1, 3):
                hint = " (it looks channels-last: use x.permute(2, 0, 1))" if arr.shape[-1] in (1, 3, 4) else ""
                raise CapscoreError(f"{where}: a {kind} image must be {layout} with C = 1 or 3; "
                                    f"got shape {tuple(arr.shape)}{hint}")
            arr = arr.transpose(1, 2, 0)
        elif arr.shape[-1] not in (1, 3, 4):
            hint = " (it looks channels-first: use x.transpose(1, 2, 0))" if arr.shape[0] in (1, 3) else ""
            raise CapscoreError(f"{where}: a {kind} image must be {layout} with C = 1, 3 or 4; "
                                f"got shape {tuple(arr.shape)}{hint}")
        if arr.shape[-1] == 1:
            arr = arr[..., 0]
    elif arr.ndim != 2:
        raise CapscoreError(f"{where}: a {kind} image must be {layout} or (H, W); got shape {tuple(arr.shape)}")
    if (problem := validate.pixel_problem(arr)) is not None:
        raise InputError(where, problem)
    if arr.dtype == np.uint8:
        pass
    elif np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all():
            raise CapscoreError(f"{where}: float image contains NaN or inf")
        lo, hi = float(arr.min()), float(arr.max())
        if lo < 0 or hi > 1:
            raise CapscoreError(f"{where}: float images must be in [0, 1]; got values in [{lo:g}, {hi:g}] "
                                "(pass uint8 for 0-255 pixels, or divide by 255)")
        arr = np.round(arr.astype(np.float64) * 255).astype(np.uint8)
    else:
        raise CapscoreError(f"{where}: image dtype must be uint8 (0-255) or float in [0, 1]; got {arr.dtype}")
    return Image.fromarray(np.ascontiguousarray(arr)).convert("RGB")


def to_image_ref(x, where: str = "image"):
    """Any accepted image input -> :class:`~capscore.data.images.ImageRef`."""
    from PIL import Image

    from capscore.data.images import ImageRef

    if isinstance(x, ImageRef):
        return x
    if isinstance(x, (str, os.PathLike)):
        return ImageRef(path=Path(x).expanduser(), name=f"{where}: {x}")
    if (problem := validate.image_problem(x)) is not None:  # raised by score() unless skip_bad
        return validate.broken_image(where, problem)
    if isinstance(x, Image.Image):
        return ImageRef(image=x, name=where)
    if _is_torch(x) or _is_numpy(x):
        return ImageRef(image=pixels_to_pil(x, where), name=where)
    raise CapscoreError(f"{where}: expected a path, a PIL image, a torch tensor or a numpy array; "
                        f"got {type(x).__name__}")


# ------------------------------------------------------------------------------------ engine
def get_encoder(model, *, device: str = "cpu", dtype: str = "fp32", cache=None, batch_size: int = 64,
                seed: int = 0, context_length: int | None = None, trust_remote_code: bool = False):
    """An :class:`~capscore.embed.Encoder` for a ``--model`` string (backbones are loaded once per process),
    a loaded :class:`~capscore.backbones.Backbone`, or an Encoder (returned as is); built by
    :func:`capscore.embed.make_encoder`. ``cache``: None or False keeps vectors in memory, True uses the
    persistent cache (``~/.cache/capscore`` or ``$CAPSCORE_CACHE``), a path one in that folder, and an
    opened cache is used as given."""
    from capscore.backbones import Backbone
    from capscore.embed.cache import EmbeddingCache
    from capscore.embed.engine import Encoder, MemoryCache
    from capscore.embed.factory import Encoding, load_model, make_encoder

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


def _records(images: list, captions, refs):
    from capscore.data.records import Record

    if isinstance(captions, str) or not isinstance(captions, Sequence):
        raise param_error("captions", "capscore.score", "a list of strings, one per image (or a list of "
                          "candidates per image)", captions)
    if len(captions) != len(images):
        raise CapscoreError(f"capscore.score: {len(images)} images but {len(captions)} captions; "
                            "give one caption (or one list of candidates) per image")
    if refs is not None:
        if isinstance(refs, str) or not isinstance(refs, Sequence) or len(refs) != len(images):
            raise param_error("refs", "capscore.score", f"a list of {len(images)} reference lists (one per image)",
                              refs)
    records, index = [], []
    for i, (img, cap) in enumerate(zip(images, captions)):
        ref = to_image_ref(img, f"images[{i}]")
        rs = () if refs is None else ((refs[i],) if isinstance(refs[i], str) else tuple(refs[i]))
        cands = list(cap) if isinstance(cap, (list, tuple)) else [cap]
        for j, c in enumerate(cands):
            rid = str(i) if len(cands) == 1 and not isinstance(cap, (list, tuple)) else f"{i}/{j}"
            records.append(Record.make(rid, ref, c, rs, source=f"captions[{i}]" + (f"[{j}]" if rid != str(i) else "")))
            index.append((i, j))
    return records, index


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
):
    """Score captions against images; the numbers ``capscore score`` writes for the same inputs.

    Parameters
    ----------
    images : sequence of paths, PIL images, tensors or arrays, or a batched tensor/array (module docstring).
    captions : one string per image, or one list of candidate strings per image (one row per candidate).
    refs : optional, one list of reference strings (or one string) per image; needed by refclip-s/refpac-s.
    model : a model name (``capscore models``), a Backbone or an Encoder; or a list of names. Default
        ``ViT-B-32/openai``, CLIP-S's backbone; offline, ``model="scenes-tiny"`` is the bundled model.
    metric : any registered image metric (``capscore.scores.metric_names("image")``), or a list. Default:
        refclip-s when ``refs`` are given (its rows also carry the CLIP-S part, ``image_score``), else clip-s.
    prefix : prepended to captions and references; default the metric's own ("A photo depicts " for the
        CLIP-S/PAC-S family, "" for mcs and abe) — :func:`capscore.scores.clipscore.resolve_prefix`.
    device, dtype : where and in what precision the backbone runs ("cpu"/"cuda[:N]", "fp32"/"fp16"/"bf16").
    cache : None (in memory), True (the default cache folder), a folder path, or a cache object.
    skip_bad : a bad item gives None (and an ``error`` in the frame) instead of raising.
    as_frame : return a pandas DataFrame (needed for several models or metrics) with columns
        ``model, metric, index, candidate, caption, score, error`` (+ each metric's extra columns, e.g.
        ``image_score, ref_score`` for the reference-based metrics).

    Returns ``list[float | None]`` (one per caption, in order) or a DataFrame.
    """
    validate.check_score_args("capscore.score", images, captions, refs, batch_size=batch_size, seed=seed,
                              context_length=context_length, skip_bad=skip_bad, as_frame=as_frame, prefix=prefix,
                              device=device, dtype=dtype)
    from capscore.data.sources import InMemory
    from capscore.pipeline import ScoreJob, default_metric, iter_rows

    models = _names(model, "model")
    metrics = _names(default_metric(has_refs=refs is not None, models=models) if metric is None else metric,
                     "metric")
    for m in metrics:
        get_metric(m).formula("image")  # unknown names fail before anything is loaded
    if (len(models) > 1 or len(metrics) > 1) and not as_frame:
        raise CapscoreError("capscore.score: several models or metrics give a table; pass as_frame=True")
    records, index = _records(_as_batch(images), captions, refs)
    encoders = {}
    for mdl in models:
        enc = get_encoder(mdl, device=device, dtype=dtype, cache=cache, batch_size=batch_size, seed=seed,
                          context_length=context_length)
        encoders[mdl if isinstance(mdl, str) else enc.backbone.spec] = enc
    job = ScoreJob(source=InMemory(tuple(records)), models=tuple(encoders), metrics=tuple(metrics), prefix=prefix,
                   skip_bad=skip_bad, chunk_size=max(1, len(records)), progress=False)
    rows = []
    for k, r in enumerate(iter_rows(job, encoders=encoders)):
        i, j = index[k % len(records)]
        extra = {c: r[c] for c in r if c not in _ROW_KEYS}
        rows.append({"model": r["model"], "metric": r["metric"], "index": i, "candidate": j, "caption": r["caption"],
                     "score": r["score"], "error": r["error"], **extra})
    if not as_frame:
        return [r["score"] for r in rows]
    pd = require("pandas", purpose="a DataFrame result (as_frame=True)")
    return pd.DataFrame(rows)


_ROW_KEYS = frozenset({"id", "image", "caption", "system", "model", "metric", "score", "error"})


def score_frame(df, image_col: str, caption_col: str, refs_col: str | None = None, *, model=DEFAULT_MODEL,
                metric=None, **options):
    """``df`` with score columns added (a copy), one row per row of ``df``.

    One model and one metric add ``score`` (and ``image_score``, ``ref_score``
    for reference-based metrics); several add ``score[MODEL|METRIC]`` per pair.
    ``options`` are those of :func:`score` (prefix, device, dtype, cache, ...).
    """
    validate.check_frame_args(df, image_col, caption_col, refs_col)
    for col in (image_col, caption_col, refs_col):
        if col is not None and col not in df.columns:
            raise CapscoreError(f"capscore.score_frame: no column {col!r}; columns are {list(df.columns)}")
    refs = None if refs_col is None else list(df[refs_col])
    if any(isinstance(c, (list, tuple)) for c in df[caption_col]):
        raise CapscoreError(f"capscore.score_frame: column {caption_col!r} holds lists; give one caption per row "
                            "(explode the frame first), or use capscore.score for several candidates per image")
    long = score(list(df[image_col]), list(df[caption_col]), refs, model=model, metric=metric, as_frame=True,
                 **options)
    out = df.copy()
    pairs = list(dict.fromkeys(zip(long["model"], long["metric"])))
    for mdl, met in pairs:
        part = long[(long["model"] == mdl) & (long["metric"] == met)]
        suffix = "" if len(pairs) == 1 else f"[{mdl}|{met}]"
        for col in ("score", "image_score", "ref_score", "error"):
            if col in part and (col != "error" or part[col].notna().any()):
                out[col + suffix] = part[col].to_numpy()
    return out
