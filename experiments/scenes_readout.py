"""Does another read-out of the towers let the global cosine bind?

docs/research/scenes-training.md § Perception or binding, "Is the binding there to read?": in the bundled
scenes-tiny both towers' global embeddings hold which colour sits on which shape, but only a non-linear
read-out finds it (swap probe, MLP 0.88 / 0.93, linear about 0.6), and the cosine, linear in each embedding,
stays at chance.
CLIP's global embedding is the class (end-of-text) token times one linear projection. This script swaps
that read-out and continues training with the scenes-tiny recipe through the one training loop:

* ``--readout class``: CLIP's own (the control: the same continuation with nothing changed);
* ``--readout mlp``: a residual MLP on each tower's global embedding, ``g(z) = z + W2·GELU(W1·z)`` (width
  ``--hidden``, ``W2`` zero-initialised, so step 0 is the start model); ``--freeze-towers`` trains the
  heads alone (towers and temperature frozen, no FILIP term);
* ``--readout second-order``: the global embedding is the flattened second-order pool of the normalised
  joint-space tokens, ``mean_p p̂_p p̂_pᵀ`` over the patch tokens and ``mean_w t̂_w t̂_wᵀ`` over the word
  tokens (start and end of text dropped, as ABE-CLIP drops them): D² = 16 384 numbers, no new parameters
  (bilinear pooling, Lin et al. 2015). Part 1 of ``experiments/scenes_binding.py`` scores it zero-shot.
  It is the read-out of the ``scenes-tiny-v4`` architecture (:mod:`capscore.backbones.readout`), which
  ``capscore train scenes-tiny --model 'ckpt:FILE#arch=scenes-tiny-v4'`` trains without this script.

The FILIP term reads the tokens as before. Defaults: from the bundled model, stage 2's mix (FILIP 0.5,
``negative_weights=1,3,3,1,1,1``, twins 0.5), lr 7.5e-4, 20 warm-up steps, batch 128, seed 2. At the end
it evaluates in process with the read-out (``capscore scenes eval`` on ``--eval-n`` scenes) and writes
OUT/eval.json (``--steps 0``: the start model under the read-out); OUT/heads.pt holds the MLP heads
(``torch.load(weights_only=True)``), OUT/scenes-tiny.safetensors the towers. The results are in
docs/research/scenes-training.md ("A non-linear projection head", "Second-order pooling binds"); each run above
took 10–15 min on the 2-core development CPU.

    python experiments/scenes_readout.py --out runs/mlp/control --steps 300
    python experiments/scenes_readout.py --out runs/mlp/head --steps 300 --readout mlp
    python experiments/scenes_readout.py --out runs/mlp/frozen --steps 600 --readout mlp --freeze-towers --lr 3e-3
    python experiments/scenes_readout.py --out runs/second/zero300 --steps 0 --readout second-order --eval-n 300
    python experiments/scenes_readout.py --out runs/second/train --steps 300 --readout second-order
    python experiments/scenes_readout.py --out runs/second/train-s3 --steps 300 --readout second-order --seed 3
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="scenes-tiny", help="start (default: the bundled model)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--readout", choices=("class", "mlp", "second-order"), default="class")
    ap.add_argument("--freeze-towers", action="store_true",
                    help="train the heads only (the towers and temperature frozen; no FILIP term): can the "
                         "contrastive loss find the non-linear read-out the probes find?")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--lr", type=float, default=7.5e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weights", default="1,3,3,1,1,1", help="negative_weights of the recipe")
    ap.add_argument("--twins", type=float, default=0.5)
    ap.add_argument("--bound", type=float, default=0.0, help="bound_negatives of the recipe")
    ap.add_argument("--eval-n", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import torch

    from capscore.backbones import load_backbone
    from capscore.scenes.evaluate import evaluate_scenes, format_report
    from capscore.train import loop
    from capscore.train import scenes_tiny as st

    torch.set_num_threads(a.threads)
    bb = load_backbone(a.model)
    p = st.ScenesTinyParams.from_strings({"dense": "none" if a.freeze_towers else "filip", "dense_weight": "0.5",
                                          "twins": str(a.twins), "negative_weights": a.weights,
                                          "bound_negatives": str(a.bound)})
    st.prepare(bb, p)
    dim = bb.model.text_projection.shape[1]

    def head() -> torch.nn.Module:
        h = torch.nn.Sequential(torch.nn.Linear(dim, a.hidden), torch.nn.GELU(), torch.nn.Linear(a.hidden, dim))
        torch.nn.init.zeros_(h[2].weight)
        torch.nn.init.zeros_(h[2].bias)
        return h

    forward_images, forward_texts = bb.forward_images, bb.forward_texts
    if a.freeze_towers:
        if a.readout != "mlp":
            ap.error("--freeze-towers trains the MLP heads alone: give --readout mlp")
        bb.model.requires_grad_(False)
    if a.readout == "mlp":
        torch.manual_seed(1234)
        bb.model.image_head, bb.model.text_head = head(), head()  # on the model: the loop trains them

        def images(px, patches=False):
            z, tokens = forward_images(px, patches=patches)
            return z + bb.model.image_head(z), tokens

        def texts(ids, lengths, tokens=False):
            z, toks = forward_texts(ids, lengths, tokens=tokens)
            return z + bb.model.text_head(z), toks

        bb.forward_images, bb.forward_texts = images, texts
    elif a.readout == "second-order":  # the library's read-out (capscore.backbones.readout, scenes-tiny-v4)
        bb.set_readout("second-order")

    def step_fn(bb_, batch, *, step, state, rng, pixels):
        return st.step(bb_, batch, p=p, step=step)

    cfg = loop.TrainConfig(steps=a.steps, batch_size=128, lr=a.lr, warmup=a.warmup, min_lr_ratio=0.1, grad_clip=1.0,
                           seed=a.seed, log_every=10, no_decay=("embedding",), weight_decay=0.1)
    t = time.time()
    if a.steps:
        loop.train(bb, step_fn, st.data(bb, p, seed=a.seed), cfg, a.out)
        print(f"trained {a.steps} steps in {time.time() - t:.0f} s; log: {a.out}/log.jsonl")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    bb.model.eval()
    with torch.no_grad():
        res = evaluate_scenes(bb, n=a.eval_n)
    Path(a.out, "eval.json").write_text(json.dumps(res, indent=1))
    print(format_report(res, by_binding=True))
    if a.readout == "mlp":
        torch.save({"image_head": bb.model.image_head.state_dict(), "text_head": bb.model.text_head.state_dict()},
                   Path(a.out, "heads.pt"))
        del bb.model.image_head, bb.model.text_head
    st.export_bundled(bb, f"{a.out}/scenes-tiny.safetensors", {"arch": "scenes-tiny-v3"})


if __name__ == "__main__":
    main()
