"""Perception or binding: where a scenes model's global embedding loses what its patch tokens see.

``capscore scenes eval --by-binding`` splits flip items into *free* ones (the error's new value is nowhere
in the scene) and *bound* ones (it is on another object, so only binding tells the captions apart). This
script adds the three measurements behind docs/research/scenes-training.md § Perception or binding, all on
the same evaluation scenes (seed 12345) as ``scenes eval``:

1. **global vs local per number of objects**: each flip kind's accuracy with the global cosine (what
   ``scenes eval`` reports) and with ABE-CLIP's local token–patch score (``s_local``, no refinement,
   top-K pooling with ``--k``), per number of objects in the scene. Needs a model with patch tokens.
   If the local score wins items the global one loses, the image tower sees the difference and the
   pooled embedding drops it. Beside them a third score, the mean-pooled tokens (cosine of the mean
   word token and the mean patch token; :func:`global_vs_local`), a fourth, the second-order pooled
   tokens (cosine of the mean outer products, Lin et al. 2015's bilinear pooling), and all four on free
   and bound items (:func:`capscore.scenes.evaluate.needs_binding`): the third tells whether the tokens
   hold conjunctions as linear features (then averaging them would bind) or the local score binds only
   through its max; the fourth whether one vector per side can keep the local score's binding.
2. **how close each tower puts a minimal pair**: the mean cosine between a flip item's correct and flawed
   caption (text tower) and between its scene and the scene's counterfactual twin (image tower,
   :func:`capscore.scenes.graph.counterfactual`), against random pairs of the same items; and the mean
   global margin cos(scene, correct) − cos(scene, flawed).
3. **what R@1 misses retrieve** (image→text over the ``n`` seen scenes' short captions): the share of
   misses whose retrieved caption names only shapes and colours that occur in the query scene (a
   bag-of-words confusion), against the same share over all other captions; the share whose retrieved
   caption is true of the image (oracle precision 1: a miss only by the exact-text rule); and R@1 by
   the number of objects in the scene.
4. **is the binding there to read?** (``--probe N``: N fresh training scenes of two objects
   (``--probe-objects``), seed 4242, not the evaluation ones) a probe on each tower's frozen global
   embedding of attribute-swap minimal pairs: a scene and its counterfactual twin (two groups' colours
   swapped), and the correct and swapped captions. The label is
   whether the alphabetically first of the two shapes wears the alphabetically first of the two colours;
   the two members of a pair have the same bag of shapes and colours and opposite labels, so an embedding
   that keeps only the bag scores exactly chance. A linear probe and a one-hidden-layer MLP (256 ReLU
   units), fitted on 75 % of the pairs and scored on the other 25 % (whole pairs held out), beside the
   global cosine's own accuracy on the same pairs. A high MLP probe with the linear probe and the cosine
   near chance means the tower carries the binding in a form a dot product does not read; a probe at
   chance means the tower has dropped it. Run it on the random init of the
   architecture (``--model openclip:ARCH``) for the baseline of untrained random features.

    python experiments/scenes_binding.py                       # scenes-tiny, 300 scenes (flips) / 500 (R@1)
    python experiments/scenes_binding.py --model openclip:scenes-tiny-v1/DIR/scenes-tiny.safetensors --json out.json  # v1, rebuilt by its recipe
    python experiments/scenes_binding.py --n 20 --n-retrieval 20 --probe 8000   # part 4 (about 30 s)
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from capscore.scenes.vocab import MAX_OBJECTS

PROBE_SEED = 4242  # part 4's scenes: fresh training scenes, not scenes eval's


def second_order_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine of the flattened second-order pools of two token sets, (A, D) and (B, D): of
    ``mean_i a_i a_iᵀ`` and ``mean_j b_j b_jᵀ``, without building the D × D matrices (their Frobenius
    product is ``mean_{i,j} (a_i·b_j)²``, and each norm the same sum within one set)."""
    return (a @ b.T).pow(2).mean() / ((a @ a.T).pow(2).mean() * (b @ b.T).pow(2).mean()).sqrt()


