"""``capscore train RECIPE``: fine-tune a metric backbone (see docs/train.md)."""
from __future__ import annotations

from capscore.commands._args import (add_device, add_model, non_negative_float, non_negative_int, positive_float,
                                     positive_int)


def configure(p) -> None:
    from capscore.train.loop import AMP_MODES
    from capscore.train.recipes import RECIPES

    p.add_argument("recipe", choices=sorted(RECIPES), help="objective to train with")
    add_model(p, single=True, default=None,
              help="backbone to start from (any --model spec; default scenes-tiny, for the scenes-tiny "
                   "recipe openclip:scenes-tiny-v1 = random init from --seed)")
    p.add_argument("--data", default=None,
                   help="'scenes:N' (synthetic scenes, built in; default scenes:512) or a JSONL file (fields in "
                        "docs/train.md); the scenes-tiny recipe streams fresh scenes and takes no --data")
    p.add_argument("--out", required=True, help="output folder: model.safetensors, MODEL_CARD.md, log.jsonl, checkpoints/")
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
    p.add_argument("--seed", type=int, default=0)
    add_device(p)
    p.add_argument("--amp", choices=AMP_MODES, default="auto",
                   help="mixed precision: auto (default) autocasts on CUDA (bf16, else fp16) and trains fp32 on "
                        "CPU; bf16 autocasts on CPU too (faster on CPUs with bf16 units); off: fp32 everywhere")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels only (torch.use_deterministic_algorithms): bit-reproducible CUDA "
                        "runs, a little slower; an operation without one stops the run. The CPU is exact without it")
    p.add_argument("--eval-every", type=non_negative_int, default=0, help="evaluate every N steps (always before and after)")
    p.add_argument("--eval-scenes", type=non_negative_int, default=48, help="held-out scenes for evaluation (0: none)")
    p.add_argument("--languages", default="de,fr,es,ja", help="prmcs: student languages (scenes data)")
    p.add_argument("--ckpt-every", type=non_negative_int, default=0, help="checkpoint every N steps (always at the end)")
    p.add_argument("--keep-checkpoints", type=non_negative_int, default=0, metavar="N",
                   help="keep only the N newest checkpoints (default 0: all)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe parameter (repeatable)")
    p.add_argument("--tensorboard", action="store_true", help="also log to OUT/tensorboard (needs tensorboard)")


GENERIC_OPTIM = dict(lr=1e-5, weight_decay=0.1, batch_size=32, accum=1, betas=(0.9, 0.98), eps=1e-6)
GENERIC_SCHEDULE = dict(steps=100, warmup=10, grad_clip=None, min_lr_ratio=0.0, no_decay=())


