"""Can a scenes model's image tower see shapes? Two diagnostics for issue 11's shape-flip gap.

1. Linear probe on frozen features: single-object scenes (``generate_scenes(..., min_objects=1,
   max_objects=1, split="all")``, drawn at the model's input size), the global image embedding and the
   mean patch token, a multinomial logistic regression (L-BFGS, L2 1e-3) fitted on 1500 scenes and
   scored on 500 others; shape (6 classes, chance 1/6) and colour (8 classes) accuracy per model.
2. Supervised control: the same image tower, from its random init, trained only to classify the
   shape of single-object scenes (a linear head, AdamW lr 1e-3 (``--lr``), wd 0.1, batch 128, fresh
   scenes every step); held-out accuracy on 500 scenes every 50 steps. If this rises, the architecture and the
   renderer let shape through, and a contrastive model that does not encode shape is short of signal or
   steps, not blind.

    python benchmarks/scenes_shape.py --model scenes-tiny ckpt:runs/v2/model.safetensors openclip:scenes-tiny-v2
    python benchmarks/scenes_shape.py --supervised openclip:scenes-tiny-v2 --steps 200
    python benchmarks/scenes_shape.py --supervised openclip:scenes-tiny-v2 --vision 64 4   # other pixels/patches
    python benchmarks/scenes_shape.py --supervised openclip:scenes-tiny-v2 --resnet 96 16  # a convolutional tower
    python benchmarks/scenes_shape.py --supervised openclip:scenes-tiny-v3 --steps 200     # v2 + a conv stem
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


def linear_probe(spec: str, *, n_train: int = 1500, n_test: int = 500, seed: int = 777) -> dict:
    from capscore.backbones import load_backbone
    from capscore.embed.engine import Encoder, MemoryCache
    from capscore.scenes import SHAPES, render_size

    bb = load_backbone(spec, seed=0)
    enc = Encoder(bb, cache=MemoryCache())
    scenes = _single_objects(n_train + n_test, seed, render_size(bb))
    colours = sorted({s.graph.objects[0].color for s in scenes})
    y_shape = torch.tensor([list(SHAPES).index(s.graph.objects[0].shape) for s in scenes])
    y_colour = torch.tensor([colours.index(s.graph.objects[0].color) for s in scenes])
    g, p = enc.image_patches([s.render() for s in scenes])
    return {f"{feat} {what}": _fit_linear(x, y, n_train)
            for feat, x in (("global", g), ("patch-mean", p.mean(1))) for what, y in (("shape", y_shape), ("colour", y_colour))}


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
    ap.add_argument("--steps", type=int, default=200)
    tower = ap.add_mutually_exclusive_group()
    tower.add_argument("--vision", nargs=2, type=int, metavar=("PIXELS", "PATCH"), default=None,
                    help="with --supervised openclip:NAME: the same architecture at another input and patch size")
    tower.add_argument("--resnet", nargs=2, type=int, metavar=("PIXELS", "WIDTH"), default=None,
                    help="with --supervised openclip:NAME: a ModifiedResNet image tower of this base width instead")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate of the supervised control")
    a = ap.parse_args(argv)
    if (a.vision or a.resnet) and not a.supervised:
        ap.error("--vision/--resnet change the tower of --supervised; give --supervised openclip:NAME")
    warnings.simplefilter("ignore")
    torch.set_num_threads(a.threads)
    for spec in a.model:
        t = time.perf_counter()
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
