"""Pair scorers: the one protocol through which probes, suites and meta-evaluation score.

A pair scorer takes an :class:`~capscore.embed.Encoder` and aligned sequences
of images and texts and returns one float per (image, text) pair, higher =
better match. Global cosine is the default; ABE-CLIP (``capscore.scores.abe``)
and the CLIPScore-family metrics provide others. Probes never see models, only
a scorer and an encoder, so one encoding pass (and its cache) serves them all.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from capscore.embed.engine import Encoder
from capscore.errors import unknown_name

PairScorer = Callable[[Encoder, Sequence, Sequence[str]], torch.Tensor]


def cosine_pairs(encoder: Encoder, images: Sequence, texts: Sequence[str]) -> torch.Tensor:
    """cos(image_i, text_i) for each i (unclamped, unweighted)."""
    img = encoder.encode_images(images)
    txt = encoder.encode_texts(texts)
    return (img * txt).sum(-1)


def text_text_cosine(encoder: Encoder, a: Sequence[str], b: Sequence[str]) -> torch.Tensor:
    """cos(a_i, b_i) between texts (for text-only probes such as SugarCrepe++ TOT or LGIP)."""
    return (encoder.encode_texts(a) * encoder.encode_texts(b)).sum(-1)


def get_pair_scorer(name: str, **options) -> PairScorer:
    """``cosine`` (global CLIP similarity) or ``abe`` (ABE-CLIP; options go to its config)."""
    if name == "cosine":
        return cosine_pairs
    if name == "abe":
        from capscore.scores.abe import make_abe_scorer  # provided by the ABE-CLIP module

        return make_abe_scorer(**options)
    raise unknown_name("scorer", name, ["cosine", "abe"])
