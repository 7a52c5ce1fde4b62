"""Evaluate a backbone on synthetic scenes it was not trained on (``capscore scenes eval``).

Two sets, both from ``seed`` (default :data:`EVAL_SEED`, disjoint from any training seed < 1000):

* **seen** — ``generate_scenes(n, seed=seed, split="train")``: new scenes, but every (shape, colour)
  pair in them occurs in training;
* **unseen** — ``generate_scenes(n, seed=seed, split="heldout")``: each scene holds at least one
  held-out pair; flip items are kept only when the *correct* caption names a held-out pair.

Measured, all through the :class:`~capscore.embed.engine.Encoder` (cosine of normalised vectors, no
prompt prefix unless ``prefix`` is given):

* retrieval R@1 between the ``n`` images and their short captions, image->text and text->image. Scenes
  can share a short caption ("A picture of a red circle."), so a hit is any retrieved caption (image)
  whose text equals the query's own short caption;
* pos>neg accuracy, one item per (scene, kind) where the scene allows it: the correct caption must get
  a strictly higher cosine than its flawed twin (``make_flaw``) — ties count as failures;
* the same items' **blind** accuracy: both captions scored against an empty scene (the background
  alone, no object), i.e. what the text tower's priors win without looking at the scene. SugarCrepe
  (Hsieh et al., 2023) showed that text-only models beat CLIP on hard negatives whose false captions
  are less plausible text; a flip kind whose accuracy is not above its blind accuracy has not been
  shown to use the image (docs/scenes.md, "Text priors and minimal pairs");
* **paired** accuracy for colour, shape, count and attribute-swap flips: the item is won only if the
  scene prefers its correct caption *and* the scene's counterfactual twin (the scene edited so that the
  flawed caption is true of it, :func:`~capscore.scenes.graph.counterfactual`) prefers the flawed
  one — Winoground's text score (Thrush et al., 2022) on a 2 × 2 minimal pair. The two captions swap
  roles, so a text prior wins at most one half: an empty scene scores 0 (ties aside) and a model that
  guesses 1/4. Items whose twin cannot be built (no free cell to add an object) are left out
  (``n_paired``);
* each flip kind's accuracy **by the number of objects in the scene** (``by_objects``: {"1": {"n",
  "accuracy"}, ...}; ``capscore scenes eval --by-objects`` prints it): where a model's errors sit, e.g.
  whether a kind that is solved on one object falls with crowding;
* colour, shape, count and hallucination accuracy split into **free** and **bound** items (``by_binding``:
  {"free": {"n", "accuracy"}, "bound": {...}}; ``--by-binding`` prints it, :func:`needs_binding`): an item is
  bound when every value its error introduces is already in the scene on another object (the new colour,
  the new shape, both of a hallucinated object, or the new number as another group's count), so a model
  that reads the scene as a bag of attribute words cannot tell the two captions apart and only binding
  values to objects can — what attribute-swap items test on every item (Yuksekgonul et al. 2023, "When
  and why vision-language models behave like bags-of-words"). Crowded scenes hold more bound items; a
  model whose global embedding does not bind scores bound items far below free ones, nearer its swap
  rate (docs/research/scenes-training.md, "Perception or binding").
"""
from __future__ import annotations

import numpy as np
import torch

from capscore._table import format_table
from capscore.embed.engine import Encoder
from capscore.errors import param_error
from capscore.scenes import applicable_errors, generate_scenes, heldout_pairs, make_flaw, render_size
from capscore.scenes.graph import COUNTERFACTUAL_KINDS, counterfactual, render_objects

EVAL_SEED = 12345
EVAL_KINDS = ("color", "shape", "count", "attribute_swap", "relation", "hallucination")
BINDING_KINDS = ("color", "shape", "count", "hallucination")


def needs_binding(scene, flaw) -> bool | None:
    """Whether a flip item is *bound*: every value the flawed caption introduces is already in the scene,
    on another object — a new colour or shape (``obj`` facts: both its shape and its colour must occur in
    the scene) or a new count (``count`` facts of a group the scene has: the number must be another
    group's count). Then the flawed caption's words all describe something in the image and only their
    binding to objects is wrong. Sizes and patterns are not considered (they are not flipped here).
    None for kinds outside :data:`BINDING_KINDS` (attribute swaps are bound by construction; relations
    are about order, not values)."""
    if flaw.kind not in BINDING_KINDS:
        return None
    shapes = {o.shape for o in scene.graph.objects}
    colours = {o.color for o in scene.graph.objects}
    counts = scene.graph.counts
    new = flaw.flawed_caption.facts() - flaw.correct_caption.facts()
    checks = []
    for f in new:
        if f[0] == "obj":
            checks.append(f[1] in shapes and f[2] in colours)
        elif f[0] == "count" and (f[1], f[2]) in counts:  # a miscounted group (a new object's count: its obj fact decides)
            checks.append(any(n == f[3] for key, n in counts.items() if key != (f[1], f[2])))
    return bool(checks) and all(checks)


