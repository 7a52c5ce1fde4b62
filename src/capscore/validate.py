"""Boundary checks and conversions of the Python faces (``capscore.score``, ``score_frame``, ``score_batch``,
``CaptionScore``): each face checks its arguments here once; what lies below trusts them.

Pure functions, in the scikit-learn style: a wrong *argument* raises
:func:`~capscore.errors.param_error` ("The 'batch_size' parameter of capscore.score
must be an int >= 1; got 0 instead."), before anything is loaded or encoded.

A wrong *item* (one image among many: zero-sized, NaN or inf pixels, floats
outside [0, 1], over the decompression-bomb or aspect guard that files have,
:func:`capscore.data.images.check_dimensions`; or references that are not a list
of strings, such as a NaN cell of a DataFrame) is an :class:`~capscore.errors.InputError`
naming the item (``images[i]``, ``refs[i]``, or the row of a DataFrame): raised at the
boundary by :func:`check_score_args`, or, with ``skip_bad=True``, returned so that the
face turns the item into an error row (score ``None``) and scores the others.

Choices: an empty ``images``/``captions`` pair is valid for :func:`capscore.score`
(it returns ``[]``) and for ``CaptionScore.update`` (a no-op: the tail batch of a
sharded loader may be empty); ``score_frame`` on a frame with no rows is an error
(there is nothing to add a column to that the caller could not check first); and
``CaptionScore.compute()`` before any pair was scored warns and returns NaN — the
mean of nothing is undefined, never 0.0.
"""
from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from capscore.errors import CapscoreError, InputError, param_error, short_repr
from capscore.data.images import ImageRef, check_dimensions

DTYPES = ("fp32", "fp16", "bf16")


# ------------------------------------------------------------------------------------ options
def check_int(value, name: str, func: str, *, minimum: int | None = None, optional: bool = False) -> None:
    if optional and value is None:
        return
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or (minimum is not None and value < minimum):
        want = "an int" + (f" >= {minimum}" if minimum is not None else "") + (" or None" if optional else "")
        raise param_error(name, func, want, value)


def check_bool(value, name: str, func: str) -> None:
    if not isinstance(value, bool):
        raise param_error(name, func, "True or False", value)


def check_str(value, name: str, func: str, *, optional: bool = False, choices: Sequence[str] | None = None) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or (choices is not None and value not in choices):
        want = (f"one of {list(choices)}" if choices else "a string") + (" or None" if optional else "")
        raise param_error(name, func, want, value)


def check_options(func: str, *, batch_size=64, seed=0, context_length=None, skip_bad=False, as_frame=False,
                  prefix=None, device="cpu", dtype="fp32") -> None:
    """The keyword options of :func:`capscore.score` (and those passed on by score_frame / CaptionScore)."""
    check_int(batch_size, "batch_size", func, minimum=1)
    check_int(seed, "seed", func)
    check_int(context_length, "context_length", func, minimum=1, optional=True)
    check_bool(skip_bad, "skip_bad", func)
    check_bool(as_frame, "as_frame", func)
    check_str(prefix, "prefix", func, optional=True)
    check_str(device, "device", func)
    check_str(dtype, "dtype", func, choices=DTYPES)


# ------------------------------------------------------------------------------------ images
def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _is_numpy(x) -> bool:
    return type(x).__module__.split(".")[0] == "numpy" and hasattr(x, "shape")


def check_images_container(images, func: str = "capscore.score") -> None:
    """``images``: a sequence, or a 4-D torch (N, C, H, W) / numpy (N, H, W, C) batch."""
    if _is_torch(images) or _is_numpy(images):
        if images.ndim != 4:
            raise param_error("images", func, "a sequence of images or a 4-D batch (torch (N, C, H, W) / numpy "
                              "(N, H, W, C))", f"a {images.ndim}-D array of shape {tuple(images.shape)}")
        return
    if isinstance(images, (str, bytes, os.PathLike)) or not isinstance(images, Sequence):
        raise param_error("images", func, "a sequence (list) of images or a 4-D batch", images)


