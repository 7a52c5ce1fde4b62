"""The probes on synthetic scenes with exact labels (``capscore probe --suite scenes-...``; no files).

Built on the public API of :mod:`capscore.scenes` (``generate_scenes``, ``Scene.render``,
``short_caption``, ``flawed``, ``applicable_errors``, ``oracle``):

=====================  ===================================================================
scenes-flips           image-to-text accuracy, correct caption vs. its twin with one
                       controlled error, one subset per error kind (color, count, relation, ...)
scenes-lgip            LGIP on short captions; flip lists = the scenes' color and shape words and
                       the count words "two".."six" (LGIP Table 2's obj / col / cnt columns)
scenes-specificity     SPECS SR_pos / SR_neg over the scene's exact detail units; the wrong
                       unit at each step is a detail unit of another scene that the oracle
                       finds entirely false (precision 0) for this scene
scenes-perturb         PR-MCS perturbations; critical objects = the shape words of the caption
scenes-retrieval       image<->text R@1/5/10 over held-out scenes, 5 captions each (the short
                       caption + 4 paraphrases), as Flickr30K / MSCOCO retrieval
scenes-zeroshot        zero-shot shape (6 classes) and colour (8 classes) of single-object scenes
                       (split "all": unseen images, shape and colour independent)
=====================  ===================================================================

Scenes come from ``generate_scenes(n, seed=seed, split="heldout")``, drawn at the model's input size
(:func:`capscore.scenes.render_size`), so a model trained on
the train split is probed on held-out compositions.
"""
from __future__ import annotations

import random
import re
import zlib

import numpy as np

from capscore.probes import run as R
from capscore.probes.formats import ProbeItem, SuiteItem
from capscore.data.images import ImageRef
from capscore.probes.retrieval import RERANK_K, RetrievalSet, run_retrieval
from capscore.probes.zeroshot import ClassificationSet, run_zeroshot
from capscore.scenes import (
    COLOR_NAMES, Caption, SHAPES, applicable_errors, captions as C, generate_scenes, oracle, render_size,
)
from capscore.scenes.lexicon import English
from capscore.scenes.vocab import MAX_OBJECTS

SPLIT = "heldout"


def _scenes(n: int, seed: int, encoder=None):
    """Held-out scenes drawn at the encoder's input size (:func:`capscore.scenes.render_size`)."""
    return generate_scenes(n, seed=seed, split=SPLIT, size=render_size(encoder))


def flip_items(scenes, *, seed: int = 0) -> list[SuiteItem]:
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
    """Flip lists of the scenes LGIP suite: the scenes' colour, shape and count words.

    Counts are the lexicon's number words for 2..MAX_OBJECTS, the only counts a short caption
    writes as a word ("four large pink diamonds"); a single object reads "a ...", which is not
    flipped (a count flip there would need the noun re-inflected). Any other count is false for
    the scene, so every count flip is a semantic flip, as LGIP's number-word flips (§3.2).
    """
    colors = list(COLOR_NAMES.values()) if isinstance(COLOR_NAMES, dict) else list(COLOR_NAMES)
    counts = [English.numbers[n] for n in range(2, MAX_OBJECTS + 1)]
    # count last: each caption's generator draws color, object, count in this order, so adding the count
    # list left the colour and shape flips (and their published numbers) as they were
    return {"color": [c for c in colors if isinstance(c, str)], "object": list(SHAPES), "count": counts}


def run_scenes_flips(encoder, *, args, **common):
    items = flip_items(_scenes(args.n_scenes, args.seed, encoder), seed=args.seed)
    return R.run_suite(encoder, items, suite="scenes-flips", **common)


def run_scenes_lgip(encoder, *, args, **common):
    scenes = _scenes(args.n_scenes, args.seed, encoder)
    items = [ProbeItem(s.id, s.render(), s.short_caption(), f"scene {s.id}") for s in scenes]
    return R.run_lgip(encoder, items, seed=args.seed, suite="scenes-lgip", lists=_lgip_lists(),
                      average=getattr(args, "lgip_average", "pairs"), **common)


def run_scenes_specificity(encoder, *, args, **common):
    items, units = specificity_inputs(_scenes(args.n_scenes, args.seed, encoder), seed=args.seed)
    return R.run_specificity(encoder, items, seed=args.seed, suite="scenes-specificity", units=units,
                             variant=getattr(args, "sr_variant", "capscore"), **common)


