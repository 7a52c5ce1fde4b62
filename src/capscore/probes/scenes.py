"""The probes on synthetic scenes with exact labels (``capscore probe --suite scenes-...``; no files).

Built on the public API of :mod:`capscore.scenes` (``generate_scenes``, ``Scene.render``,
``short_caption``, ``flawed``, ``applicable_errors``, ``oracle``):

=====================  ===================================================================
scenes-flips           image-to-text accuracy, correct caption vs. its twin with one
                       controlled error, one subset per error kind (color, count, relation, ...)
scenes-lgip            LGIP on short captions; flip lists = the scenes' color and shape words
scenes-specificity     SPECS SR_pos / SR_neg over the scene's exact detail units; the wrong
                       unit at each step is a detail unit of another scene that the oracle
                       finds entirely false (precision 0) for this scene
scenes-perturb         PR-MCS perturbations; critical objects = the scene's shape words
=====================  ===================================================================

Scenes come from ``generate_scenes(n, seed=seed, split="heldout")`` so a model trained on
the train split is probed on held-out compositions.
"""
from __future__ import annotations

import random
import zlib

import numpy as np

from capscore.probes import run as R
from capscore.probes.formats import ProbeItem, SuiteItem

SPLIT = "heldout"


def _scenes(n: int, seed: int):
    from capscore.scenes import generate_scenes

    return generate_scenes(n, seed=seed, split=SPLIT)


def flip_items(scenes, *, seed: int = 0) -> list[SuiteItem]:
    from capscore.scenes import applicable_errors

    items = []
    for s in scenes:
        img = s.render()
        for kind in applicable_errors(s):
            rng = np.random.default_rng([seed, zlib.crc32(f"{s.id}|{kind}".encode())])
            flawed, flaw = s.flawed(kind, rng)
            items.append(SuiteItem(f"{s.id}/{kind}: {flaw.detail}", kind, (img,), (flaw.correct, flawed),
                                   f"scene {s.id}"))
    return items


def specificity_inputs(scenes, *, seed: int = 0) -> tuple[list[ProbeItem], list[list[str]]]:
    """Exact units per scene, and per step a wrong unit (oracle precision 0 in this scene)."""
    from capscore.scenes import Caption, oracle
    from capscore.scenes import captions as C

    units = [C.detail_units(s) for s in scenes]
    items, texts = [], []
    for i, s in enumerate(scenes):
        rng = random.Random(f"{seed}|scenes-specificity|{s.id}")
        pool = [u for j, us in enumerate(units) if j != i for u in us]
        false = [u for u in pool if u.facts() and oracle(s, Caption((u,))).correct == 0]
        mine = [Caption((u,)).text for u in units[i]]
        wrong = tuple(Caption((rng.choice(false),)).text for _ in range(len(mine) - 1)) if false else None
        items.append(ProbeItem(s.id, s.render(), " ".join(mine), f"scene {s.id}", None, wrong))
        texts.append(mine)
    return items, texts


def _lgip_lists():
    from capscore.scenes import COLOR_NAMES, SHAPES

    colors = list(COLOR_NAMES.values()) if isinstance(COLOR_NAMES, dict) else list(COLOR_NAMES)
    return {"color": [c for c in colors if isinstance(c, str)], "object": list(SHAPES)}


def run_scenes_flips(encoder, *, args, **common):
    items = flip_items(_scenes(args.n_scenes, args.seed), seed=args.seed)
    return R.run_suite(encoder, items, suite="scenes-flips", **common)


def run_scenes_lgip(encoder, *, args, **common):
    scenes = _scenes(args.n_scenes, args.seed)
    items = [ProbeItem(s.id, s.render(), s.short_caption(), f"scene {s.id}") for s in scenes]
    return R.run_lgip(encoder, items, seed=args.seed, suite="scenes-lgip", lists=_lgip_lists(),
                      average=getattr(args, "lgip_average", "pairs"), **common)


def run_scenes_specificity(encoder, *, args, **common):
    items, units = specificity_inputs(_scenes(args.n_scenes, args.seed), seed=args.seed)
    return R.run_specificity(encoder, items, seed=args.seed, suite="scenes-specificity", units=units,
                             variant=getattr(args, "sr_variant", "capscore"), **common)


def run_scenes_perturb(encoder, *, args, **common):
    from capscore.scenes import SHAPES

    scenes = _scenes(args.n_scenes, args.seed)
    items = [ProbeItem(s.id, s.render(), s.short_caption(), f"scene {s.id}", tuple(SHAPES)) for s in scenes]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    return R.run_perturb(encoder, items, kinds=kinds, p=args.p, seed=args.seed, mask=args.mask,
                         removal=getattr(args, "removal", "keep-drawn"),
                         ensure_change=getattr(args, "ensure_change", False), suite="scenes-perturb", **common)


SCENE_SUITES = {
    "scenes-flips": run_scenes_flips,
    "scenes-lgip": run_scenes_lgip,
    "scenes-specificity": run_scenes_specificity,
    "scenes-perturb": run_scenes_perturb,
}
