"""Scenes videos: moving objects, motion captions with controlled errors, exact oracle scores.

Each clip is :meth:`Scene.frames` (every group of identical objects moves left, right, up or
down). Captions per clip, each with its oracle precision/recall/F1 against the scene graph plus
the clip's motion facts (:func:`capscore.scenes.oracle` with ``clip=``):

``correct``    every group with its true direction ("the red circle moves left ...")
``partial``    the first group(s) only, true directions (lower recall)
``direction``  every group, one direction wrong (a motion error: lower precision)
``object``     every group, one group's colour replaced by a colour absent from the scene
``static``     the scene's short caption: true, but says nothing about motion

The reference of every caption is the correct caption in another template ("In this clip ...").
Clips are written by :func:`write_video` as real video files: H.264 in RGB at crf 0 in ``.mp4``
(``libx264rgb``; lossless, so decoded frames equal the rendered ones), FFV1 in ``.mkv``, or
ordinary lossy H.264 (yuv420p) with ``codec="h264"``.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image
import json
from fractions import Fraction

from capscore._optional import require
from capscore.errors import CapscoreError, param_error
from capscore.scenes import generate_scenes
from capscore.scenes.captions import Caption, clip_caption, oracle, short
from capscore.scenes.claims import Mention, Motion, Unit
from capscore.scenes.vocab import COLOR_NAMES, MOTIONS

CAPTION_KINDS = ("correct", "partial", "direction", "object", "static")
CODECS = {
    # name: (codec, pixel format, options)
    "lossless": None,  # chosen by the container: libx264rgb crf 0 (.mp4) or ffv1 (.mkv)
    "h264": ("libx264", "yuv420p", {"crf": "18"}),
}


def write_video(frames: Sequence[Image.Image], path: str | os.PathLike, *, fps: float = 4,
                codec: str = "lossless") -> Path:
    """Write RGB frames as a video file with PyAV; returns the path."""
    av = require("av", purpose="writing video files")

    path = Path(path)
    if codec not in CODECS:
        raise CapscoreError(f"unknown video codec {codec!r}; expected one of {', '.join(CODECS)}")
    if not frames:
        raise CapscoreError("write_video needs at least one frame")
    if codec == "lossless":
        spec = ("ffv1", "bgr0", {}) if path.suffix.lower() == ".mkv" else ("libx264rgb", "rgb24", {"crf": "0"})
    else:
        spec = CODECS[codec]
    name, pix, opts = spec
    w, h = frames[0].size
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(name, rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = w, h, pix
        stream.options = dict(opts)
        for im in frames:
            frame = av.VideoFrame.from_ndarray(np.asarray(im.convert("RGB")), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def generate_clips(n: int, *, seed: int = 0, frames: int = 8, size: int = 64, split: str = "all"):
    """``n`` clips of seeded scenes (deterministic given the arguments)."""
    return [s.frames(frames, size=size) for s in generate_scenes(n, seed=seed, split=split, size=size)]


def clip_captions(clip, *, seed: int = 0, lang: str = "en") -> list[dict]:
    """The five graded captions of a clip (see the module docstring) with their oracle scores."""
    scene = clip.scene
    rng = np.random.default_rng([seed, scene.index, 77])
    correct = clip_caption(clip)
    ref = Caption(correct.units, lang, 1).realise(lang)
    claims = list(correct.units[0].claims)
    made: dict[str, Caption] = {"correct": correct}
    if len(claims) > 1:
        made["partial"] = Caption((Unit("motion", tuple(claims[: int(rng.integers(1, len(claims)))])),))
    k = int(rng.integers(len(claims)))
    wrong = [d for d in MOTIONS if d != claims[k].direction]
    made["direction"] = Caption((Unit("motion", tuple(
        replace(c, direction=wrong[int(rng.integers(len(wrong)))]) if j == k else c for j, c in enumerate(claims))),))
    used = {c.m.key for c in claims}
    free = [col for col in COLOR_NAMES if (claims[k].m.shape, col) not in used]
    if free:
        m = claims[k].m
        new = Mention(m.shape, free[int(rng.integers(len(free)))], m.count)
        made["object"] = Caption((Unit("motion", tuple(
            Motion(new, c.direction) if j == k else c for j, c in enumerate(claims))),))
    made["static"] = short(scene, lang)
    rows = []
    for kind in CAPTION_KINDS:
        if kind not in made:
            continue
        o = oracle(scene, made[kind], clip=clip)
        rows.append({"id": f"{scene.id}#{kind}", "image": scene.id, "caption": made[kind].realise(lang),
                     "refs": [ref], "system": kind, "oracle_f1": o.f1, "oracle_precision": o.precision,
                     "oracle_recall": o.recall})
    return rows


def write_scenes_videos(out: str | os.PathLike, n: int, *, seed: int = 0, frames: int = 8, fps: float = 4,
                        size: int = 64, split: str = "all", codec: str = "lossless") -> Path:
    """``out/videos/SCENE.mp4`` and ``out/captions.jsonl`` (id, image = video id, caption, refs, system =
    caption kind, oracle scores), ready for ``capscore score --videos out/videos --captions out/captions.jsonl``."""
    if frames < 2 or not fps > 0:
        raise param_error("frames" if frames < 2 else "fps", "write_scenes_videos",
                          ">= 2" if frames < 2 else "> 0", frames if frames < 2 else fps)
    out = Path(out)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    with open(out / "captions.jsonl", "w", encoding="utf-8") as f:
        for clip in generate_clips(n, seed=seed, frames=frames, size=size, split=split):
            write_video(clip.frames, out / "videos" / f"{clip.scene.id}.mp4", fps=fps, codec=codec)
            for row in clip_captions(clip, seed=seed):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return out
