"""Video caption scoring: EMScore-style matching, with CLIP or PAC-S weights.

PAC-S scores videos the way EMScore does (Shi et al., EMScore, CVPR 2022;
Sarto et al., PAC-S, CVPR 2023 §4.3 use the same formula with PAC-S weights),
on frames encoded independently by the image tower:

* coarse-grained:  cogr = cos(t_eot, v̄),  v̄ = normalise(mean_f v_f)
* fine-grained:    S_if = cos(t_i, v_f) for caption tokens i and frames f
                   P = Σ_i idf_i · max_f S_if / Σ_i idf_i     (token -> frame)
                   R = mean_f max_i S_if                      (frame -> token)
                   F = 2PR / (P + R)
* full:            EMScore = (F + cogr) / 2  (and the same for P and R)

Choices, as in the EMScore reference code: caption tokens include the start
and end tokens; idf weights default to 1 (``idf=None``) and can be computed
from a corpus of captions with :func:`idf_weights` (log((N+1)/(df+1)), unseen
ids log(N+1)); no clamping and no ``w`` factor (EMScore reports raw cosines).
Pass ``w``/``clamp`` to get the CLIP-S-like ``w·max(·, 0)`` instead.

A video is a sequence of frames: a list of images/paths, a folder of frame
images (sorted by name), or an animated image (GIF/WebP/APNG).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, ImageSequence

from capscore.embed.engine import Encoder, TokenFeatures
from capscore.errors import InputError

FRAME_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff"}


@dataclass(frozen=True)
class VideoScore:
    """EMScore(X, V) components for one (video, caption) pair."""

    coarse: float
    fine_p: float
    fine_r: float
    fine_f: float

    @property
    def full_p(self) -> float:
        return (self.fine_p + self.coarse) / 2

    @property
    def full_r(self) -> float:
        return (self.fine_r + self.coarse) / 2

    @property
    def full_f(self) -> float:
        return (self.fine_f + self.coarse) / 2


def video_embedding(frames: torch.Tensor) -> torch.Tensor:
    """(F, D) normalised frame vectors -> (D,) normalised mean."""
    return F.normalize(frames.mean(dim=0), dim=-1)


def em_score(
    frames: torch.Tensor, tokens: torch.Tensor, text_global: torch.Tensor, *, idf: torch.Tensor | None = None
) -> VideoScore:
    """EMScore(X, V) of one caption: frames (F, D), tokens (L, D), text_global (D,), all normalised."""
    sim = tokens @ frames.T  # (L, F)
    w = torch.ones(tokens.shape[0]) if idf is None else idf.float()
    w = w / w.sum()
    p = float((sim.max(dim=1).values * w).sum())
    r = float(sim.max(dim=0).values.mean())
    f = 2 * p * r / (p + r) if (p + r) != 0 else 0.0
    cogr = float(text_global @ video_embedding(frames))
    return VideoScore(cogr, p, r, f)


def idf_weights(token_ids: Iterable[Sequence[int]]) -> dict[int, float]:
    """Document frequency -> idf = log((N+1)/(df+1)) over a corpus of tokenised captions."""
    docs = [set(ids) for ids in token_ids]
    df = Counter(i for d in docs for i in d)
    n = len(docs)
    return {i: math.log((n + 1) / (c + 1)) for i, c in df.items()} | {-1: math.log(n + 1)}


def load_frames(video) -> list:
    """A video reference -> list of frames (PIL images or paths)."""
    if isinstance(video, (list, tuple)):
        if not video:
            raise InputError("video", "no frames")
        return list(video)
    path = Path(video)
    if path.is_dir():
        frames = sorted(p for p in path.iterdir() if p.suffix.lower() in FRAME_SUFFIXES)
        if not frames:
            raise InputError(str(path), "video folder holds no frame images", expected=", ".join(sorted(FRAME_SUFFIXES)))
        return frames
    if not path.exists():
        raise InputError(str(path), "video not found")
    try:
        with Image.open(path) as im:
            frames = [f.convert("RGB") for f in ImageSequence.Iterator(im)]
    except OSError as e:
        raise InputError(str(path), f"cannot read video as an animated image or frame folder ({e})") from None
    return frames


def score_videos(
    encoder: Encoder,
    videos: Sequence,
    captions: Sequence[str],
    *,
    prefix: str = "",
    idf: dict[int, float] | None = None,
) -> list[VideoScore]:
    """EMScore(X, V) for aligned videos and captions; frames and tokens go through the encoder (cached)."""
    if len(videos) != len(captions):
        raise InputError("videos", "videos and captions differ in number", expected=str(len(videos)), got=len(captions))
    feats: list[TokenFeatures] = encoder.text_tokens([prefix + c for c in captions])
    out = []
    for video, feat in zip(videos, feats):
        frames = encoder.encode_images(load_frames(video))
        w = None if idf is None else torch.tensor([idf.get(i, idf.get(-1, 1.0)) for i in feat.ids])
        out.append(em_score(frames, feat.vectors, feat.global_, idf=w))
    return out