def global_vs_local(encoder, scenes, items, *, k: int = 1) -> dict:
    """{kind: {"global": {n_objects: acc}, "local": {...}, "mean": {...}, "n": {...}}} plus "all" per kind,
    and for colour, shape, count and hallucination "by_binding": {score: {"free": acc, "bound": acc}}.

    "mean" is a third score: the cosine between the mean of the caption's word-token vectors (start and
    end tokens dropped, as the local score drops them) and the mean of the image's patch tokens, both
    normalised per token first. It is what a global embedding pooled by averaging the joint-space tokens
    would score: if the tokens carried (shape, colour) conjunctions as linear features, it would bind as
    the local score does; if the local score binds only through its max over patches, it would not.

    "second" is a fourth: the cosine between the flattened means of the tokens' outer products,
    ``mean_w t_w t_wᵀ`` and ``mean_p p_p p_pᵀ`` (D² numbers each, the same normalised tokens; computed as
    ``mean_{w,p} (t_w·p_p)²`` over the two Frobenius norms). Products of a token's own features are
    conjunctions of what one patch (or one contextual word) holds, so this single vector per side keeps
    some of the locality the local score binds with, with no training."""
    from capscore.scenes.evaluate import BINDING_KINDS, needs_binding
    from capscore.scores.abe import abe_components, make_config

    by_id = {s.id: s for s in scenes}
    images = [by_id[it["scene"]].render() for it in items]
    cfg = make_config(k=k, refine=False, binding_difference=False, omega=0.0)
    good = abe_components(encoder, images, [it["correct"] for it in items], config=cfg)
    bad = abe_components(encoder, images, [it["flawed"] for it in items], config=cfg)
    _, patches = encoder.image_patches(images)
    patches = torch.nn.functional.normalize(patches.float(), dim=-1)  # (N, P, D)
    pooled = patches.mean(1)  # (N, D)

    def scores(texts):
        toks = [t.vectors[1:-1].float() for t in encoder.text_tokens(texts)]
        mean = torch.nn.functional.cosine_similarity(torch.stack([t.mean(0) for t in toks]), pooled, dim=-1)
        second = torch.stack([second_order_cosine(t, patches[i]) for i, t in enumerate(toks)])
        return mean, second

    (good_mean, good_second), (bad_mean, bad_second) = scores([it["correct"] for it in items]), scores([it["flawed"] for it in items])
    wins = {"global": (good.global_ > bad.global_).numpy(), "local": (good.local > bad.local).numpy(),
            "mean": (good_mean > bad_mean).numpy(), "second": (good_second > bad_second).numpy()}
    objects = np.array([len(by_id[it["scene"]].objects) for it in items])
    bound = np.array([bool(needs_binding(by_id[it["scene"]], it["flaw"])) for it in items])
    out: dict = {}
    for kind in dict.fromkeys(it["kind"] for it in items):
        sel = np.array([it["kind"] == kind for it in items])
        row = {"all": {name: float(w[sel].mean()) for name, w in wins.items()}, "n": int(sel.sum())}
        for name, w in wins.items():
            row[name] = {str(c): float(w[sel & (objects == c)].mean()) for c in sorted(set(objects[sel].tolist()))}
        row["n_by_objects"] = {str(c): int((sel & (objects == c)).sum()) for c in sorted(set(objects[sel].tolist()))}
        if kind in BINDING_KINDS:
            row["n_bound"] = int((sel & bound).sum())
            row["by_binding"] = {name: {part: float(w[sel & m].mean()) if (sel & m).any() else None
                                        for part, m in (("free", ~bound), ("bound", bound))}
                                 for name, w in wins.items()}
        out[kind] = row
    return out


