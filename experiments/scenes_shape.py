"""Can a scenes model's image tower see shapes? Diagnostics for the shape-flip gap.

1. Linear probe on frozen features: single-object scenes (``generate_scenes(..., min_objects=1,
   max_objects=1, split="all")``, drawn at the model's input size), the global image embedding and the
   mean patch token, a multinomial logistic regression (L-BFGS, L2 1e-3) fitted on 1500 scenes and
   scored on 500 others; shape (6 classes, chance 1/6) and colour (8 classes) accuracy per model.
2. Supervised control: the same image tower, from its random init, trained only to classify the
   shape of single-object scenes (a linear head, AdamW lr 1e-3 (``--lr``), wd 0.1, batch 128, fresh
   scenes every step); held-out accuracy on 500 scenes every 50 steps. If this rises, the architecture and the
   renderer let shape through, and a contrastive model that does not encode shape is short of signal or
   steps, not blind.
3. Contrastive control: the whole model from its random init, trained only with CLIP's InfoNCE on fresh
   scenes (``--objects MIN MAX`` per scene) and their short captions, same optimiser and batch; the linear
   probe of (1) on its image tower every 100 steps; ``--lock-text`` keeps the text tower at its init.
4. Sensitivity (``--sensitivity`` with ``--model``): how far each tower's embedding moves when one
   object's colour, shape, size or pattern changes, relative to the distance between two scenes.

    python experiments/scenes_shape.py --model scenes-tiny ckpt:runs/v2/model.safetensors openclip:scenes-tiny-v2
    python experiments/scenes_shape.py --supervised openclip:scenes-tiny-v2 --steps 200
    python experiments/scenes_shape.py --supervised openclip:scenes-tiny-v2 --vision 64 4   # other pixels/patches
    python experiments/scenes_shape.py --supervised openclip:scenes-tiny-v2 --resnet 96 16  # a convolutional tower
    python experiments/scenes_shape.py --supervised openclip:scenes-tiny-v3 --steps 200     # v2 + a conv stem
    python experiments/scenes_shape.py --contrastive openclip:scenes-tiny-v3 --objects 1 1  # InfoNCE, single objects
    python experiments/scenes_shape.py --contrastive openclip:scenes-tiny-v3 --lock-text    # ... text tower locked
    python experiments/scenes_shape.py --sensitivity --model scenes-tiny openclip:scenes-tiny-v3
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch

SHAPES_KEY = "shape"


def _single_objects(n: int, seed: int, size: int, start: int = 0):
    from capscore.scenes import generate_scenes

    return generate_scenes(n, seed=seed, split="all", min_objects=1, max_objects=1, size=size, start=start)


def _fit_linear(x: torch.Tensor, y: torch.Tensor, n_train: int) -> float:
    x = (x - x[:n_train].mean(0)) / (x[:n_train].std(0) + 1e-6)
    k = int(y.max()) + 1
    w = torch.zeros(x.shape[1], k, requires_grad=True)
    b = torch.zeros(k, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x[:n_train] @ w + b, y[:n_train]) + 1e-3 * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(((x[n_train:] @ w + b).argmax(1) == y[n_train:]).float().mean())


def linear_probe(spec, *, n_train: int = 1500, n_test: int = 500, seed: int = 777) -> dict:
    """``spec``: a backbone spec, or a loaded backbone (probed as it is now)."""
    from capscore.backbones import load_backbone
    from capscore.embed.engine import Encoder, MemoryCache
    from capscore.scenes import SHAPES, render_size

    bb = load_backbone(spec, seed=0) if isinstance(spec, str) else spec
    enc = Encoder(bb, cache=MemoryCache())
    scenes = _single_objects(n_train + n_test, seed, render_size(bb))
    colours = sorted({s.graph.objects[0].color for s in scenes})
    y_shape = torch.tensor([list(SHAPES).index(s.graph.objects[0].shape) for s in scenes])
    y_colour = torch.tensor([colours.index(s.graph.objects[0].color) for s in scenes])
    g, p = enc.image_patches([s.render() for s in scenes])
    return {f"{feat} {what}": _fit_linear(x, y, n_train)
            for feat, x in (("global", g), ("patch-mean", p.mean(1))) for what, y in (("shape", y_shape), ("colour", y_colour))}


ATTRIBUTES = ("color", "shape", "size", "pattern")


def sensitivity(spec, *, n: int = 200, objects: int = 1, seed: int = 3) -> dict:
    """How far each tower moves when one attribute of one object changes, relative to a random pair.

    ``n`` scenes of ``objects`` objects (``split="all"``); for each attribute the first object gets
    another value (a scene whose edit would leave two objects of one shape and colour but different size or
    pattern is skipped). Image side: the scene and its edit rendered; text side: a caption naming every
    group of each (``Unit("picture", ...)``, template style 0). Sensitivity = mean (1 - cos(x, x_edit)) /
    mean (1 - cos(x_i, x_(i+1))): 0 means the tower ignores the attribute, 1 means the edit moves an
    embedding as far as another scene does."""
    import dataclasses

    import numpy as np
    import torch.nn.functional as F

    from capscore.backbones import load_backbone
    from capscore.scenes import COLOR_NAMES, PATTERNS, SHAPES, SIZES, generate_scenes, render_size
    from capscore.scenes.claims import Mention, Unit
    from capscore.scenes.captions import Caption
    from capscore.scenes.graph import build_graph, render_objects
    from capscore.train.loop import encode_texts_bucketed

    bb = load_backbone(spec, seed=0) if isinstance(spec, str) else spec
    bb.model.eval()
    size, rng = render_size(bb), np.random.default_rng(seed)
    values = {"shape": SHAPES, "color": COLOR_NAMES, "size": SIZES, "pattern": (None, *PATTERNS)}
    scenes = generate_scenes(n, seed=seed, split="all", min_objects=objects, max_objects=objects, size=size)

    def caption(objs) -> str:
        return Caption((Unit("picture", tuple(Mention(g.shape, g.color, g.count, g.size, g.pattern)
                                              for g in build_graph(objs).groups)),)).realise(style=0)

    def embed(objs_list, side):
        with torch.no_grad():
            if side == "image":
                x = bb.forward_images(torch.stack([bb.preprocess(render_objects(o, size)) for o in objs_list]))[0]
            else:
                x = encode_texts_bucketed(bb, [caption(o) for o in objs_list])
        return F.normalize(x.float(), dim=-1)

    out = {}
    for attr in ATTRIBUTES:
        pairs = []
        for s in scenes:
            o = s.graph.objects
            first = o[0]
            new = dataclasses.replace(first, **{attr: values[attr][int(rng.choice(
                [i for i, v in enumerate(values[attr]) if v != getattr(first, attr)]))]})
            edit = (new, *o[1:])
            try:
                build_graph(edit)
            except ValueError:
                continue
            pairs.append((o, edit))
        for side in ("image", "text"):
            a, b = embed([p[0] for p in pairs], side), embed([p[1] for p in pairs], side)
            moved = float((1 - (a * b).sum(1)).mean())
            apart = float((1 - (a * a.roll(1, 0)).sum(1)).mean())
            out[f"{side} {attr}"] = moved / apart
    return out


def supervised(spec: str, *, steps: int, batch: int = 128, seed: int = 99, every: int = 50,
               lr: float = 1e-3) -> list[tuple[int, float]]:
    from capscore.backbones import load_backbone
    from capscore.scenes import SHAPES, render_size

    torch.manual_seed(0)
    bb = load_backbone(spec, seed=0)
    vis, size = bb.model.visual, render_size(bb)
    head = torch.nn.Linear(bb.embed_dim, len(SHAPES))

    def data(start: int, n: int):
        sc = _single_objects(n, seed, size, start=start)
        return (torch.stack([bb.preprocess(s.render()) for s in sc]),
                torch.tensor([list(SHAPES).index(s.graph.objects[0].shape) for s in sc]))

    opt = torch.optim.AdamW([*vis.parameters(), *head.parameters()], lr=lr, weight_decay=0.1)
    x_test, y_test = data(10_000_000, 500)
    curve = []
    for k in range(steps):
        x, y = data(k * batch, batch)
        loss = torch.nn.functional.cross_entropy(head(vis(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (k + 1) % every == 0 or k + 1 == steps:
            with torch.no_grad():
                curve.append((k + 1, float((head(vis(x_test)).argmax(1) == y_test).float().mean())))
    return curve


def contrastive(spec: str, *, steps: int, objects: tuple[int, int] = (1, 1), batch: int = 128, seed: int = 99,
                every: int = 100, lr: float = 1e-3, lock_text: bool = False) -> list[tuple[int, dict]]:
    """The contrastive control: the whole model (both towers) from its random init, trained only with
    CLIP's symmetric InfoNCE (:func:`capscore.train.objectives.contrastive_loss`) on fresh scenes with
    ``objects`` = (min, max) objects and their short captions; the linear probe of :func:`linear_probe`
    on the image tower every ``every`` steps. Same optimiser, batch and data seed as :func:`supervised`:
    if that learns shape and this does not, the objective is short of shape signal, not the tower.
    ``lock_text``: the text tower stays at its random init (no gradient, no weight decay), so the image
    tower chases fixed caption embeddings as the supervised control chases fixed labels."""
    from capscore.backbones import load_backbone
    from capscore.scenes import generate_scenes, render_size
    from capscore.train.loop import encode_texts_bucketed
    from capscore.train.objectives import contrastive_loss

    torch.manual_seed(0)
    bb = load_backbone(spec, seed=0)
    size = render_size(bb)
    params = [*bb.model.visual.parameters(), bb.model.logit_scale] if lock_text else list(bb.model.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.1)
    curve = [(0, linear_probe(bb))]
    for k in range(steps):
        sc = generate_scenes(batch, seed=seed, split="train", min_objects=objects[0], max_objects=objects[1],
                             size=size, start=k * batch)
        bb.model.train()
        img, _ = bb.forward_images(torch.stack([bb.preprocess(s.render()) for s in sc]))
        with torch.set_grad_enabled(not lock_text):
            txt = encode_texts_bucketed(bb, [s.short_caption() for s in sc])
        loss = contrastive_loss(img, txt, bb.logit_scale.exp())
        opt.zero_grad()
        loss.backward()
        opt.step()
        bb.model.eval()
        if (k + 1) % every == 0 or k + 1 == steps:
            curve.append((k + 1, {"loss": float(loss), **linear_probe(bb)}))
    return curve


def vision_variant(spec: str, image_size: int, patch_size: int = 0, *, resnet_width: int = 0) -> str:
    """Register an ``openclip:NAME`` architecture with another input size and patch size (the rest of its
    config unchanged) and return its spec, for the supervised control at other resolutions. With
    ``resnet_width`` the image tower is instead open_clip's ModifiedResNet (CLIP's RN: conv stem,
    one bottleneck block per stage, attention pooling) of that base width."""
    import json
    import tempfile

    import open_clip

    import capscore.backbones.openclip  # noqa: F401  (registers capscore's own configs)

    from capscore.backbones.convstem import CONV_STEMS

    name = spec.removeprefix("openclip:")
    if name in CONV_STEMS:
        raise SystemExit(f"{spec}: --vision/--resnet rebuild a patchify tower from the JSON config and would drop "
                         f"{name}'s convolutional stem; give a patchify architecture (e.g. openclip:scenes-tiny-v2)")
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        raise SystemExit(f"{spec}: not an open_clip architecture name (give openclip:NAME)")
    if resnet_width:
        cfg["vision_cfg"] = dict(image_size=image_size, layers=[1, 1, 1, 1], width=resnet_width,
                                 head_width=resnet_width)
        new = f"{name}-{image_size}px-rn{resnet_width}"
    else:
        cfg["vision_cfg"].update(image_size=image_size, patch_size=patch_size)
        new = f"{name}-{image_size}px-p{patch_size}"
    folder = tempfile.mkdtemp(prefix="capscore-shape-")
    with open(f"{folder}/{new}.json", "w") as f:
        json.dump(cfg, f)
    open_clip.add_model_config(folder)
    return f"openclip:{new}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="*", default=[], help="models for the linear probe")
    ap.add_argument("--supervised", default=None, metavar="SPEC", help="train this architecture's image tower on shape")
    ap.add_argument("--sensitivity", action="store_true",
                    help="for each --model: each tower's sensitivity to colour, shape, size, pattern edits")
    ap.add_argument("--contrastive", default=None, metavar="SPEC",
                    help="train this architecture from random init with CLIP's InfoNCE on scenes and short captions")
    ap.add_argument("--objects", nargs=2, type=int, metavar=("MIN", "MAX"), default=(1, 1),
                    help="objects per training scene of --contrastive (default 1 1: single objects)")
    ap.add_argument("--lock-text", action="store_true", help="with --contrastive: keep the text tower at its init")
    ap.add_argument("--steps", type=int, default=200)
    tower = ap.add_mutually_exclusive_group()
    tower.add_argument("--vision", nargs=2, type=int, metavar=("PIXELS", "PATCH"), default=None,
                    help="with --supervised openclip:NAME: the same architecture at another input and patch size")
    tower.add_argument("--resnet", nargs=2, type=int, metavar=("PIXELS", "WIDTH"), default=None,
                    help="with --supervised openclip:NAME: a ModifiedResNet image tower of this base width instead")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate of the supervised control")
    a = ap.parse_args(argv)
    if (a.lock_text or tuple(a.objects) != (1, 1)) and not a.contrastive:
        ap.error("--lock-text/--objects change the run of --contrastive; give --contrastive openclip:NAME")
    if a.sensitivity and not a.model:
        ap.error("--sensitivity measures the models of --model; give --model SPEC ...")
    if not 1 <= a.objects[0] <= a.objects[1] <= 6:
        ap.error(f"--objects {a.objects[0]} {a.objects[1]}: need 1 <= MIN <= MAX <= 6")
    if (a.vision or a.resnet) and not a.supervised:
        ap.error("--vision/--resnet change the tower of --supervised; give --supervised openclip:NAME")
    warnings.simplefilter("ignore")
    torch.set_num_threads(a.threads)
    for spec in a.model:
        t = time.perf_counter()
        if a.sensitivity:
            from capscore.backbones import load_backbone

            bb = load_backbone(spec, seed=0)  # loaded once for both scene sizes
            for k in (1, 3):
                res = sensitivity(bb, objects=k)
                print(f"{spec} sensitivity, {k} object(s): " + "  ".join(f"{key} {v:.3f}" for key, v in res.items()))
            continue
        res = linear_probe(spec)
        print(f"{spec}: " + "  ".join(f"{k} {v:.3f}" for k, v in res.items()) + f"  ({time.perf_counter() - t:.0f} s)")
    if a.supervised:
        if a.vision:
            a.supervised = vision_variant(a.supervised, *a.vision)
        elif a.resnet:
            a.supervised = vision_variant(a.supervised, a.resnet[0], resnet_width=a.resnet[1])
        t = time.perf_counter()
        for step, acc in supervised(a.supervised, steps=a.steps, lr=a.lr):
            print(f"supervised {a.supervised}: step {step:4d}  held-out shape accuracy {acc:.3f}  "
                  f"({time.perf_counter() - t:.0f} s)")
    if a.contrastive:
        t = time.perf_counter()
        for step, res in contrastive(a.contrastive, steps=a.steps, objects=tuple(a.objects), lr=a.lr,
                                     lock_text=a.lock_text):
            print(f"contrastive {a.contrastive}{' locked text' if a.lock_text else ''} objects {a.objects[0]}-{a.objects[1]}: step {step:4d}  "
                  + "  ".join(f"{k} {v:.3f}" for k, v in res.items()) + f"  ({time.perf_counter() - t:.0f} s)",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
