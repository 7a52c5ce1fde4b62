"""Boundary checks of the Python API (``capscore.score``, ``score_frame``, ``CaptionScore.update``).

Pure functions, in the scikit-learn style: a wrong *argument* raises
:func:`~capscore.errors.param_error` ("The 'batch_size' parameter of capscore.score
must be an int >= 1; got 0 instead."), before anything is loaded or encoded.

A wrong *item* (one image among many: zero-sized, NaN or inf pixels, floats
outside [0, 1], over the decompression-bomb or aspect guard that files have,
:func:`capscore.data.images.check_dimensions`) is an
:class:`~capscore.errors.InputError` naming ``images[i]``: raised at the boundary
by :func:`check_score_args`, or, with ``skip_bad=True``, left for the scorer as a
:func:`broken_image` whose reading raises it, so the item becomes an error row
(score ``None``) and the other items are scored.

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
from dataclasses import dataclass

from capscore.errors import InputError, param_error

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
    import numpy as np

    from capscore.data.images import check_dimensions

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
    when read). Layout mistakes are left to :func:`capscore.api.pixels_to_pil`, which names the fix."""
    import numpy as np
    from PIL import Image

    if isinstance(x, Image.Image):
        w, h = x.size
        if w < 1 or h < 1:
            return f"image has no pixels ({w}x{h})"
        from capscore.data.images import check_dimensions

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


def check_image_items(images: Sequence, *, skip_bad: bool) -> None:
    """Raise the first item problem as InputError('images[i]') unless ``skip_bad`` defers them to error rows."""
    if skip_bad:
        return
    for i, x in enumerate(images):
        problem = image_problem(x)
        if problem is not None:
            raise InputError(f"images[{i}]", problem)


def broken_image(name: str, problem: str):
    """An :class:`~capscore.data.images.ImageRef` whose reading raises ``InputError(name, problem)``:
    with ``skip_bad=True`` the scorer turns it into an error row like an unreadable file."""
    return _broken_class()(name=name, problem=problem)


_BROKEN = []


def _broken_class():
    if not _BROKEN:
        from capscore.data.images import ImageRef

        @dataclass(frozen=True)
        class BrokenImage(ImageRef):
            """Stands in for an image that cannot be scored; reading it raises its problem."""

            problem: str = ""

            def identity_hint(self) -> str:
                return f"broken:{id(self)}"

            def read(self):
                raise InputError(self.where(), self.problem)

            def load(self, *, convert_rgb: bool = True):
                raise InputError(self.where(), self.problem)

        _BROKEN.append(BrokenImage)
    return _BROKEN[0]


# ------------------------------------------------------------------------------------ score / frame / update
def check_score_args(func: str, images, captions, refs=None, **options) -> None:
    """Everything :func:`capscore.score` can check before loading a model (module docstring)."""
    check_options(func, **options)
    check_images_container(images, func)
    n = len(images)
    if isinstance(captions, (str, bytes)) or not isinstance(captions, Sequence):
        raise param_error("captions", func, "a list of strings, one per image (or a list of candidates per image)",
                          captions)
    if len(captions) != n:
        raise param_error("captions", func, "one caption (or one list of candidates) per image",
                          f"{n} images but {len(captions)} captions")
    if refs is not None and (isinstance(refs, (str, bytes)) or not isinstance(refs, Sequence) or len(refs) != n):
        raise param_error("refs", func, f"a list of {n} reference lists (one per image) or None", refs)
    check_image_items(list(images), skip_bad=bool(options.get("skip_bad", False)))


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
    """``update``'s arguments; an empty batch is valid (a no-op)."""
    check_score_args(func, images, [captions] if isinstance(captions, str) else captions, refs)


def empty_compute_warning(name: str = "CaptionScore") -> str:
    return (f"{name}.compute(): no (image, caption) pair has been scored (no update, or only empty batches); "
            "returning nan")


__all__ = ["broken_image", "check_frame_args", "check_image_items", "check_images_container", "check_options",
           "check_score_args", "check_update_args", "image_problem", "pixel_problem"]
