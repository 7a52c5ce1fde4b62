"""Training step time with several hard negatives per image (``--set negatives_per_image=k``) against one,
in the same run.

Runs the same ``scenes-tiny`` recipe steps from the same start with ``negatives_per_image=1`` (the recipe)
and with ``k``, through the one training loop (:func:`capscore.train.loop.train`), in ``--rounds`` rounds
whose order alternates (whichever runs first in a process pays warm-up costs), and prints the mean seconds
per step of each (the loop's per-step timer, which includes drawing and rendering the micro-batch; first
``--skip`` steps of each run dropped) and the ratio. The ratio is what sizes a run of k inside a fixed time
budget (docs/scenes.md, "More hard negatives per image").

The default settings are ``scenes-tiny-v4``'s stage 2 (``capscore/scenes/MODEL_CARD.md``: FILIP term 0.5,
image twins 0.5, negative weights 1,3,3,1,1,1, batch 128, lr 7.5e-4) from the bundled ``scenes-tiny-v4``.

    python benchmarks/scenes_negatives.py                 # k = 3, 8 steps per run, 2 rounds, 2 threads
    python benchmarks/scenes_negatives.py --k 2 --steps 12
"""
from __future__ import annotations

import argparse
import statistics
import tempfile


def run(model: str, k: int, steps: int, batch: int, seed: int) -> list[dict]:
    from capscore.backbones import load_backbone
    from capscore.train.loop import TrainConfig, train
    from capscore.train.recipes import get_recipe, make_step, resolve_params

    recipe = get_recipe("scenes-tiny")
    params = resolve_params(recipe, {"dense": "filip", "dense_weight": "0.5", "twins": "0.5",
                                     "negative_weights": "1,3,3,1,1,1", "negatives_per_image": str(k)})
    bb = load_backbone(model, seed=seed)
    recipe.prepare(bb, params)
    cfg = TrainConfig(steps=steps, batch_size=batch, lr=7.5e-4, warmup=min(5, steps), min_lr_ratio=0.1,
                      grad_clip=1.0, seed=seed, no_decay=("embedding",), amp="off")
    with tempfile.TemporaryDirectory() as out:
        return train(bb, make_step(recipe, params), recipe.data(bb, params, seed=seed), cfg, out).history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="scenes-tiny-v4")
    ap.add_argument("--k", type=int, default=3, help="hard negatives per image to compare with 1")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the timing (warm-up)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of one run per setting, order alternating")
    args = ap.parse_args()
    if not 0 <= args.skip < args.steps:
        ap.error("need 0 <= --skip < --steps")
    if args.rounds < 1 or args.k < 2:
        ap.error("need --rounds >= 1 and --k >= 2")

    import torch

    torch.set_num_threads(args.threads)
    print(f"scenes-tiny recipe (v4 stage-2 settings), {args.model}, batch {args.batch_size}, {args.threads} threads, "
          f"{args.steps} steps per run (first {args.skip} not timed), {args.rounds} rounds; torch {torch.__version__}")
    sec: dict[int, list[float]] = {1: [], args.k: []}
    for r in range(args.rounds):
        for k in ((1, args.k) if r % 2 == 0 else (args.k, 1)):
            h = run(args.model, k, args.steps, args.batch_size, args.seed)
            sec[k] += [e["sec"] for e in h[args.skip:]]
            print(f"  round {r + 1} negatives_per_image={k}  {statistics.mean(e['sec'] for e in h[args.skip:]):.3f} s/step")
    one, many = statistics.mean(sec[1]), statistics.mean(sec[args.k])
    print(f"  mean: k=1 {one:.3f} s/step, k={args.k} {many:.3f} s/step; k={args.k} costs {many / one:.2f}x a step of k=1")


if __name__ == "__main__":
    main()