def pixel_problem(arr) -> str | None:
    """Why a numpy pixel array (already in (H, W[, C]) layout) cannot be an image, or None.

    Checks emptiness, then the size/aspect guard that image files get, then NaN/inf and the
    float range, in that order (the cheap header-like checks first)."""
    import numpy as np  # noqa: PLC0415  (deferred: numpy)

    h, w = (int(arr.shape[0]), int(arr.shape[1])) if arr.ndim >= 2 else (0, 0)
    if arr.size == 0 or h == 0 or w == 0:
        return f"image has no pixels (shape {tuple(arr.shape)})"
    try:
        check_dimensions((w, h), "image")
    except InputError as e:
        return e.what
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all():
            return "float image contains NaN or inf"
        lo, hi = float(arr.min()), float(arr.max())
        if lo < 0 or hi > 1:
            return (f"float images must be in [0, 1]; got values in [{lo:g}, {hi:g}] "
                    "(pass uint8 for 0-255 pixels, or divide by 255)")
    return None


def image_problem(x) -> str | None:
    """Why one image argument (tensor, array or PIL image) cannot be scored, or None (paths are checked
    when read). Layout and dtype mistakes are left to :func:`pixels_to_pil`, which names the fix."""
    import numpy as np  # noqa: PLC0415  (deferred: numpy)

    if isinstance(x, Image.Image):
        w, h = x.size
        if w < 1 or h < 1:
            return f"image has no pixels ({w}x{h})"

        try:
            check_dimensions((w, h), "image")
        except InputError as e:
            return e.what
        return None
    if not (_is_torch(x) or _is_numpy(x)):
        return None
    arr = x.detach().cpu().numpy() if _is_torch(x) else np.asarray(x)
    if arr.ndim == 3 and _is_torch(x):
        arr = arr.transpose(1, 2, 0)
    if arr.ndim not in (2, 3):
        return None  # a layout problem: pixels_to_pil says how to fix it
    return pixel_problem(arr)


def refs_problem(r) -> str | None:
    """Why one item's ``refs`` cannot be its references (a list of strings, or one string), or None.
    The strings themselves are checked with the item (:func:`capscore.scores.functional.check_record`)."""
    if isinstance(r, str) or isinstance(r, (list, tuple)) or (_is_numpy(r) and r.ndim == 1):
        return None
    if isinstance(r, float) and r != r:
        return "references are NaN (an empty cell?); expected a list of reference strings"
    return f"references must be a list of strings (or one string); got {type(r).__name__} {short_repr(r)}"


def pixels_to_pil(x, where: str = "image"):
    """A torch (C, H, W) / numpy (H, W, C) uint8 or [0, 1] float array -> RGB PIL image.

    Values are checked at the boundary (:func:`image_problem`); here the layout and the dtype are: a torch
    tensor that looks channels-last, a numpy array that looks channels-first, other dtypes and ranks are
    refused with the fix, never guessed. Floats are rounded to 8 bits, as saving a PNG would."""
    import numpy as np  # noqa: PLC0415  (deferred: numpy)

    torch_layout = _is_torch(x)
    arr = x.detach().cpu().numpy() if torch_layout else np.asarray(x)
    layout = "(C, H, W)" if torch_layout else "(H, W, C)"
    kind = "torch tensor" if torch_layout else "numpy array"
    if arr.ndim == 3:
        if torch_layout and arr.shape[0] not in (1, 3):
            hint = " (it looks channels-last: use x.permute(2, 0, 1))" if arr.shape[-1] in (1, 3, 4) else ""
            raise CapscoreError(f"{where}: a {kind} image must be {layout} with C = 1 or 3; "
                                f"got shape {tuple(arr.shape)}{hint}")
        if not torch_layout and arr.shape[-1] not in (1, 3, 4):
            hint = " (it looks channels-first: use x.transpose(1, 2, 0))" if arr.shape[0] in (1, 3) else ""
            raise CapscoreError(f"{where}: a {kind} image must be {layout} with C = 1, 3 or 4; "
                                f"got shape {tuple(arr.shape)}{hint}")
    elif arr.ndim != 2:
        raise CapscoreError(f"{where}: a {kind} image must be {layout} or (H, W); got shape {tuple(arr.shape)}")
    if np.issubdtype(arr.dtype, np.floating):
        arr = np.round(arr.astype(np.float64) * 255).astype(np.uint8)
    elif arr.dtype != np.uint8:
        raise CapscoreError(f"{where}: image dtype must be uint8 (0-255) or float in [0, 1]; got {arr.dtype}")
    if arr.ndim == 3 and torch_layout:  # one plane per channel: no strided (C, H, W) -> (H, W, C) copy
        planes = [Image.fromarray(np.ascontiguousarray(c)) for c in arr]
        return planes[0].convert("RGB") if len(planes) == 1 else Image.merge("RGB", planes)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    return Image.fromarray(np.ascontiguousarray(arr)).convert("RGB")


