"""Caption sets for the classic-metric tests and benchmarks/classic_throughput.py, and pycocoevalcap called
directly as the COCO evaluation calls it (the reference the tests compare with).

:func:`coco_like` is a seeded generator of sets that look like COCO's: each image is a latent scene (who,
doing what, with what, where, with a few attributes); its five references and its candidate describe that
scene in different words, with COCO's casing and punctuation habits (a capital first letter, a final period
sometimes, an occasional comma or clitic)."""
from __future__ import annotations

import random

import numpy as np
import pytest

ALL = ["bleu1", "bleu2", "bleu3", "bleu4", "rouge-l", "cider", "meteor"]

WHO = [("man", "men"), ("woman", "women"), ("boy", "boys"), ("girl", "girls"), ("dog", "dogs"), ("cat", "cats"),
       ("child", "children"), ("person", "people"), ("player", "players"), ("skier", "skiers"), ("horse", "horses"),
       ("surfer", "surfers"), ("cow", "cows"), ("bird", "birds"), ("giraffe", "giraffes"), ("elephant", "elephants"),
       ("zebra", "zebras"), ("sheep", "sheep"), ("bear", "bears"), ("chef", "chefs"), ("baby", "babies"),
       ("teenager", "teenagers"), ("couple", "couples"), ("tennis player", "tennis players"), ("rider", "riders")]
ADJ = ["young", "old", "small", "large", "little", "big", "brown", "white", "black", "red", "blue", "green", "yellow",
       "gray", "tall", "happy", "wooden", "striped", "spotted", "smiling", "wet", "dirty", "shiny", "colorful", "pink"]
DOING = [("riding", "rides", "on"), ("holding", "holds", "with"), ("eating", "eats", "with"),
         ("carrying", "carries", "with"), ("throwing", "throws", "with"), ("catching", "catches", "near"),
         ("looking at", "looks at", "near"), ("standing next to", "stands next to", "beside"),
         ("sitting on", "sits on", "on"), ("playing with", "plays with", "with"), ("walking past", "walks past", "by"),
         ("pulling", "pulls", "with"), ("watching", "watches", "near"), ("pushing", "pushes", "with"),
         ("flying", "flies", "with"), ("laying on", "lays on", "on"), ("cutting", "cuts", "with")]
THING = ["horse", "bike", "bicycle", "skateboard", "surfboard", "kite", "frisbee", "umbrella", "pizza", "sandwich",
         "ball", "bench", "table", "couch", "bed", "boat", "bus", "train", "truck", "car", "motorcycle", "laptop",
         "phone", "cake", "banana", "bowl", "plate", "cup", "book", "clock", "suitcase", "tennis racket",
         "baseball bat", "teddy bear", "toothbrush", "vase", "chair", "fire hydrant", "stop sign", "traffic light"]
WHERE = ["on the beach", "in a park", "on a city street", "in the snow", "in a kitchen", "in a living room",
         "on a grassy field", "at the zoo", "near the water", "in front of a building", "on a sidewalk",
         "in a field", "at a train station", "on a dirt road", "in the ocean", "on a tennis court", "in a bedroom",
         "at an airport", "on a wooden deck", "under a tree", "next to a fence", "in a parking lot", "on a hill",
         "in the rain", "at night", "in a restaurant", "on a boat dock", "by the lake", "in a forest", "downtown"]
NUM = {2: "two", 3: "three", 4: "four", 5: "several"}


def _phrase(rng: random.Random, scene: dict, *, style: int) -> str:
    who, plural = scene["who"]
    n = scene["n"]
    adj = scene["adj"] if rng.random() < 0.6 else rng.choice(ADJ)
    subj = (f"{NUM[n]} {plural}" if n > 1 else f"{'an' if adj[0] in 'aeiou' else 'a'} {adj} {who}"
            if rng.random() < 0.7 else f"the {who}")
    ing, third, prep = scene["doing"]
    thing = scene["thing"]
    noun = f"{rng.choice(ADJ)} {thing}" if rng.random() < 0.4 else thing
    obj = f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"
    where = scene["where"] if rng.random() < 0.8 else rng.choice(WHERE)
    if style == 0:
        text = f"{subj} {'are' if n > 1 else 'is'} {ing} {obj} {where}"
    elif style == 1:
        text = f"{subj} {third if n == 1 else ing} {obj} {where}"
    elif style == 2:
        text = f"{where}, {subj} {ing} {obj}"
    elif style == 3:
        text = f"{subj} {prep} {obj}"
    else:
        text = f"there {'are' if n > 1 else 'is'} {subj} {ing} {obj} {where}"
    if rng.random() < 0.1:
        text = text.replace(" is ", "'s ", 1)
    text = text[0].upper() + text[1:] if rng.random() < 0.7 else text
    return text + rng.choice([".", ".", " .", "", "", "!"])


def coco_like(n_images: int, *, refs_per_image: int = 5, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    """``n_images`` candidates (one each) and their ``refs_per_image`` references, seeded."""
    rng = random.Random(seed)
    cands, refs = [], []
    for _ in range(n_images):
        n = rng.choice([1, 1, 1, 2, 3, 4, 5])
        scene = {"who": rng.choice(WHO), "n": n, "adj": rng.choice(ADJ), "doing": rng.choice(DOING),
                 "thing": rng.choice(THING), "where": rng.choice(WHERE)}
        refs.append([_phrase(rng, scene, style=rng.randrange(5)) for _ in range(refs_per_image)])
        if rng.random() < 0.3:  # a candidate that gets part of the scene wrong
            scene = dict(scene, thing=rng.choice(THING), where=rng.choice(WHERE))
        cands.append(_phrase(rng, scene, style=rng.choice([0, 0, 1, 3])))
    return cands, refs


# ------------------------------------------------------------------------------------ pycocoevalcap, directly
def ptb_direct(cands, refs):
    """The COCO evaluation's own path: PTBTokenizer on the gts/res dicts, keyed by image."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": r} for r in rs] for i, rs in enumerate(refs)})
    res = tok.tokenize({i: [{"caption": c}] for i, c in enumerate(cands)})
    return gts, res


_REF_METEOR = []


def _ref_meteor():
    """One pycocoevalcap ``Meteor`` (its jar takes seconds to start), kept until :func:`close_ref_meteor`."""
    from pycocoevalcap.meteor.meteor import Meteor

    if not _REF_METEOR:
        _REF_METEOR.append(Meteor())
    return _REF_METEOR[0]


@pytest.fixture(scope="module")
def session():
    """One capscore session for a test module (its own METEOR process), and pycocoevalcap's ``Meteor`` ended
    after it. Not entered: the module's other tests must not run inside it."""
    from capscore.scores.classic import ClassicSession

    s = ClassicSession()
    yield s
    s.close()
    if _REF_METEOR:
        _REF_METEOR.pop()  # its __del__ kills the jar


def pycoco_direct(gts, res, names=ALL) -> dict[str, tuple[float, np.ndarray]]:
    """metric -> (pycocoevalcap's corpus value, its per-caption values)."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    out = {}
    if any(m.startswith("bleu") for m in names):
        corpus, per = Bleu(4).compute_score(gts, res, verbose=0)
        out.update({f"bleu{k + 1}": (corpus[k], np.asarray(per[k])) for k in range(4)})
    for name, scorer in (("rouge-l", Rouge), ("cider", Cider), ("meteor", _ref_meteor)):
        if name in names:
            mean, per = scorer().compute_score(gts, res)
            out[name] = (float(mean), np.asarray(per, dtype=float))
    return {m: out[m] for m in names}