def tower_closeness(encoder, scenes, items) -> dict:
    """{kind: {"text", "text_random", "image", "image_random", "margin", "n"}} over items that have a twin."""
    from capscore.scenes.evaluate import _twins

    by_id = {s.id: s for s in scenes}
    twins = _twins(scenes, items)
    out = {}
    for kind in dict.fromkeys(it["kind"] for it in items):
        sel = [i for i, it in enumerate(items) if it["kind"] == kind and twins[i] is not None]
        if len(sel) < 2:
            continue
        good = encoder.encode_texts([items[i]["correct"] for i in sel])
        bad = encoder.encode_texts([items[i]["flawed"] for i in sel])
        img = encoder.encode_images([by_id[items[i]["scene"]].render() for i in sel])
        twin = encoder.encode_images([twins[i].render() for i in sel])
        out[kind] = {"n": len(sel), "text": float((good * bad).sum(1).mean()),
                     "text_random": float((good * good.roll(1, 0)).sum(1).mean()),
                     "image": float((img * twin).sum(1).mean()),
                     "image_random": float((img * img.roll(1, 0)).sum(1).mean()),
                     "margin": float(((img * good).sum(1) - (img * bad).sum(1)).mean())}
    return out


def retrieval_misses(encoder, scenes) -> dict:
    """Image→text R@1 over the scenes' short captions, and what its misses retrieve."""
    from capscore.scenes import captions, oracle
    from capscore.scenes.evaluate import retrieval_hits

    caps = [captions.short(s) for s in scenes]
    texts = [c.text for c in caps]
    named = [{f[1:3] for f in c.facts() if f[0] == "obj"} for c in caps]
    shapes = [{o.shape for o in s.objects} for s in scenes]
    colours = [{o.color for o in s.objects} for s in scenes]
    img, txt = encoder.encode_images([s.render() for s in scenes]), encoder.encode_texts(texts)
    best = (img @ txt.T).argmax(1).numpy()

    def bag_ok(i: int, j: int) -> bool:  # every shape and every colour caption j names occurs in scene i
        return all(s in shapes[i] and c in colours[i] for s, c in named[j])

    hit, _ = retrieval_hits(img, txt, texts)
    misses = np.flatnonzero(~hit).tolist()
    objects = np.array([len(s.objects) for s in scenes])
    return {"n": len(scenes), "r1": 1 - len(misses) / len(scenes), "misses": len(misses),
            "r1_by_objects": {str(c): float(hit[objects == c].mean()) for c in sorted(set(objects.tolist()))},
            "misses_true_of_image": float(np.mean([oracle(scenes[i], caps[best[i]]).precision == 1.0 for i in misses]))
            if misses else None,
            "misses_bag_consistent": float(np.mean([bag_ok(i, best[i]) for i in misses])) if misses else None,
            "all_captions_bag_consistent": float(np.mean([np.mean([bag_ok(i, j) for j in range(len(scenes)) if j != i])
                                                          for i in misses])) if misses else None}


def swap_pairs(n: int, *, seed: int, size: int, objects: tuple[int, int] = (2, 2)) -> list[dict]:
    """Attribute-swap minimal pairs from ``n`` fresh training scenes of ``objects`` = (min, max) objects
    (default two: the image then holds only what the captions name, as the captions do):
    {"scene", "twin", "correct", "flawed", "label"}; ``label`` is 1 when, in ``scene``, the alphabetically
    first of the two swapped groups' shapes has the alphabetically first of their colours (the twin and
    the flawed caption: 1 − label)."""
    from capscore.scenes import generate_scenes
    from capscore.scenes.evaluate import _twins, flip_items

    scenes = generate_scenes(n, seed=seed, split="train", size=size, min_objects=objects[0], max_objects=objects[1])
    items = flip_items(scenes, seed=seed, kinds=("attribute_swap",))  # the flaws scenes eval would draw
    by_id = {s.id: s for s in scenes}
    out = []
    for it, twin in zip(items, _twins(scenes, items)):
        if twin is None:
            continue
        a, b = it["flaw"].correct_caption.units[0].claims
        first = min((a, b), key=lambda m: m.shape)
        out.append({"scene": by_id[it["scene"]], "twin": twin, "correct": it["correct"], "flawed": it["flawed"],
                    "label": int(first.color == min(a.color, b.color))})
    return out