def to_image_ref(x, where: str = "image"):
    """Any accepted image input (path, PIL image, ImageRef, tensor, array) -> :class:`~capscore.data.images.ImageRef`
    named ``where`` in errors."""
    if isinstance(x, ImageRef):
        return x
    if isinstance(x, (str, os.PathLike)):
        return ImageRef(path=Path(x).expanduser(), name=f"{where}: {x}")
    if isinstance(x, Image.Image):
        return ImageRef(image=x, name=where)
    if _is_torch(x) or _is_numpy(x):
        return ImageRef(image=pixels_to_pil(x, where), name=where)
    raise CapscoreError(f"{where}: expected a path, a PIL image, a torch tensor or a numpy array; "
                        f"got {type(x).__name__}")


# ------------------------------------------------------------------------------------ score / frame / update
def item_name(kind: str, i: int) -> str:
    """How :func:`capscore.score` names item ``i`` of its ``kind`` argument in errors: ``images[3]``."""
    return f"{kind}[{i}]"


def check_score_args(func: str, images, captions, refs=None, *, name=item_name, candidates: bool = True,
                     **options) -> dict[int, InputError]:
    """Everything a face can check before loading a model (module docstring): the options, the containers
    and their lengths, then each item's image and references. The first bad item is raised, or with
    ``skip_bad=True`` every bad item is returned (index -> its error) for an error row. ``name(kind, i)``
    names items in errors; ``candidates``: a caption may be a list of candidates (capscore.score)."""
    check_options(func, **options)
    check_images_container(images, func)
    n = len(images)
    if isinstance(captions, (str, bytes)) or not isinstance(captions, Sequence):
        want = "a list of strings, one per image" + (" (or a list of candidates per image)" if candidates else "")
        raise param_error("captions", func, want, captions)
    if len(captions) != n:
        raise param_error("captions", func, "one caption (or one list of candidates) per image" if candidates
                          else "one caption per image", f"{n} images but {len(captions)} captions")
    if refs is not None and (isinstance(refs, (str, bytes)) or not isinstance(refs, Sequence) or len(refs) != n):
        raise param_error("refs", func, f"a list of {n} reference lists (one per image) or None", refs)
    bad: dict[int, InputError] = {}
    for i in range(n):
        if (problem := image_problem(images[i])) is not None:
            bad[i] = InputError(name("images", i), problem)
        elif refs is not None and (problem := refs_problem(refs[i])) is not None:
            bad[i] = InputError(name("refs", i), problem)
        if i in bad and not options.get("skip_bad", False):
            raise bad[i]
    return bad


def check_frame_args(df, image_col, caption_col, refs_col=None, func: str = "capscore.score_frame") -> None:
    """``df`` is a non-empty DataFrame holding the named columns; each missing one is named with those present."""
    if not hasattr(df, "columns") or not hasattr(df, "__len__"):
        raise param_error("df", func, "a pandas DataFrame", df)
    present = [str(c) for c in df.columns]
    for name, col in (("image_col", image_col), ("caption_col", caption_col), ("refs_col", refs_col)):
        if col is None and name == "refs_col":
            continue
        if col not in df.columns:
            raise param_error(name, func, f"a column of df (there is no column {col!r}; columns are {present})",
                              col)
    if len(df) == 0:
        raise param_error("df", func, "a DataFrame with at least one row", "an empty DataFrame (0 rows)")


def check_update_args(images, captions, refs=None, func: str = "CaptionScore.update") -> None:
    """``update``'s arguments (one caption per image); an empty batch is valid (a no-op)."""
    check_score_args(func, images, [captions] if isinstance(captions, str) else captions, refs, candidates=False)


def empty_compute_warning(name: str = "CaptionScore") -> str:
    return (f"{name}.compute(): no (image, caption) pair has been scored (no update, or only empty batches); "
            "returning nan")


__all__ = ["check_frame_args", "check_images_container", "check_options", "check_score_args",
           "check_update_args", "image_problem", "item_name", "pixel_problem", "pixels_to_pil", "refs_problem",
           "to_image_ref"]