def shape_objects(caption: str) -> tuple[str, ...]:
    """A scene caption's critical objects for PR-MCS substitution: the shape words it writes (singular,
    whole words), distinct, in order of appearance -- the list Algorithm 1 shuffles."""
    found = re.findall(r"\b(" + "|".join(map(re.escape, SHAPES)) + r")\b", caption)
    return tuple(dict.fromkeys(found))


def run_scenes_perturb(encoder, *, args, **common):
    scenes = _scenes(args.n_scenes, args.seed, encoder)
    items = []
    for s in scenes:
        cap = s.short_caption()
        items.append(ProbeItem(s.id, s.render(), cap, f"scene {s.id}", shape_objects(cap), lang="en"))
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


# ============================================================================ retrieval and zero-shot
N_PARAPHRASES = 4  # short caption + 4 paraphrases = 5 captions per image, as Flickr30K / MSCOCO


def retrieval_set(scenes):
    """Images and their captions: the short caption plus up to ``N_PARAPHRASES`` paraphrases each."""
    refs, names, texts, owner = [], [], [], []
    for k, s in enumerate(scenes):
        caps = [s.short_caption()] + list(s.paraphrases(n=N_PARAPHRASES))
        refs.append(ImageRef(image=s.render(), name=f"scene {s.id}"))
        names.append(s.id)
        texts += caps
        owner += [k] * len(caps)
    counts = np.bincount(owner, minlength=len(scenes))
    info = {"dataset": "scenes", "split": SPLIT, "n_images": len(refs), "n_texts": len(texts),
            "captions_per_image": f"short caption + up to {N_PARAPHRASES} paraphrases",
            "min_captions_per_image": int(counts.min()), "max_captions_per_image": int(counts.max())}
    return RetrievalSet(tuple(refs), tuple(names), tuple(texts), tuple(owner), info)


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def zeroshot_sets(scenes):
    """Two tasks on single-object scenes: the shape (6 classes) and the colour (8 classes) of the object.

    Class names are the English scenes lexicon's words with their article ("a circle"; colours as
    "a red object"), to be read through the ``scenes`` templates ("A picture of {}.").
    """
    refs = tuple(ImageRef(image=s.render(), name=f"scene {s.id}") for s in scenes)
    names = tuple(s.id for s in scenes)
    out = []
    for task, classes, attr, word in (
        ("shape", SHAPES, "shape", lambda c: _article(English.shapes[c][0])),
        ("color", COLOR_NAMES, "color", lambda c: _article(f"{English.colors[c]} object")),
    ):
        labels = tuple(classes.index(getattr(s.objects[0], attr)) for s in scenes)
        info = {"dataset": "scenes", "split": ZEROSHOT_SPLIT, "objects_per_scene": 1, "n_images": len(refs),
                "n_classes": len(classes)}
        out.append((task, ClassificationSet(refs, names, labels, tuple(word(c) for c in classes), info)))
    return out


ZEROSHOT_SPLIT = "all"  # unseen images; shape and colour drawn independently (held-out scenes tie them)


def run_scenes_retrieval(encoder, *, args, **common):
    ranking = {}
    if common.get("scorer_name", "cosine") != "cosine":  # ABE-CLIP Table 2: re-rank cosine's top k (or all)
        ranking = {"scorer": common["scorer"], "scorer_name": common["scorer_name"],
                   "rerank_k": getattr(args, "rerank", RERANK_K)}
    return run_retrieval(encoder, retrieval_set(_scenes(args.n_scenes, args.seed, encoder)), suite="scenes-retrieval",
                         source=common.get("source", ""), seed=args.seed, **ranking)


def run_scenes_zeroshot(encoder, *, args, **common):
    scenes = generate_scenes(args.n_scenes, seed=args.seed, split=ZEROSHOT_SPLIT, min_objects=1, max_objects=1,
                             size=render_size(encoder))
    return run_zeroshot(encoder, zeroshot_sets(scenes), templates=getattr(args, "templates", None) or "scenes",
                        suite="scenes-zeroshot", source=common.get("source", ""), seed=args.seed)


SCENE_SUITES.update({"scenes-retrieval": run_scenes_retrieval, "scenes-zeroshot": run_scenes_zeroshot})
