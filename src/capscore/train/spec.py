"""A training run as a typed spec: :class:`TrainSpec` (the recipe, its parameters, the model to start from,
the data and the schedule), checked once when built, and the recipe files (TOML, :mod:`tomllib`) that hold
one run or several ``[[stage]]`` runs (:func:`load_recipe_file`; the bundled models' files ship in
``capscore/train/recipe_files/``, :func:`bundled_recipe_files`). The typed-option machinery they use is
:mod:`capscore.train.options`; the recipes are :mod:`capscore.train.recipes`.
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
import string

from capscore.errors import CapscoreError, param_error, short_repr, unknown_name
from capscore.train.options import (
    AMP_MODES, MAX_ACCUM, MAX_BATCH, MAX_EVAL_SCENES, MAX_EXAMPLES_PER_STEP, MAX_SCENES, MAX_SEED, RecipeParams,
    _describe, _finite, _from_values, _hints, _parse, check_fields, non_negative, option, positive, probability,
)
from capscore.train.recipes import RECIPES, get_recipe


def _betas_ok(b) -> bool:
    return all(0.0 <= x < 1.0 for x in b)


@dataclass(frozen=True)
class TrainSpec:
    """One training run: the recipe, its parameters and the run's options. ``None`` means "the recipe's
    default" (its paper's optimiser, or the scenes-tiny recipe's schedule), else capscore's generic one;
    :func:`capscore.train.run.train_config` resolves them. ``model``: a ``--model`` spec (None: the
    recipe's start model); ``data``: ``scenes:N`` or a JSONL file (None: ``scenes:512``, or the
    recipe's own stream). Device, precision of the weights, the output folder and ``resume`` are
    arguments of the run, not of the spec: they do not change what is trained."""

    recipe: str
    params: RecipeParams = field(metadata={"checked_by_itself": True})  # the recipe's dataclass
    model: str | None = option(None, "a --model spec (a non-empty string) or none", lambda v: bool(v.strip()))
    data: str | None = option(None, "scenes:N or a JSONL file (a non-empty string) or none", lambda v: bool(v.strip()))
    steps: int | None = option(None, "a positive whole number", positive)
    batch_size: int | None = option(None, f"a whole number in [1, {MAX_BATCH:,}] (use accum for more)",
                                    lambda v: 1 <= v <= MAX_BATCH)
    accum: int | None = option(None, f"a whole number in [1, {MAX_ACCUM:,}]", lambda v: 1 <= v <= MAX_ACCUM)
    lr: float | None = option(None, "a positive float", positive)
    warmup: int | None = option(None, "a whole number >= 0", non_negative)
    min_lr_ratio: float | None = option(None, "a float in [0, 1]", probability)
    weight_decay: float | None = option(None, "a float >= 0", non_negative)
    betas: tuple[float, float] | None = option(None, "two floats in [0, 1), e.g. 0.9,0.999", _betas_ok)
    eps: float | None = option(None, "a positive float", positive)
    grad_clip: float | None = option(None, "a positive float", positive)
    seed: int = option(0, f"a whole number in [0, {MAX_SEED}]", lambda v: 0 <= v <= MAX_SEED)
    amp: str = option("auto", " or ".join(map(repr, AMP_MODES)), lambda v: v in AMP_MODES)
    deterministic: bool = False
    eval_every: int = option(0, "a whole number >= 0", non_negative)
    eval_scenes: int = option(48, f"a whole number in [0, {MAX_EVAL_SCENES:,}]", lambda v: 0 <= v <= MAX_EVAL_SCENES)
    languages: tuple[str, ...] = ("de", "fr", "es", "ja")
    ckpt_every: int = option(0, "a whole number >= 0", non_negative)
    keep_checkpoints: int = option(0, "a whole number >= 0", non_negative)
    tensorboard: bool = False

    def __post_init__(self) -> None:
        recipe = get_recipe(self.recipe)
        if not isinstance(self.params, recipe.params_type):
            raise param_error("params", f"recipe {self.recipe}", f"a {recipe.params_type.__name__}", self.params)
        check_fields(self, f"recipe {self.recipe}")
        if self.batch_size is not None and self.accum is not None and \
                self.batch_size * self.accum > MAX_EXAMPLES_PER_STEP:
            raise param_error("accum", f"recipe {self.recipe}", f"at most {MAX_EXAMPLES_PER_STEP:,} examples per step "
                              f"with batch_size {self.batch_size:,} (batch_size x accum)", self.accum)
        if self.data is not None and self.data.startswith("scenes:"):
            n = self.data.split(":", 1)[1].strip()
            if not (n.isdecimal() and 1 <= int(n) <= MAX_SCENES):
                raise param_error("data", f"recipe {self.recipe}",
                                  f"scenes:N with N in [1, {MAX_SCENES:,}], or a JSONL file", self.data)

    @staticmethod
    def parse_options(recipe: str, strings: Mapping[str, str]) -> dict:
        """Run options given as strings (``betas="0.9,0.999"``, ``languages="de,fr"``) as typed values."""
        hints = _hints(TrainSpec)
        out = {}
        for key, raw in strings.items():
            if key not in SPEC_KEYS:
                raise unknown_name(f"run option of recipe {recipe}", key, SPEC_KEYS)
            try:
                out[key] = _parse(raw, hints[key])
            except ValueError:
                f = next(f for f in dataclasses.fields(TrainSpec) if f.name == key)
                expected = _finite(f.metadata.get("expected") or _describe(hints[key]), raw, hints[key])
                raise param_error(key, f"recipe {recipe}", expected, raw) from None
        return out

    def with_params(self, strings: Mapping[str, str]) -> TrainSpec:
        """A copy whose recipe parameters are updated by ``--set KEY=VALUE`` strings."""
        return dataclasses.replace(self, params=type(self.params).from_strings(strings, self.params))

    def replace(self, **changes) -> TrainSpec:
        """A copy with ``changes`` (typed values), checked again."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "params"}
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
        return {**out, "params": self.params.as_dict()}


SPEC_KEYS = tuple(f.name for f in dataclasses.fields(TrainSpec) if f.name not in ("recipe", "params"))


# ----------------------------------------------------------------------------- recipe files
@dataclass(frozen=True)
class Stage:
    """One run of a recipe file: its name (the output sub-folder of a several-stage file; "" for a
    one-run file) and its spec. A ``{NAME}`` in ``spec.model`` is the output folder of the earlier
    stage NAME (:func:`stage_model`)."""

    name: str
    spec: TrainSpec


_STAGE_KEYS = ("name", "train", "params")


def _spec_from_table(recipe: str, table: Mapping, where: str) -> TrainSpec:
    for key in table:
        if key not in _STAGE_KEYS:
            raise CapscoreError(f"{where}: unknown key {key!r}; a run holds 'train' (run options) and 'params' "
                                "(recipe parameters)")
    train, params = table.get("train", {}), table.get("params", {})
    for key, t in (("train", train), ("params", params)):
        if not isinstance(t, Mapping):
            raise CapscoreError(f"{where}: {key!r} must be a table; got {short_repr(t)}")
    try:
        p = get_recipe(recipe).params_type.from_values(params, f"{where}.params")
        return _from_values(TrainSpec, f"recipe {recipe}", train, f"{where}.train", recipe=recipe, params=p)
    except CapscoreError as e:  # a bad value: name the file and table it is in
        raise e if str(e).startswith(where) else CapscoreError(f"{where}: {e}") from None


def load_recipe_file(path: str | Path) -> tuple[str, list[Stage]]:
    """(recipe name, stages) of a recipe file::

        recipe = "scenes-tiny"          # one run: [train] and [params] tables
        [train]
        model = "openclip:scenes-tiny"
        steps = 800
        [params]
        negative_weights = [1, 2, 2, 1, 2, 1]

    or, for several runs in order, one ``[[stage]]`` table each with a ``name`` and its own
    ``[stage.train]`` / ``[stage.params]``. Keys are the fields of :class:`TrainSpec` and of the
    recipe's parameter dataclass; an error names the file, the table and the key."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise CapscoreError(f"{path}: cannot read the recipe file ({e.__class__.__name__})") from None
    except tomllib.TOMLDecodeError as e:
        raise CapscoreError(f"{path}: not a TOML file: {e}") from None

    recipe = doc.get("recipe")
    if not isinstance(recipe, str):
        raise CapscoreError(f"{path}: needs recipe = \"NAME\" (one of {', '.join(sorted(RECIPES))})")
    if recipe not in RECIPES:
        raise CapscoreError(f"{path}: {unknown_name('recipe', recipe, RECIPES)}")
    extra = [k for k in doc if k not in ("recipe", "stage", "train", "params")]
    if extra:
        raise CapscoreError(f"{path}: unknown key {extra[0]!r}; a recipe file holds recipe, [train], [params] "
                            "or [[stage]] tables")
    if "stage" not in doc:
        return recipe, [Stage("", _spec_from_table(recipe, {k: v for k, v in doc.items() if k != "recipe"},
                                                   str(path)))]
    if "train" in doc or "params" in doc:
        raise CapscoreError(f"{path}: give either [train]/[params] (one run) or [[stage]] tables, not both")
    tables = doc["stage"]
    if not isinstance(tables, list) or not tables or not all(isinstance(t, Mapping) for t in tables):
        raise CapscoreError(f"{path}: 'stage' must be one or more [[stage]] tables; got {short_repr(tables)}")
    stages: list[Stage] = []
    for i, table in enumerate(tables, 1):
        where = f"{path}: stage {i}"
        name = table.get("name")
        if not isinstance(name, str) or not STAGE_NAME.fullmatch(name) or name in {s.name for s in stages}:
            raise CapscoreError(f"{where}: needs a unique name = \"...\" (its output sub-folder: letters, digits, "
                                f"'.', '_' or '-', not starting with '.' or '-'); got {short_repr(name)}")
        stages.append(Stage(name, _spec_from_table(recipe, table, f"{path}: stage {name!r}")))
        earlier = {s.name for s in stages[:-1]}
        for ref in _references(stages[-1].spec.model, f"{path}: stage {name!r}.train.model"):
            if ref not in earlier:
                raise CapscoreError(f"{where}: model names {{{ref}}}, which is not an earlier stage "
                                    f"({', '.join(sorted(earlier)) or 'none'})")
    return recipe, stages


#: A stage's name is its output sub-folder: a plain file name, so that no stage writes outside ``--out``.
STAGE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")


def _references(model: str | None, where: str = "model") -> list[str]:
    """The stage names a model spec refers to as ``{NAME}`` (``{{``/``}}`` are literal braces)."""
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(model or "")
                  if name is not None]
    except ValueError as e:  # an unclosed or single brace
        raise CapscoreError(f"{where}: {short_repr(model)}: {e}; {{NAME}} names an earlier stage's output folder "
                            "and a literal brace is written twice ({{ or }})") from None
    for name, spec, conv in fields:
        if not STAGE_NAME.fullmatch(name) or spec or conv:
            raise CapscoreError(f"{where}: {short_repr(model)}: {{{name}{'!' + conv if conv else ''}"
                                f"{':' + spec if spec else ''}}} is not a stage reference; {{NAME}} names an "
                                "earlier stage's output folder and a literal brace is written twice ({{ or }})")
    return [name for name, _, _ in fields]


def stage_model(model: str | None, folders: Mapping[str, Path]) -> str | None:
    """``model`` with each ``{NAME}`` replaced by the output folder of stage NAME (``{{``/``}}``: a brace)."""
    refs = _references(model)
    if model is None or not refs:
        return model
    unknown = [r for r in refs if r not in folders]
    if unknown:
        raise CapscoreError(f"model {short_repr(model)}: {{{unknown[0]}}} is not a stage of this run "
                            f"({', '.join(sorted(k for k in folders if k)) or 'none'})")
    return model.format(**{k: str(v) for k, v in folders.items()})
