"""capscore: judge how well text describes images with CLIP-style dual encoders.

One-line use (details in docs/api.md)::

    import capscore
    capscore.score(["a.jpg", "b.jpg"], ["a dog on a sofa", "two cats"])    # CLIP-S on ViT-B-32/openai
    capscore.score(imgs, caps, refs, as_frame=True)                         # RefCLIP-S with its parts
    capscore.score(imgs, caps, model="scenes-tiny")                         # the bundled model, offline
    capscore.score_frame(df, "image", "caption", refs_col="refs")
    capscore.score_batch(encoder, "clip-s", pixels, captions)  # the tensor-level core: Values

The default model is :data:`capscore.pipeline.DEFAULT_MODEL`, ``ViT-B-32/openai`` (the backbone
CLIP-S was published with; also ``capscore score``'s ``--model`` default); its weights come from the
model hub once and from the local cache afterwards. The default metric is CLIP-S, or RefCLIP-S when
``refs`` are given.

``import capscore`` is light: the API and its dependencies (torch, open_clip)
are imported on first use.
"""
from __future__ import annotations

from capscore._version import __version__

__all__ = ["__version__", "score", "score_batch", "score_frame"]


def __getattr__(name: str):
    if name in ("score", "score_frame"):
        from capscore import api

        return getattr(api, name)
    if name == "score_batch":
        from capscore.scores.functional import score_batch

        return score_batch
    raise AttributeError(f"module 'capscore' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + ["score", "score_batch", "score_frame"])