def _probe(x: torch.Tensor, y: torch.Tensor, train: torch.Tensor, *, hidden: int, seed: int = 0) -> dict:
    """Fit a linear (``hidden`` = 0) or one-hidden-layer probe on rows ``train`` (full batch, AdamW, 500
    steps, weight decay 1e-2); accuracy on the train rows and on the others."""
    g = torch.Generator().manual_seed(seed)
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-6
    x = (x - mu) / sd
    d = x.shape[1]
    layers = [torch.nn.Linear(d, 1)] if hidden == 0 else [torch.nn.Linear(d, hidden), torch.nn.ReLU(),
                                                            torch.nn.Linear(hidden, 1)]
    net = torch.nn.Sequential(*layers)
    with torch.no_grad():
        for m in net:
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.weight.shape[1] ** 0.5)
                m.bias.zero_()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2 if hidden == 0 else 3e-3, weight_decay=1e-2)
    yf = y.float()
    for _ in range(500):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(net(x[train]).squeeze(1), yf[train]).backward()
        opt.step()
    with torch.no_grad():
        hit = (net(x).squeeze(1) > 0).long() == y
    return {"train": float(hit[train].float().mean()), "test": float(hit[~train].float().mean())}


def probe_features(img: torch.Tensor, txt: torch.Tensor, labels: torch.Tensor, *, seed: int = 0) -> dict:
    """Part 4 on given features. ``img``, ``txt``: (2n, D), rows 0..n-1 the scenes and their correct
    captions, rows n..2n-1 the twins and the flawed captions; ``labels``: (2n,). Returns {"n_pairs",
    "cosine", "image"|"text": {"linear"|"mlp": {"train", "test"}}}; ``cosine`` is the global score's own
    accuracy on the pairs, both ways (each image prefers its own caption of the two)."""
    n = img.shape[0] // 2
    if n < 8:
        raise ValueError(f"only {n} attribute-swap pairs: pass a larger --probe")
    own = (img * txt).sum(1)  # scene with its correct caption, twin with the flawed one
    other = (img * txt.roll(n, 0)).sum(1)  # and with each other's
    held = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: n // 4]
    train = torch.ones(n, dtype=torch.bool)
    train[held] = False
    train = torch.cat([train, train])  # a pair's two members fall on the same side
    return {"n_pairs": n, "cosine": float((own > other).float().mean()),
            **{tower: {"linear": _probe(x, labels, train, hidden=0, seed=seed),
                       "mlp": _probe(x, labels, train, hidden=256, seed=seed)}
               for tower, x in (("image", img), ("text", txt))}}


def binding_probe(encoder, pairs: list[dict], *, seed: int = 0) -> dict:
    """:func:`probe_features` on ``encoder``'s global embeddings of :func:`swap_pairs`."""
    with torch.no_grad():
        img = torch.cat([encoder.encode_images([p["scene"].render() for p in pairs]),
                         encoder.encode_images([p["twin"].render() for p in pairs])])
        txt = torch.cat([encoder.encode_texts([p["correct"] for p in pairs]),
                         encoder.encode_texts([p["flawed"] for p in pairs])])
    labels = torch.tensor([p["label"] for p in pairs] + [1 - p["label"] for p in pairs])
    return probe_features(img, txt, labels, seed=seed)