def schedule_settings(recipe, args) -> dict:
    """steps, warm-up, clipping, cosine floor, no-decay names: the user's value, else the recipe's
    ``train_defaults`` (the scenes-tiny recipe's v1 values), else the generic default."""
    from capscore.errors import CapscoreError

    out = {k: getattr(args, k, None) for k in GENERIC_SCHEDULE}
    for k, v in out.items():
        if v is None:
            out[k] = recipe.train_defaults.get(k, GENERIC_SCHEDULE[k])
    if out["steps"] < 1:
        raise CapscoreError(f"--steps must be a positive integer; got {out['steps']}")
    out["warmup"] = min(out["warmup"], out["steps"])
    return out


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

    from capscore.commands._args import output_dir

    recipe = get_recipe(args.recipe)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise CapscoreError(f"--out {args.out}: is an existing file; --out names the output folder")
    sets = {}
    for s in args.set:
        key, eq, value = s.partition("=")
        if not eq:
            raise CapscoreError(f"--set {s!r}: expected KEY=VALUE")
        sets[key.strip()] = value.strip()
    params = resolve_params(recipe, sets)
    langs = tuple(x for x in args.languages.split(",") if x) if recipe.name == "prmcs" else ()
    if recipe.data is not None and args.data is not None:
        raise CapscoreError(f"recipe {recipe.name!r} makes its own data (fresh synthetic scenes); drop --data")
    model_spec = args.model or recipe.start_model or "scenes-tiny"
    data_name = args.data or "scenes:512"
    if recipe.data is not None:
        examples = None
        data_name = f"{recipe.name} stream (fresh synthetic scenes, seed {args.seed})"
    elif data_name.startswith("scenes:"):
        try:
            n = int(data_name.split(":", 1)[1])
        except ValueError:
            raise CapscoreError(f"--data {data_name!r}: expected scenes:N") from None
        examples = D.scene_examples(n, seed=args.seed, languages=langs)
    else:
        examples = D.read_jsonl(data_name)
    if examples is not None:
        D.check_fields(examples, recipe.needs, recipe.name)
    if recipe.name == "specs":
        examples, skipped = D.specs_units(examples, grammar=params["grammar"])
        if skipped:
            print(f"capscore: note: {len(skipped)} caption(s) have fewer than two detail units and give no SPECS "
                  f"triplet; skipped (first: {skipped[0]})", file=sys.stderr)
        D.check_fields(examples, recipe.needs, recipe.name)
    opt = optimiser_settings(recipe, args)
    cfg = TrainConfig(seed=args.seed, device=args.device, eval_every=args.eval_every, ckpt_every=args.ckpt_every,
                      keep_checkpoints=args.keep_checkpoints, amp=args.amp,
                      deterministic=args.deterministic,
                      tensorboard=args.tensorboard, **schedule_settings(recipe, args), **opt)
    bb = load_backbone(model_spec, device=args.device, dtype=args.dtype, seed=args.seed)
    state = recipe.prepare(bb, params)
    if recipe.data is not None:
        examples = recipe.data(bb, params, seed=args.seed)
    evaluate = None
    if args.eval_scenes:
        evaluate = scene_evaluator(args.eval_scenes, languages=("en", *langs),
                                   perturbations=recipe.name == "prmcs")
    out = output_dir(args.out)
    from capscore.report.writers import OutputLock

    lock = OutputLock(out / "log.jsonl")  # two runs training into one folder would interleave checkpoints
    try:
        res = train(bb, make_step(recipe, params), examples, cfg, out, state=state, evaluate=evaluate,
                    resume=args.resume)
    finally:
        lock.release()
    path = export_model(bb, out / "model.safetensors")
    from dataclasses import asdict

    command = "capscore " + " ".join(sys.argv[1:])
    write_model_card(out, recipe=recipe.name, citation=recipe.citation, base_model=model_spec, params=params,
                     config=asdict(cfg), evals=res.evals, model_path=str(path), data=data_name, command=command)
    if recipe.export == "scenes-tiny":  # also the bundled format (fp16) and the flip evaluation
        _export_scenes_tiny(bb, out, params, cfg, command, args.eval_scenes, model_spec)
    last = res.history[-1] if res.history else {}
    print(f"trained {recipe.name} for {cfg.steps} steps (final loss {last.get('loss', float('nan')):.4f}); "
          f"load with --model ckpt:{path}")
    for e in res.evals:
        print("  eval", " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in e.items()))
    return 0


def _start_arch(model_spec: str) -> str | None:
    """The open_clip architecture of the model a scenes-tiny run started from: an architecture by name
    (``openclip:scenes-tiny-v3``), a bundled model (the architecture its weights file names, so a run that
    continues ``--model scenes-tiny`` exports a file the bundled loader reads right), or ``ckpt:PATH#arch=NAME``;
    else None."""
    from capscore.backbones.registry import parse_model_spec

    adapter, rest = parse_model_spec(model_spec)
    if adapter.prefix == "openclip" and ":" not in rest:  # an architecture by name, not hf-hub:/local-dir:
        return rest.split("/")[0]
    if adapter.prefix == "bundled":
        from capscore.scenes.tiny import BUNDLED_FILES, weights_arch

        return weights_arch(BUNDLED_FILES[rest]) if rest in BUNDLED_FILES else None
    if adapter.prefix == "ckpt":
        from capscore.backbones.openai_ckpt import parse_spec_options

        return parse_spec_options(rest)[1].get("arch")
    return None


def _export_scenes_tiny(bb, out, params, cfg, command, eval_scenes: int, model_spec: str) -> None:
    """OUT/scenes-tiny.safetensors (fp16, a drop-in for capscore/scenes/weights/, naming its architecture
    in its metadata) and OUT/scenes-tiny.json, the training report beside a bundled file; with
    --eval-scenes N, ``capscore scenes eval``'s table on N held-out scenes, measured on the exported fp16
    file as the bundled loader reads it (also in OUT/scenes-eval.json)."""
    import json
    import sys
    from dataclasses import asdict

    from capscore.scenes.tiny import backbone_from_file
    from capscore.train.scenes_tiny import bundle_report, export_bundled

    arch = _start_arch(model_spec)
    path = out / "scenes-tiny.safetensors"
    if arch is None:
        print(f"capscore: note: {path} names no architecture ({model_spec!r} is not an open_clip name, a bundled "
              "model or ckpt:PATH#arch=NAME); the bundled loader reads such a file as scenes-tiny-v1", file=sys.stderr)
    meta = {"config": json.dumps(asdict(cfg)), "params": json.dumps(params), "command": command}
    export_bundled(bb, path, {**meta, "arch": arch} if arch else meta)
    print(f"bundled format: {path} ({path.stat().st_size / 1e6:.1f} MB, fp16)")
    evaluation = None
    if eval_scenes:
        from capscore.scenes.evaluate import evaluate_scenes, format_report

        shipped = backbone_from_file(path, spec=str(path)) if arch else bb  # no arch named: the live model
        evaluation = evaluate_scenes(shipped, n=eval_scenes)
        print(format_report(evaluation))
        (out / "scenes-eval.json").write_text(json.dumps(evaluation, indent=1) + "\n")
    report = bundle_report(out / "log.jsonl", arch=arch, command=command, config=asdict(cfg),
                           recipe_params=params, n_params=sum(p.numel() for p in bb.model.parameters()),
                           evaluation=evaluation)
    (out / "scenes-tiny.json").write_text(json.dumps(report, indent=1) + "\n")