def flip_items(scenes, *, seed: int, kinds=EVAL_KINDS, unseen_only: bool = False) -> list[dict]:
    """(scene, kind, correct, flawed) rows; with ``unseen_only``, only items whose correct caption
    names a held-out (shape, colour) pair."""
    out = []
    for s in scenes:
        held = heldout_pairs(s.split_seed)
        ok = applicable_errors(s)
        for k, kind in enumerate(kinds):
            if kind not in ok:
                continue
            rng = np.random.default_rng([seed, s.index, k, 99])
            flaw = make_flaw(s, kind, rng)
            named = {f[1:3] for f in flaw.correct_caption.facts() if f[0] == "obj"}
            if unseen_only and not (named & held):
                continue
            out.append({"scene": s.id, "kind": kind, "correct": flaw.correct, "flawed": flaw.flawed,
                        "detail": flaw.detail, "flaw": flaw})
    return out


def retrieval_hits(img: torch.Tensor, txt: torch.Tensor, captions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per query, whether its top-1 is a hit (the retrieved caption, or image, has the query's own
    caption text): image->text and text->image, (N,) bool each."""
    sim = img @ txt.T  # (N, N)
    same = np.array([[a == b for b in captions] for a in captions])
    rows = np.arange(len(captions))
    return same[rows, sim.argmax(1).numpy()], same[rows, sim.argmax(0).numpy()]


def _recall_at_1(img: torch.Tensor, txt: torch.Tensor, captions: list[str]) -> tuple[float, float]:
    i2t, t2i = retrieval_hits(img, txt, captions)
    return float(i2t.mean()), float(t2i.mean())


def _twins(scenes, items) -> list:
    """Each item's counterfactual image twin (:func:`capscore.scenes.graph.counterfactual`), or None."""
    by_id = {s.id: s for s in scenes}
    return [counterfactual(by_id[it["scene"]], it["flaw"]) if it["kind"] in COUNTERFACTUAL_KINDS else None
            for it in items]


def _evaluate_set(encoder, scenes, *, seed: int, unseen_only: bool, prefix: str) -> dict:
    images = {s.id: s.render() for s in scenes}
    img = encoder.encode_images(list(images.values()))
    captions = [s.short_caption() for s in scenes]
    txt = encoder.encode_texts([prefix + c for c in captions])
    i2t, t2i = _recall_at_1(img, txt, captions)
    row = {"n_scenes": len(scenes), "i2t_r1": i2t, "t2i_r1": t2i, "flips": {}}
    items = flip_items(scenes, seed=seed, unseen_only=unseen_only)
    index = {s.id: i for i, s in enumerate(scenes)}
    if items:
        good = encoder.encode_texts([prefix + it["correct"] for it in items])
        bad = encoder.encode_texts([prefix + it["flawed"] for it in items])
        im = img[[index[it["scene"]] for it in items]]
        wins = ((im * good).sum(1) > (im * bad).sum(1)).numpy()
        empty = encoder.encode_images([render_objects((), scenes[0].size)])  # (1, D)
        blind = ((empty * good).sum(1) > (empty * bad).sum(1)).numpy()
        twins = {k: t for k, t in enumerate(_twins(scenes, items)) if t is not None}
        paired = np.zeros(len(items), dtype=bool)
        if twins:  # the twin image must prefer the flawed caption, which is true of it, to the correct one
            keys = sorted(twins)
            tw = encoder.encode_images([twins[k].render() for k in keys])
            paired[keys] = wins[keys] & ((tw * bad[keys]).sum(1) > (tw * good[keys]).sum(1)).numpy()
        for kind in EVAL_KINDS:
            sel = [k for k, it in enumerate(items) if it["kind"] == kind]
            if sel:
                row["flips"][kind] = {"n": len(sel), "accuracy": float(np.mean(wins[sel])),
                                      "blind": float(np.mean(blind[sel]))}
                counts = np.array([len(scenes[index[items[k]["scene"]]].graph.objects) for k in sel])
                row["flips"][kind]["by_objects"] = {
                    str(c): {"n": int((counts == c).sum()), "accuracy": float(np.mean(wins[sel][counts == c]))}
                    for c in sorted(set(counts.tolist()))}
                if kind in BINDING_KINDS:
                    bound = np.array([needs_binding(scenes[index[items[k]["scene"]]], items[k]["flaw"]) for k in sel])
                    row["flips"][kind]["by_binding"] = {
                        name: {"n": int(m.sum()), "accuracy": float(np.mean(wins[sel][m])) if m.any() else None}
                        for name, m in (("free", ~bound), ("bound", bound))}
                both = [k for k in sel if k in twins]
                if both:
                    row["flips"][kind].update(n_paired=len(both), paired=float(np.mean(paired[both])))
    return row


def evaluate_scenes(backbone_or_encoder, *, n: int = 300, seed: int = EVAL_SEED, prefix: str = "",
                    size: int | None = None) -> dict:
    """{"seen": {...}, "unseen": {...}, "params": {...}} — see the module docstring. Scenes are drawn
    at ``size`` px, by default the model's input size (:func:`capscore.scenes.render_size`)."""
    if not isinstance(n, int) or n < 2:
        raise param_error("n", "evaluate_scenes", "an int >= 2", n)
    enc = backbone_or_encoder if isinstance(backbone_or_encoder, Encoder) else Encoder(backbone_or_encoder)
    size = size or render_size(enc)
    seen = generate_scenes(n, seed=seed, split="train", size=size)
    unseen = generate_scenes(n, seed=seed, split="heldout", size=size)
    return {
        "seen": _evaluate_set(enc, seen, seed=seed, unseen_only=False, prefix=prefix),
        "unseen": _evaluate_set(enc, unseen, seed=seed, unseen_only=True, prefix=prefix),
        "params": {"n": n, "seed": seed, "prefix": prefix, "size": size, "backbone": enc.backbone.identity},
    }


def format_report(res: dict, *, by_objects: bool = False, by_binding: bool = False) -> str:
    """The table ``capscore scenes eval`` prints; ``by_objects`` adds each set's accuracy per number of
    objects in the scene, ``by_binding`` on free and bound items (:func:`needs_binding`); cells
    ``accuracy (n)``."""
    p = res["params"]
    s, u = res["seen"], res["unseen"]
    rows = [{"": "R@1 image->text", "seen": s["i2t_r1"], "unseen": u["i2t_r1"]},
            {"": "R@1 text->image", "seen": s["t2i_r1"], "unseen": u["t2i_r1"]}]
    for kind in EVAL_KINDS:
        cells = {}
        for name, part in (("seen", s), ("unseen", u)):
            f = part["flips"].get(kind)
            cells[name] = f"{f['accuracy']:.3f} (n={f['n']})" if f else "-"
            cells[f"{name} blind"] = f"{f['blind']:.3f}" if f and "blind" in f else "-"
            cells[f"{name} paired"] = f"{f['paired']:.3f}" if f and "paired" in f else "-"
        rows.append({"": kind, **cells})
    out = [f"scenes evaluation: {p['n']} scenes per set, seed {p['seed']}, prefix {p['prefix']!r}",
           format_table(rows, digits=3, indent="")]
    if by_objects:
        for name, part in (("seen", s), ("unseen", u)):
            flips = {k: f.get("by_objects", {}) for k, f in part["flips"].items()}
            cols = sorted({c for b in flips.values() for c in b}, key=int)
            out += [f"{name}: accuracy by objects in the scene",
                    format_table([{"": k, **{c: (f"{b[c]['accuracy']:.2f} ({b[c]['n']})" if c in b else "-")
                                             for c in cols}} for k, b in flips.items()], indent="")]
    if by_binding:
        def cell(part, kind, b):
            c = part["flips"].get(kind, {}).get("by_binding", {}).get(b)
            return f"{c['accuracy']:.3f} ({c['n']})" if c and c["n"] else "-"

        out.append("accuracy on free items (a bag of the scene's words tells the captions apart) and bound items "
                   "(only binding values to objects does)")
        out.append(format_table([{"": k, **{f"{name} {b}": cell(part, k, b) for name, part in (("seen", s), ("unseen", u))
                                            for b in ("free", "bound")}} for k in BINDING_KINDS], indent=""))
    return "\n".join(out)