def main(argv=None) -> dict:
    from capscore.backbones import load_backbone
    from capscore.embed.engine import Encoder
    from capscore.scenes import generate_scenes, render_size
    from capscore.scenes.evaluate import EVAL_SEED, flip_items

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="scenes-tiny")
    ap.add_argument("--n", type=int, default=300, help="seen scenes for parts 1 and 2 (default 300)")
    ap.add_argument("--n-retrieval", type=int, default=500, help="seen scenes for part 3 (default 500)")
    ap.add_argument("--k", type=int, default=1, help="top-K pooling of the local score (default 1)")
    ap.add_argument("--probe", type=int, default=0, metavar="N",
                    help="part 4: probe the frozen embeddings of attribute-swap pairs from N fresh scenes (0: skip)")
    ap.add_argument("--probe-objects", type=int, nargs=2, default=(2, 2), metavar=("MIN", "MAX"),
                    help="objects per probe scene (default 2 2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.probe and not 2 <= args.probe_objects[0] <= args.probe_objects[1] <= MAX_OBJECTS:
        ap.error(f"--probe-objects: MIN and MAX with 2 <= MIN <= MAX <= {MAX_OBJECTS} (a swap needs two objects), "
                 f"not {args.probe_objects[0]} {args.probe_objects[1]}")
    torch.set_num_threads(args.threads)
    enc = Encoder(load_backbone(args.model))
    size = render_size(enc)
    scenes = generate_scenes(args.n, seed=EVAL_SEED, split="train", size=size)
    items = flip_items(scenes, seed=EVAL_SEED)
    res = {"model": args.model, "identity": enc.backbone.identity, "n": args.n, "k": args.k}
    if enc.backbone.has_patch_tokens:
        res["global_vs_local"] = global_vs_local(enc, scenes, items, k=args.k)
        print(f"1. flip accuracy, global cosine / local token-patch score (K={args.k}) / mean-pooled tokens, "
              f"{args.n} seen scenes")
        for kind, row in res["global_vs_local"].items():
            cells = "  ".join(f"{c}: {row['global'][c]:.2f}/{row['local'][c]:.2f}" for c in row["global"])
            print(f"  {kind:15s} all {row['all']['global']:.3f}/{row['all']['local']:.3f}/{row['all']['mean']:.3f}"
                  f"/{row['all']['second']:.3f}"
                  f"  by objects (global/local) {cells}")
        print("   free / bound items (global; local; mean-pooled; second-order pooled)")
        for kind, row in res["global_vs_local"].items():
            if "by_binding" in row:
                cells = "; ".join(f"{b['free']:.3f} / {b['bound']:.3f}" if b["bound"] is not None else f"{b['free']:.3f} / -"
                                  for b in row["by_binding"].values())
                print(f"  {kind:15s} {cells}  (bound n={row['n_bound']})")
    else:
        print(f"1. skipped: {args.model} has no patch tokens")
    res["closeness"] = tower_closeness(enc, scenes, items)
    print("2. mean cosine of each minimal pair (random pairs in brackets), and the global margin")
    for kind, row in res["closeness"].items():
        print(f"  {kind:15s} text {row['text']:.3f} ({row['text_random']:.3f})  image {row['image']:.3f} "
              f"({row['image_random']:.3f})  margin {row['margin']:+.4f}  n={row['n']}")
    r = res["retrieval"] = retrieval_misses(enc, generate_scenes(args.n_retrieval, seed=EVAL_SEED, split="train",
                                                                   size=size))
    if r["misses"]:
        print(f"3. image->text R@1 {r['r1']:.3f} on {r['n']} seen scenes; of its {r['misses']} misses "
              f"{r['misses_bag_consistent']:.2f} retrieve a caption whose shapes and colours all occur in the "
              f"scene (all other captions: {r['all_captions_bag_consistent']:.2f}), {r['misses_true_of_image']:.2f} one "
              f"that is true of the image (oracle precision 1)")
        print("   R@1 by objects in the scene: " + "  ".join(f"{c}: {v:.2f}" for c, v in r["r1_by_objects"].items()))
    else:
        print(f"3. image->text R@1 {r['r1']:.3f} on {r['n']} seen scenes: no misses")
    if args.probe:
        pairs = swap_pairs(args.probe, seed=PROBE_SEED, size=size, objects=tuple(args.probe_objects))
        if len(pairs) < 8:
            ap.error(f"--probe {args.probe}: only {len(pairs)} attribute-swap pairs; "
                     "pass a larger N (8000 gives 2527)")
        pr = res["probe"] = binding_probe(enc, pairs)
        print(f"4. swap label read from frozen global embeddings, {pr['n_pairs']} attribute-swap pairs "
              f"(test accuracy on held-out pairs; chance 0.5; train in brackets); the global cosine itself "
              f"picks the right caption for {pr['cosine']:.3f} of the {2 * pr['n_pairs']} images")
        for tower in ("image", "text"):
            print(f"  {tower:5s} linear {pr[tower]['linear']['test']:.3f} ({pr[tower]['linear']['train']:.3f})  "
                  f"mlp {pr[tower]['mlp']['test']:.3f} ({pr[tower]['mlp']['train']:.3f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
