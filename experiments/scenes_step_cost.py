"""Training step time of a ``scenes-tiny`` recipe setting against the recipe without it, in the same run.

Runs the same recipe steps from the same start without and with the extra ``--set KEY=VALUE`` settings
(e.g. ``negatives_per_image=3``, ``patch_dropout=0.5``), through the one training loop
(:func:`capscore.train.loop.train`), in ``--rounds`` rounds whose order alternates (whichever runs first in a
process pays warm-up costs), and prints the mean seconds per step of each (the loop's per-step timer, which
includes drawing and rendering the micro-batch; first ``--skip`` steps of each run dropped) and the ratio.
The ratio sizes a run of the setting inside a fixed time budget (docs/research/scenes-training.md, "More hard
negatives per image", "Patch dropout").

The base settings are ``scenes-tiny-v4``'s stage 2 (``capscore/scenes/MODEL_CARD.md``: FILIP term 0.5,
image twins 0.5, negative weights 1,3,3,1,1,1, batch 128, lr 7.5e-4) from the bundled ``scenes-tiny-v4``.

    python experiments/scenes_step_cost.py --set negatives_per_image=3
    python experiments/scenes_step_cost.py --set patch_dropout=0.5 --steps 12 --skip 3
    python experiments/scenes_step_cost.py --compile --steps 14 --skip 4   # torch.compile of both towers' transformers

``--compile`` times the base settings with both transformers compiled (``nn.Module.compile``, TorchInductor;
the first compiled step includes the compilation, so give ``--skip`` enough steps) instead of a setting.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile

BASE = {"dense": "filip", "dense_weight": "0.5", "twins": "0.5", "negative_weights": "1,3,3,1,1,1"}


def run(model: str, extra: dict, steps: int, batch: int, seed: int, amp: str = "off", compile: bool = False) -> list[dict]:
    """The loop's per-step history of ``steps`` steps of v4's stage-2 settings plus ``extra`` from ``model``
    (also ``benchmarks/train_amp.py``'s runs, with another ``amp``); ``compile``: both transformers compiled."""
    from capscore.backbones import load_backbone
    from capscore.train.loop import TrainConfig, train
    from capscore.train.recipes import get_recipe, make_step, resolve_params

    recipe = get_recipe("scenes-tiny")
    params = resolve_params(recipe, {**BASE, **extra})
    bb = load_backbone(model, seed=seed)
    recipe.prepare(bb, params)
    if compile:
        bb.model.visual.transformer.compile()
        bb.model.transformer.compile()
    cfg = TrainConfig(steps=steps, batch_size=batch, lr=7.5e-4, warmup=min(5, steps), min_lr_ratio=0.1,
                      grad_clip=1.0, seed=seed, no_decay=("embedding",), amp=amp)
    with tempfile.TemporaryDirectory() as out:
        return train(bb, make_step(recipe, params), recipe.data(bb, params, seed=seed), cfg, out).history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="recipe setting to time against the base (repeatable)")
    ap.add_argument("--compile", action="store_true", help="time the base with torch.compile instead of a setting")
    ap.add_argument("--model", default="scenes-tiny-v4")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the timing (warm-up)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of one run per setting, order alternating")
    args = ap.parse_args()
    if not 0 <= args.skip < args.steps:
        ap.error("need 0 <= --skip < --steps")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if any("=" not in s for s in args.sets):
        ap.error("--set takes KEY=VALUE")
    if bool(args.sets) == args.compile:
        ap.error("give --set KEY=VALUE or --compile (one of them)")
    extra = dict(s.split("=", 1) for s in args.sets)
    label = ",".join(args.sets) or "compile"

    import torch

    torch.set_num_threads(args.threads)
    print(f"scenes-tiny recipe (v4 stage-2 settings), {args.model}, batch {args.batch_size}, {args.threads} threads, "
          f"{args.steps} steps per run (first {args.skip} not timed), {args.rounds} rounds; torch {torch.__version__}")
    sec: dict[str, list[float]] = {"base": [], label: []}
    for r in range(args.rounds):
        for name in (("base", label) if r % 2 == 0 else (label, "base")):
            h = run(args.model, {} if name == "base" else extra, args.steps, args.batch_size, args.seed,
                    compile=name == "compile")
            sec[name] += [e["sec"] for e in h[args.skip:]]
            print(f"  round {r + 1} {name}  {statistics.mean(e['sec'] for e in h[args.skip:]):.3f} s/step")
    base, other = statistics.mean(sec["base"]), statistics.mean(sec[label])
    print(f"  mean: base {base:.3f} s/step, {label} {other:.3f} s/step; a step with {label} costs {other / base:.2f}x")


if __name__ == "__main__":
    main()
