"""One training run from a :class:`~capscore.train.spec.TrainSpec`: data, model, the loop, export.

:func:`train_config` turns a spec into the loop's :class:`~capscore.train.loop.TrainConfig` (each option
the spec leaves at None takes the recipe's value -- its paper's optimiser, or the scenes-tiny recipe's
schedule -- else capscore's generic default); :func:`run_spec` trains and writes the output folder
(``model.safetensors``, ``MODEL_CARD.md`` + ``card.json``, ``log.jsonl``, ``checkpoints/``; for the
scenes-tiny recipe also the bundled-format ``scenes-tiny.safetensors`` + ``scenes-tiny.json``);
:func:`run_stages` runs the stages of a recipe file in order, each in its own sub-folder.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from capscore.errors import CapscoreError, OptionError, braced, unknown_name
from capscore.train.loop import TrainConfig, TrainResult, latest_checkpoint, train
from capscore.train.spec import Stage, TrainSpec, load_recipe_file, stage_model
from capscore.backbones import load_backbone
from capscore.backbones.openai_ckpt import parse_spec_options
from capscore.backbones.registry import parse_model_spec
from capscore.report.writers import OutputLock
from capscore.scenes.evaluate import evaluate_scenes, format_report
from capscore.scenes.tiny import BUNDLED_FILES, backbone_from_file, weights_arch
from capscore.train import data as D
from capscore.train.evaluate import quiet_builtin_truncation, scene_evaluator
from capscore.train.export import export_model, write_model_card
from capscore.train.options import find_recipe_file
from capscore.train.recipes import get_recipe, make_step
from capscore.train.scenes_tiny import bundle_report, export_bundled

GENERIC_OPTIM = dict(lr=1e-5, weight_decay=0.1, batch_size=32, accum=1, betas=(0.9, 0.98), eps=1e-6)
GENERIC_SCHEDULE = dict(steps=100, warmup=10, grad_clip=None, min_lr_ratio=0.0, no_decay=())


def train_config(spec: TrainSpec, *, device: str = "cpu") -> TrainConfig:
    """The loop's config of ``spec``: steps, warm-up, clipping and cosine floor from the spec, else the
    recipe's ``train_defaults``, else :data:`GENERIC_SCHEDULE`; lr, weight decay, batch size,
    accumulation, betas and eps from the spec, else the recipe's paper values (``Recipe.optim``), else
    :data:`GENERIC_OPTIM` (CLIP's betas and eps)."""
    recipe = get_recipe(spec.recipe)
    out = {}
    for key, default in GENERIC_SCHEDULE.items():
        given = getattr(spec, key, None)
        out[key] = given if given is not None else recipe.train_defaults.get(key, default)
    for key, default in GENERIC_OPTIM.items():
        given = getattr(spec, key)
        out[key] = given if given is not None else recipe.optim.get(key, default)
    out["warmup"] = min(out["warmup"], out["steps"])
    return TrainConfig(seed=spec.seed, device=device, eval_every=spec.eval_every, ckpt_every=spec.ckpt_every,
                       keep_checkpoints=spec.keep_checkpoints, amp=spec.amp, deterministic=spec.deterministic,
                       tensorboard=spec.tensorboard, **out)


def start_model(spec: TrainSpec) -> str:
    """The model a run starts from: the spec's, else the recipe's (scenes-tiny: a random init), else scenes-tiny."""
    return spec.model or get_recipe(spec.recipe).start_model or "scenes-tiny"


@dataclass
class RunOutput:
    """What :func:`run_spec` made: the loop's result, the exported checkpoint, the config it ran with."""

    result: TrainResult
    model_path: Path
    config: TrainConfig
    notes: list[str] = field(default_factory=list)


def run_spec(spec: TrainSpec, out: str | Path, *, device: str = "cpu", dtype: str | None = None,
             resume: bool = False, command: str = "") -> RunOutput:
    """Train ``spec`` into folder ``out`` (``resume``: continue from its last checkpoint; ``command``: the
    command line recorded in the model card and the exported files)."""
    recipe, params, notes = get_recipe(spec.recipe), spec.params, []
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CapscoreError(f"{out}: is an existing file; the output of a training run is a folder")
    langs = tuple(spec.languages) if recipe.name == "prmcs" else ()
    if recipe.data is not None and spec.data is not None:
        raise CapscoreError(f"recipe {recipe.name!r} makes its own data (fresh synthetic scenes); give it no data")
    model_spec = start_model(spec)
    data_name = spec.data or "scenes:512"
    if recipe.data is not None:
        examples = None
        data_name = f"{recipe.name} stream (fresh synthetic scenes, seed {spec.seed})"
    elif data_name.startswith("scenes:"):
        try:
            n = int(data_name.split(":", 1)[1])
        except ValueError:
            raise CapscoreError(f"data {data_name!r}: expected scenes:N") from None
        examples = D.scene_examples(n, seed=spec.seed, languages=langs)
    else:
        examples = D.read_jsonl(data_name)
    if examples is not None:
        D.check_fields(examples, recipe.needs, recipe.name)
    if recipe.name == "specs":
        examples, skipped = D.specs_units(examples, grammar=params.grammar)
        if skipped:
            notes.append(f"{len(skipped)} caption(s) have fewer than two detail units and give no SPECS "
                         f"triplet; skipped (first: {skipped[0]})")
            print(f"capscore: note: {notes[-1]}", file=sys.stderr)
        D.check_fields(examples, recipe.needs, recipe.name)
    cfg = train_config(spec, device=device)
    if examples is not None and cfg.batch_size > len(examples):  # refused, not clamped: it sets the run's schedule
        raise CapscoreError(f"batch_size {cfg.batch_size} is larger than the {len(examples)} training examples of "
                            f"{data_name}; give a batch size of at most {len(examples)} (or more data)")
    bb = load_backbone(model_spec, device=device, dtype=dtype, seed=spec.seed)
    state = recipe.prepare(bb, params)
    if recipe.data is not None:
        examples = recipe.data(bb, params, seed=spec.seed)
    evaluate = None
    if spec.eval_scenes:
        evaluate = scene_evaluator(spec.eval_scenes, languages=("en", *langs), perturbations=recipe.name == "prmcs")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CapscoreError(f"{out}: cannot create the output folder ({e.strerror or e})") from None
    lock = OutputLock(out / "log.jsonl")  # two runs training into one folder would interleave checkpoints
    try:
        res = train(bb, make_step(recipe, params), examples, cfg, out, state=state, evaluate=evaluate, resume=resume)
    finally:
        lock.release()
    path = export_model(bb, out / "model.safetensors")
    write_model_card(out, recipe=recipe.name, citation=recipe.citation, base_model=model_spec,
                     params=params.as_dict(), config=asdict(cfg), evals=res.evals, model_path=str(path),
                     data=data_name, command=command)
    if recipe.export == "scenes-tiny":  # also the bundled format (fp16) and the flip evaluation
        _export_scenes_tiny(bb, out, params.as_dict(), cfg, command, spec.eval_scenes, model_spec)
    return RunOutput(res, path, cfg, notes)


def stage_folders(stages: Sequence[Stage], out: str | Path) -> dict[str, Path]:
    """{stage name: its output folder}: ``out`` itself for a one-run file, ``out/NAME`` for each stage."""
    out = Path(out)
    return {s.name: out / s.name if s.name else out for s in stages}


def resolve_stages(stages: Sequence[Stage], out: str | Path) -> list[tuple[Stage, Path]]:
    """Each stage with ``{NAME}`` in its model replaced by stage NAME's output folder, and its own folder.
    The model of a one-run file or of ``--model`` alone is taken as written (braces and all)."""
    folders = stage_folders(stages, out)
    return [(Stage(s.name, s.spec.replace(model=stage_model(s.spec.model, folders))) if s.name else s,
             folders[s.name]) for s in stages]


def _start_arch(model_spec: str) -> str | None:
    """The open_clip architecture of the model a scenes-tiny run started from: an architecture by name
    (``openclip:scenes-tiny-v3``), a bundled model (the architecture its weights file names, so a run that
    continues ``--model scenes-tiny`` exports a file the bundled loader reads right), or ``ckpt:PATH#arch=NAME``;
    else None."""
    adapter, rest = parse_model_spec(model_spec)
    if adapter.prefix == "openclip" and ":" not in rest:  # an architecture by name, not hf-hub:/local-dir:
        return rest.split("/")[0]
    if adapter.prefix == "bundled":
        return weights_arch(BUNDLED_FILES[rest]) if rest in BUNDLED_FILES else None
    if adapter.prefix == "ckpt":
        return parse_spec_options(rest)[1].get("arch")
    return None


def _export_scenes_tiny(bb, out: Path, params: dict, cfg: TrainConfig, command: str, eval_scenes: int,
                        model_spec: str) -> None:
    """OUT/scenes-tiny.safetensors (fp16, a drop-in for capscore/scenes/weights/, naming its architecture
    in its metadata) and OUT/scenes-tiny.json, the training report beside a bundled file; with
    ``eval_scenes`` N, ``capscore scenes eval``'s table on N held-out scenes, measured on the exported fp16
    file as the bundled loader reads it (also in OUT/scenes-eval.json)."""
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
        shipped = backbone_from_file(path, spec=str(path)) if arch else bb  # no arch named: the live model
        with quiet_builtin_truncation():
            evaluation = evaluate_scenes(shipped, n=eval_scenes)
        print(format_report(evaluation))
        (out / "scenes-eval.json").write_text(json.dumps(evaluation, indent=1) + "\n")
    report = bundle_report(out / "log.jsonl", arch=arch, command=command, config=asdict(cfg),
                           recipe_params=params, n_params=sum(p.numel() for p in bb.model.parameters()),
                           evaluation=evaluation)
    (out / "scenes-tiny.json").write_text(json.dumps(report, indent=1) + "\n")



TEXT_OPTIONS = ("betas", "languages")  # TrainSpec fields that may be given as text


def build_stages(recipe: str, *, config: str | Path | None = None, stage: str | None = None,
                 out: str | Path = ".", options: Mapping[str, Any] | None = None,
                 sets: Mapping[str, str] | Sequence[str] | None = None) -> list[Stage]:
    """The typed stages of one run: those of the recipe file ``config`` (only ``stage``, with its ``{NAME}``
    references resolved against the other stages' folders under ``out``), or one stage of ``recipe``'s
    defaults; each with ``options`` (TrainSpec fields; ``betas`` and ``languages`` may be text, parsed by their
    type: "0.9,0.98", "de,fr") and ``sets`` (recipe parameters, {KEY: VALUE} or "KEY=VALUE" items, parsed by
    their type) applied over it."""
    if sets is not None and not isinstance(sets, Mapping):
        pairs = [s.partition("=") for s in sets]
        for s, (_, eq, _) in zip(sets, pairs):
            if not eq:
                raise OptionError(f"{{sets:--set}} takes KEY=VALUE items; got {braced(repr(s))}")
        sets = {key.strip(): value.strip() for key, _, value in pairs}
    if config is not None:
        path = find_recipe_file(config)
        found, stages = load_recipe_file(path)
        if found != recipe:
            raise CapscoreError(f"config {path}: is a recipe file for {found!r}, not {recipe!r}")
        if stage is not None:
            names = [s.name for s in stages]
            if stage not in names:
                raise CapscoreError(f"stage: {unknown_name(f'stage of {path}', stage, names)}")
            stages = [s for s, _ in resolve_stages(stages, out) if s.name == stage]
    else:
        if stage is not None:
            raise OptionError(f"{{stage}} {braced(repr(stage))} names a stage of a recipe file: give {{config}} too")
        stages = [Stage("", TrainSpec(recipe, get_recipe(recipe).defaults()))]
    text = {k: v for k, v in (options or {}).items() if k in TEXT_OPTIONS and isinstance(v, str)}
    given = {k: v for k, v in (options or {}).items() if k not in text} | TrainSpec.parse_options(recipe, text)
    return [Stage(s.name, s.spec.replace(**given).with_params(dict(sets or {}))) for s in stages]


def run_stages(stages: Sequence[Stage], out: str | Path, *, device: str = "cpu", dtype: str | None = None,
               resume: bool = False, command: str = "", on_stage: Callable[[Stage, Path], None] | None = None,
               on_done: Callable[[Stage, RunOutput], None] | None = None) -> list[RunOutput]:
    """Every stage in order, each in its folder (``out`` for a one-run file, ``out/NAME`` for each stage);
    resuming a several-stage file, a stage with no checkpoint yet starts from its beginning.
    ``on_stage(stage, folder)`` is called before each stage of a several-stage file, ``on_done(stage, output)``
    after every stage."""
    several = len(stages) > 1 or bool(stages[0].name)
    done = []
    for stage, folder in resolve_stages(stages, out):
        again = resume and (not several or latest_checkpoint(folder / "checkpoints") is not None)
        if several and on_stage is not None:
            on_stage(stage, folder)
        done.append(run_spec(stage.spec, folder, device=device, dtype=dtype, resume=again, command=command))
        if on_done is not None:
            on_done(stage, done[-1])
    return done


def format_run(done: RunOutput, recipe: str) -> str:
    """What one stage trained (or that it was already trained), where the model is, and its evaluations."""
    if done.result.history:
        lines = [f"trained {recipe} for {done.config.steps} steps (final loss "
                 f"{done.result.history[-1]['loss']:.4f}); load with --model ckpt:{done.model_path}"]
    else:  # resumed from its last checkpoint
        lines = [f"{recipe}: all {done.config.steps} steps were already trained; load with --model "
                 f"ckpt:{done.model_path}"]
    lines += ["  eval " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in e.items())
              for e in done.result.evals]
    return "\n".join(lines)
