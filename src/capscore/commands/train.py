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
    p.add_argument("--batch-size", type=int, default=None,
                   help="examples per micro-batch (default: the recipe's paper value, else 32)")
    p.add_argument("--accum", type=int, default=None,
                   help="gradient accumulation, micro-batches per step (default: the recipe's paper value, else 1)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the recipe's paper value)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=None,
                   help="AdamW weight decay (default: the recipe's paper value, else 0.1)")
    p.add_argument("--betas", default=None, metavar="B1,B2",
                   help="AdamW betas (default: the recipe's paper value, else 0.9,0.98)")
    p.add_argument("--eps", type=float, default=None, help="AdamW epsilon (default: the recipe's, else 1e-6)")
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


GENERIC_OPTIM = dict(lr=1e-5, weight_decay=0.1, batch_size=32, accum=1, betas=(0.9, 0.98), eps=1e-6)


def optimiser_settings(recipe, args) -> dict:
    """lr, weight decay, batch size, accumulation, betas, eps: the user's value, else the
    recipe's paper value (``Recipe.optim``), else capscore's generic default (CLIP's betas/eps)."""
    from capscore.errors import CapscoreError

    out = {}
    for key, default in GENERIC_OPTIM.items():
        given = getattr(args, key, None)
        if key == "betas" and given is not None:
            try:
                b1, b2 = (float(x) for x in str(given).split(","))
            except ValueError:
                raise CapscoreError(f"--betas {given!r}: expected two numbers B1,B2, e.g. 0.9,0.999") from None
            if not (0 <= b1 < 1 and 0 <= b2 < 1):
                raise CapscoreError(f"--betas {given!r}: each beta must be in [0, 1)")
            given = (b1, b2)
        out[key] = given if given is not None else recipe.optim.get(key, default)
    for key in ("batch_size", "accum"):
        if out[key] < 1:
            raise CapscoreError(f"--{key.replace('_', '-')} must be a positive integer; got {out[key]}")
    return out


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
    if recipe.name == "specs":
        examples, skipped = D.specs_units(examples, grammar=params["grammar"])
        if skipped:
            print(f"capscore: note: {len(skipped)} caption(s) have fewer than two detail units and give no SPECS "
                  f"triplet; skipped (first: {skipped[0]})", file=sys.stderr)
        D.check_fields(examples, recipe.needs, recipe.name)
    opt = optimiser_settings(recipe, args)
    cfg = TrainConfig(steps=args.steps, warmup=args.warmup, grad_clip=args.grad_clip, seed=args.seed,
                      device=args.device, eval_every=args.eval_every, ckpt_every=args.ckpt_every,
                      tensorboard=args.tensorboard, **opt)
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
