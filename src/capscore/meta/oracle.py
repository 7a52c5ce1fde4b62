"""The scenes oracle: a meta-evaluation dataset whose "human" scores are exact.

Synthetic scenes (:mod:`capscore.scenes`) come with their scene graph, so the
quality of a caption generated from claims is known exactly: its precision,
recall and F1 against the graph. For each scene, ``captions_per_scene`` captions
of graded correctness are drawn (``capscore.scenes.graded``: a prefix of the
long caption of random length, 0–3 claims made false, sometimes a hallucinated
object), and the oracle F1 plays the human score. A metric that tracks caption
quality must correlate positively with it — a check that needs no files and no
annotators, and whose "annotators" never disagree.

Choices: the single reference of each caption (for RefCLIP-S/RefPAC-S) is the
scene's short caption; the group for sample-wise τ is the scene; scenes are
drawn from ``split`` (``"all"``: held-out colour/shape pairs included) with
``seed``, captions with ``numpy.random.default_rng(seed)``; everything is
deterministic given (seed, n_scenes, captions_per_scene, split, size, lang).
"""
from __future__ import annotations

import numpy as np

from capscore.data.records import Record
from capscore.data.images import ImageRef
from capscore.errors import param_error
from capscore.meta.sets import Rated, RatingSet
from capscore.scenes import generate_scenes, graded


def scenes_oracle(*, seed: int = 0, n_scenes: int = 60, captions_per_scene: int = 6, split: str = "all",
                  size: int = 64, lang: str = "en") -> RatingSet:
    """``n_scenes`` × ``captions_per_scene`` captions with their oracle F1 as the score (see module doc)."""
    if not isinstance(n_scenes, int) or n_scenes < 2:
        raise param_error("n_scenes", "scenes_oracle", "an int >= 2", n_scenes)
    if not isinstance(captions_per_scene, int) or captions_per_scene < 1:
        raise param_error("captions_per_scene", "scenes_oracle", "an int >= 1", captions_per_scene)
    rng = np.random.default_rng(seed)
    items = []
    for scene in generate_scenes(n_scenes, seed=seed, split=split, size=size):
        image = ImageRef(image=scene.render(), name=f"scene {scene.id}")
        ref = scene.short_caption(lang)
        for j, (cap, score) in enumerate(graded(scene, rng, n=captions_per_scene, lang=lang)):
            rec = Record(f"{scene.id}#{j}", image, cap.text, (ref,), source=f"scenes-oracle: scene {scene.id}, caption {j}")
            items.append(Rated(rec, float(score.f1), group=scene.id, lang=lang))
    params = {"n_scenes": n_scenes, "captions_per_scene": captions_per_scene, "split": split, "size": size,
              "lang": lang, "seed": seed, "human": "oracle F1 of the caption's claims against the scene graph"}
    return RatingSet("scenes-oracle", f"capscore.scenes (seed {seed})", tuple(items), {}, params)
