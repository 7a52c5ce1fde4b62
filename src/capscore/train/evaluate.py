"""Evaluation during and after training, on held-out synthetic scenes (exact ground truth).

Every number goes through the encoding engine (:class:`capscore.embed.Encoder`)
with a fresh in-memory cache, after ``backbone.invalidate_identity()``:

* ``r1_t2i`` / ``r1_i2t``: retrieval recall@1 between images and their short captions
  (the "retrieval cost" of a fine-tune shows here);
* ``sr_pos`` / ``sr_neg`` / ``sr_mean``: SPECS specificity rates through
  :func:`capscore.probes.run.run_specificity` with the scenes' exact detail units,
  triplet-level as eqs. 1-2 define them; ``sr_*_images`` the per-image means;
* ``oracle_tau`` (+ ``oracle_tau_<lang>``): Kendall's tau-b between cosine(image, caption)
  and the scenes oracle F1 over graded captions, pooled over scenes;
* ``drop_<kind>_<lang>``: mean cosine drop s(o) − s(p) under each PR-MCS
  perturbation (substitution in English only: it needs a parser for nouns).

The specificity items and graded captions are the scenes' long captions (up to ~190 CLIP tokens); a
77-token tower reads their first 77 tokens, as it would in any evaluation of such captions. That is a
known property of capscore's own evaluation data, not of the user's, so the encoder's warning about
truncated captions is not shown for it (:func:`quiet_builtin_truncation`).
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from scipy.stats import kendalltau

from capscore.backbones.base import Backbone
from capscore.embed.engine import Encoder, MemoryCache
from capscore._log import CapscoreWarning
from capscore.perturb.prmcs import PERTURBATIONS, perturb
from capscore.probes.formats import ProbeItem
from capscore.probes.run import run_specificity
from capscore.scenes import generate_scenes, render_size


@contextmanager
def quiet_builtin_truncation() -> Iterator[None]:
    """Encode capscore's built-in scenes without the truncated-captions warning (other warnings pass)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="captions longer than", category=CapscoreWarning)
        yield


def scene_evaluator(n: int = 48, *, seed: int = 10_000, languages: tuple[str, ...] = ("en",),
                    specificity: bool = True, perturbations: bool = False, graded_per_scene: int = 4):
    """A function backbone -> {metric: value} over ``n`` scenes (disjoint seed from training), drawn
    at the backbone's input size (:func:`capscore.scenes.render_size`; the same scenes at any size)."""
    scenes = generate_scenes(n, seed=seed)
    drawn: dict[int, list] = {}  # size -> images
    rng = np.random.default_rng(seed)
    graded = {lang: [s.graded(rng, n=graded_per_scene, lang=lang) for s in scenes] for lang in languages}

    def evaluate(bb: Backbone) -> dict:
        with quiet_builtin_truncation():
            return _evaluate(bb)

    def _evaluate(bb: Backbone) -> dict:
        bb.invalidate_identity()
        size = render_size(bb)
        if size not in drawn:
            drawn[size] = [s.render() for s in generate_scenes(n, seed=seed, size=size)]
        images = drawn[size]
        enc = Encoder(bb, cache=MemoryCache(), batch_size=64)
        img = enc.encode_images(images)  # (N, D)
        txt = enc.encode_texts([s.short_caption() for s in scenes])  # (N, D)
        S = (img @ txt.T).numpy()  # (N_img, N_txt)
        out = {"r1_i2t": float((S.argmax(1) == np.arange(n)).mean()),
               "r1_t2i": float((S.argmax(0) == np.arange(n)).mean())}
        if specificity:
            items = [ProbeItem(s.id, im, s.long_caption()) for s, im in zip(scenes, images)]
            res = run_specificity(enc, items, units=[s.detail_units() for s in scenes], seed=seed)
            out |= {k: res.summary[0][k] for k in ("sr_pos", "sr_neg", "sr_mean", "sr_pos_images", "sr_neg_images",
                                                    "sr_mean_images")}
        for lang in languages:
            caps = [c.realise(lang) for g in graded[lang] for c, _ in g]
            f1 = [o.f1 for g in graded[lang] for _, o in g]
            owner = [i for i, g in enumerate(graded[lang]) for _ in g]
            cos = (img[owner] * enc.encode_texts(caps)).sum(-1).numpy()
            out["oracle_tau" + ("" if lang == "en" else f"_{lang}")] = float(kendalltau(cos, f1).statistic)
            if perturbations:
                out |= _drops(enc, scenes, img, lang, seed)
        return out

    return evaluate


def _drops(enc: Encoder, scenes, img: torch.Tensor, lang: str, seed: int) -> dict:
    orig = [s.short_caption(lang) for s in scenes]
    s_orig = (img * enc.encode_texts(orig)).sum(-1)
    out = {}
    for kind in PERTURBATIONS:
        if kind == "substitution" and lang != "en":
            continue
        pert = [perturb(o, kind, seed=seed, ensure_change=True) for o in orig]  # a change in every caption
        keep = [i for i, p in enumerate(pert) if p.ok]
        s_p = (img[keep] * enc.encode_texts([pert[i].text for i in keep])).sum(-1)
        out[f"drop_{kind}_{lang}"] = float((s_orig[keep] - s_p).mean())  # cosine points
    return out
