"""Does a supervised conjunction head teach the global image embedding to bind?

The bundled scenes-tiny misses its seen shape and hallucination targets on *bound* items, where only
knowing which colour sits on which shape tells the captions apart (docs/research/scenes-training.md § Perception or
binding), and the swap-dominant continuation learns swaps only after a long plateau. One reading of that
plateau: each tower's contrastive gradient for a conjunction is proportional to how far the *other*
tower already separates it, so neither starts. This script breaks the symmetry on the image side with
ground truth the scenes provide: a linear head on the L2-normalised global image embedding predicts
which (shape, colour) pairs are in the scene (6 × 8 = 48 labels, multi-label BCE, logits × ``--scale``;
``--count`` adds 48 labels "this pair occurs at least twice"), added with weight ``--lam`` to the
scenes-tiny recipe's loss (:func:`capscore.train.scenes_tiny.step`). If the embedding becomes linear in
conjunctions, the cosine can read them and the text tower's gradient for swaps no longer starts at zero.

Everything else is the swap-dominant continuation of docs/research/scenes-training.md ("Binding can be learnt, slowly"):
from the bundled model's stage-2 run, FILIP 0.5, image twins 1.0, ``negative_weights=0,0,0,1,0,0``, lr
7.5e-4, 20 warm-up steps, batch 128, through the one training loop. The head is initialised with
``torch.manual_seed(1234)`` and dropped before export: OUT/scenes-tiny.safetensors is a plain
scenes-tiny-v3 file (evaluate it with ``capscore -q scenes eval --n 500 --by-binding --model
'ckpt:OUT/scenes-tiny.safetensors#arch=scenes-tiny-v3'``). The result (no faster binding) is in
docs/research/scenes-training.md.

    python experiments/scenes_conjunction_head.py --out runs/aux/r2 --steps 150 --scale 30
    python experiments/scenes_conjunction_head.py --out runs/aux/r3 --steps 450 --scale 30
"""
from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="ckpt:runs/scenes-tiny-v3-stage2/model.safetensors#arch=scenes-tiny-v3",
                    help="start (default: the bundled model's stage-2 run, fp32)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lam", type=float, default=1.0, help="weight of the head's BCE (0: the plain continuation)")
    ap.add_argument("--scale", type=float, default=30.0, help="multiplies the head's logits")
    ap.add_argument("--count", action="store_true", help="also 'pair occurs at least twice' labels")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--lr", type=float, default=7.5e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weights", default="0,0,0,1,0,0", help="negative_weights of the recipe")
    ap.add_argument("--twins", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from capscore.backbones import load_backbone
    from capscore.scenes.vocab import COLOR_NAMES, SHAPES
    from capscore.train import loop
    from capscore.train import scenes_tiny as st

    torch.set_num_threads(a.threads)
    bb = load_backbone(a.model)
    p = st.ScenesTinyParams.from_strings({"dense": "filip", "dense_weight": "0.5", "twins": str(a.twins),
                                          "negative_weights": a.weights})
    st.prepare(bb, p)
    shapes, colours = list(SHAPES), list(COLOR_NAMES)
    pairs = len(shapes) * len(colours)
    n_labels = pairs * (2 if a.count else 1)
    torch.manual_seed(1234)
    bb.model.binding_head = torch.nn.Linear(bb.model.text_projection.shape[1], n_labels)  # trained with the model

    def labels(batch) -> torch.Tensor:
        y = torch.zeros(len(batch), n_labels)
        for i, e in enumerate(batch):
            for (shape, colour), n in e.extra["scene"].graph.counts.items():
                j = shapes.index(shape) * len(colours) + colours.index(colour)
                y[i, j] = 1
                if a.count and n >= 2:
                    y[i, pairs + j] = 1
        return y

    forward, seen = bb.forward_images, {}

    def keep_image_embedding(px, patches=False):
        img, tokens = forward(px, patches=patches)
        seen["img"] = img
        return img, tokens

    bb.forward_images = keep_image_embedding

    def step_fn(bb_, batch, *, step, state, rng, pixels):
        loss, parts = st.step(bb_, batch, p=p, step=step)
        z = F.normalize(seen["img"], dim=-1)
        head = F.binary_cross_entropy_with_logits(bb_.model.binding_head(z) * a.scale, labels(batch))
        return loss + a.lam * head, {**parts, "aux": head.item()}

    cfg = loop.TrainConfig(steps=a.steps, batch_size=128, lr=a.lr, warmup=a.warmup, min_lr_ratio=0.1, grad_clip=1.0,
                           seed=a.seed, log_every=10, no_decay=("embedding",), weight_decay=0.1)
    t = time.time()
    loop.train(bb, step_fn, st.data(bb, p, seed=a.seed), cfg, a.out)
    print(f"trained {a.steps} steps in {time.time() - t:.0f} s; log: {a.out}/log.jsonl (aux = the head's BCE)")
    del bb.model.binding_head
    bb.forward_images = forward
    st.export_bundled(bb, f"{a.out}/scenes-tiny.safetensors", {"arch": "scenes-tiny-v3"})


if __name__ == "__main__":
    main()
