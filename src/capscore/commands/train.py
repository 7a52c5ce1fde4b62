"""``capscore train RECIPE``: fine-tune a metric backbone (see docs/train.md)."""
from __future__ import annotations

from capscore.commands._args import (add_device, add_model, non_negative_float, non_negative_int, positive_float,
                                     positive_int, seed)


def configure(p) -> None:
    from capscore.train.options import AMP_MODES, bundled_recipe_files
    from capscore.train.recipes import RECIPES

    p.add_argument("recipe", choices=sorted(RECIPES), help="objective to train with")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a recipe file (TOML: [train] options and [params], or [[stage]] runs; docs/train.md), or "
                        f"the name of a bundled one ({', '.join(bundled_recipe_files())}); flags and --set given "
                        "with it override its values (in every stage)")
    p.add_argument("--stage", default=None, metavar="NAME", help="run only this stage of a --config file")
    add_model(p, single=True, default=None,
              help="backbone to start from (any --model spec; default scenes-tiny, for the scenes-tiny "
                   "recipe openclip:scenes-tiny-v1 = random init from --seed)")
    p.add_argument("--data", default=None,
                   help="'scenes:N' (synthetic scenes, built in; default scenes:512) or a JSONL file (fields in "
                        "docs/train.md); the scenes-tiny recipe streams fresh scenes and takes no --data")
    p.add_argument("--out", required=True, help="output folder: model.safetensors, MODEL_CARD.md, log.jsonl, "
                                                "checkpoints/ (a several-stage --config: one sub-folder per stage)")
    p.add_argument("--steps", type=positive_int, default=None, help="optimizer steps (default 100; scenes-tiny 600)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="examples per micro-batch (default: the recipe's paper value, else 32; scenes-tiny 128)")
    p.add_argument("--accum", type=positive_int, default=None,
                   help="gradient accumulation, micro-batches per step (default: the recipe's paper value, else 1)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help="peak learning rate (default: the recipe's paper value; scenes-tiny 1e-3)")
    p.add_argument("--warmup", type=non_negative_int, default=None, help="warm-up steps (default 10; scenes-tiny 50)")
    p.add_argument("--weight-decay", type=non_negative_float, default=None,
                   help="AdamW weight decay (default: the recipe's paper value, else 0.1)")
    p.add_argument("--betas", default=None, metavar="B1,B2",
                   help="AdamW betas (default: the recipe's paper value, else 0.9,0.98)")
    p.add_argument("--eps", type=positive_float, default=None, help="AdamW epsilon (default: the recipe's, else 1e-6)")
    p.add_argument("--grad-clip", type=positive_float, default=None, help="clip the gradient norm (default none; scenes-tiny 1.0)")
    p.add_argument("--seed", type=seed, default=None,
                   help="seed of the data order, draws and a random init (default 0)")
    add_device(p)
    p.add_argument("--amp", choices=AMP_MODES, default=None,
                   help="mixed precision: auto (default) autocasts on CUDA (bf16, else fp16) and trains fp32 on "
                        "CPU; bf16 autocasts on CPU too (faster on CPUs with bf16 units); off: fp32 everywhere")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="deterministic kernels only (torch.use_deterministic_algorithms): bit-reproducible CUDA "
                        "runs, a little slower; an operation without one stops the run. The CPU is exact without it")
    p.add_argument("--eval-every", type=non_negative_int, default=None,
                   help="evaluate every N steps (always before and after)")
    p.add_argument("--eval-scenes", type=non_negative_int, default=None,
                   help="held-out scenes for evaluation (default 48; 0: none)")
    p.add_argument("--languages", default=None, help="prmcs: student languages (scenes data; default de,fr,es,ja)")
    p.add_argument("--ckpt-every", type=non_negative_int, default=None,
                   help="checkpoint every N steps (always at the end)")
    p.add_argument("--keep-checkpoints", type=non_negative_int, default=None, metavar="N",
                   help="keep only the N newest checkpoints (default 0: all)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe parameter, parsed with its type (repeatable; docs/train.md lists them)")
    p.add_argument("--tensorboard", action="store_true", default=None,
                   help="also log to OUT/tensorboard (needs tensorboard)")


def run(args) -> int:
    import sys
    from dataclasses import fields
    from pathlib import Path

    from capscore.errors import CapscoreError
    from capscore.train.spec import TrainSpec
    from capscore.train.run import build_stages, format_run, run_stages

    if args.stage is not None and args.config is None:
        raise CapscoreError("--stage selects a stage of a --config file; give --config")
    stages = build_stages(args.recipe, config=args.config, stage=args.stage, out=args.out, sets=args.set,  # all checked
                          options={f.name: getattr(args, f.name) for f in fields(TrainSpec)
                                   if f.name != "recipe" and getattr(args, f.name, None) is not None})
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():  # the folder itself is made once data and model have loaded
        raise CapscoreError(f"--out {out}: is an existing file; --out names the output folder")
    run_stages(stages, out, device=args.device, dtype=args.dtype, resume=args.resume,
               command="capscore " + " ".join(sys.argv[1:]),
               on_stage=lambda stage, folder: print(f"stage {stage.name}: {folder}"),
               on_done=lambda stage, done: print(format_run(done, stage.spec.recipe)))
    return 0
