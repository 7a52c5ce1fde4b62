"""``capscore train RECIPE``: fine-tune a metric backbone (see docs/train.md)."""
from __future__ import annotations


def configure(p) -> None:
    from capscore.commands._args import add_device, add_model
    from capscore.train.recipes import RECIPES

    p.add_argument("recipe", choices=sorted(RECIPES), help="objective to train with")
    add_model(p, single=True, help="backbone to start from (any --model spec)")
    p.add_argument("--data", default="scenes:512",
                   help="'scenes:N' (synthetic scenes, built in) or a JSONL file (fields in docs/train.md)")
    p.add_argument("--out", required=True, help="output folder: model.safetensors, MODEL_CARD.md, log.jsonl, checkpoints/")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--accum", type=int, default=1, help="gradient accumulation (micro-batches per step)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    add_device(p)
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (always before and after)")
    p.add_argument("--eval-scenes", type=int, default=48, help="held-out scenes for evaluation (0: none)")
    p.add_argument("--languages", default="de,fr,es,ja", help="prmcs: student languages (scenes data)")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps (always at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe parameter (repeatable)")
    p.add_argument("--tensorboard", action="store_true", help="also log to OUT/tensorboard (needs tensorboard)")


def run(args) -> int:
    import sys
    from pathlib import Path

    from capscore.backbones import load_backbone
    from capscore.errors import CapscoreError
    from capscore.train import data as D
    from capscore.train.evaluate import scene_evaluator
    from capscore.train.export import export_model, write_model_card
    from capscore.train.loop import TrainConfig, train
    from capscore.train.recipes import get_recipe, make_step, resolve_params

    recipe = get_recipe(args.recipe)
    sets = {}
    for s in args.set:
        key, eq, value = s.partition("=")
        if not eq:
            raise CapscoreError(f"--set {s!r}: expected KEY=VALUE")
        sets[key.strip()] = value.strip()
    params = resolve_params(recipe, sets)
    langs = tuple(x for x in args.languages.split(",") if x) if recipe.name == "prmcs" else ()
    if args.data.startswith("scenes:"):
        try:
            n = int(args.data.split(":", 1)[1])
        except ValueError:
            raise CapscoreError(f"--data {args.data!r}: expected scenes:N") from None
        examples = D.scene_examples(n, seed=args.seed, languages=langs)
    else:
        examples = D.read_jsonl(args.data)
    D.check_fields(examples, recipe.needs, recipe.name)
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, accum=args.accum, lr=args.lr, warmup=args.warmup,
                      weight_decay=args.weight_decay, grad_clip=args.grad_clip, seed=args.seed, device=args.device,
                      eval_every=args.eval_every, ckpt_every=args.ckpt_every, tensorboard=args.tensorboard)
    bb = load_backbone(args.model, device=args.device, dtype=args.dtype, seed=args.seed)
    state = recipe.prepare(bb, params)
    evaluate = None
    if args.eval_scenes:
        evaluate = scene_evaluator(args.eval_scenes, languages=("en", *langs),
                                   perturbations=recipe.name == "prmcs")
    out = Path(args.out)
    res = train(bb, make_step(recipe, params), examples, cfg, out, state=state, evaluate=evaluate, resume=args.resume)
    path = export_model(bb, out / "model.safetensors")
    from dataclasses import asdict

    write_model_card(out, recipe=recipe.name, citation=recipe.citation, base_model=args.model, params=params,
                     config=asdict(cfg), evals=res.evals, model_path=str(path), data=args.data,
                     command="capscore " + " ".join(sys.argv[1:]))
    last = res.history[-1] if res.history else {}
    print(f"trained {recipe.name} for {cfg.steps} steps (final loss {last.get('loss', float('nan')):.4f}); "
          f"load with --model ckpt:{path}")
    for e in res.evals:
        print("  eval", " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in e.items()))
    return 0
