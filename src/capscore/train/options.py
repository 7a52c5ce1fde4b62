"""Typed training options: recipe parameters and run options as frozen dataclasses, checked once.

Every recipe has a frozen dataclass of its parameters (a :class:`RecipeParams`); a training run is a
:class:`TrainSpec` (the recipe, its parameters, the model to start from, the data and the schedule).
Both check every field when they are built -- the field's type (``bool``, ``int``, ``float``, ``str``,
tuples of them) and its allowed values -- and fail with one line in scikit-learn's template:

    The 'lr' parameter of recipe scenes-tiny must be a positive float; got 'abc' instead.

They are built from Python values (:meth:`RecipeParams.from_values`, the values a TOML file holds),
or from ``KEY=VALUE`` strings (:meth:`RecipeParams.from_strings`, the CLI's ``--set``), each string
parsed with its field's real type: ``true``/``false``/``1``/``0`` for a bool, comma-separated items for a
tuple (``negative_kinds=color,shape``), ``none`` for an optional number. An unknown name gets a
did-you-mean error. :func:`load_recipe_file` reads a recipe file (TOML, :mod:`tomllib`): one run, or
several ``[[stage]]`` runs where a later stage starts from an earlier one's output (``{NAME}`` in its
``model``); the bundled models' recipe files ship in ``capscore/train/recipe_files/``
(:func:`bundled_recipe_files`).
"""
from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from capscore.errors import CapscoreError, param_error, short_repr, unknown_name

RECIPE_DIR = Path(__file__).parent / "recipe_files"


def option(default: Any, expected: str | None = None, ok: Callable[[Any], bool] | None = None):
    """A dataclass field with what its values must be: ``expected`` (the error's words) and ``ok`` (a check
    of a value already of the field's type)."""
    return field(default=default, metadata={"expected": expected, "ok": ok})


def choice(*words: str):
    """An :func:`option` whose value is one of ``words`` (the first is the default)."""
    return option(words[0], " or ".join(repr(w) for w in words), lambda v: v in words)


positive = (lambda v: v > 0)
non_negative = (lambda v: v >= 0)
probability = (lambda v: 0.0 <= v <= 1.0)


# ----------------------------------------------------------------------------- types
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional(tp) -> tuple[Any, bool]:
    """(the type inside ``X | None``, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _describe(tp) -> str:
    inner, opt = _optional(tp)
    if typing.get_origin(inner) is tuple:
        args = typing.get_args(inner)
        words = {str: "names", float: "numbers", int: "whole numbers"}[args[0]]
        text = (f"a list of {len(args)} {words}" if args[-1] is not Ellipsis
                else f"a list of {words} (comma-separated after --set)")
    else:
        text = {bool: "true or false", int: "a whole number", float: "a float", str: "a string"}[inner]
    return text + (" or none" if opt else "")


def _typed(value: Any, tp) -> Any:
    """``value`` as a value of ``tp`` (a list becomes a tuple, a whole number a float); ValueError if it is not one."""
    inner, opt = _optional(tp)
    if value is None:
        if opt:
            return None
        raise ValueError
    if typing.get_origin(inner) is tuple:
        args = typing.get_args(inner)
        if not isinstance(value, (list, tuple)):
            raise ValueError
        if args[-1] is not Ellipsis and len(value) != len(args):
            raise ValueError
        return tuple(_typed(v, args[0]) for v in value)
    if inner is bool:
        if isinstance(value, bool):
            return value
        raise ValueError
    if inner is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError
    if inner is float:  # finite only: an inf learning rate or loss weight trains a model of NaNs
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer too large for a float
                raise ValueError from None
            if math.isfinite(number):
                return number
        raise ValueError
    if inner is str and isinstance(value, str):
        return value
    raise ValueError


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _parse(raw: str, tp) -> Any:
    """A ``--set`` string as a value of ``tp``; ValueError if it is not one."""
    inner, opt = _optional(tp)
    text = raw.strip()
    if opt and text.lower() in ("none", "null", ""):
        return None
    if typing.get_origin(inner) is tuple:
        elem = typing.get_args(inner)[0]
        return _typed(tuple(_parse(x, elem) for x in text.split(",") if x.strip()), inner)
    if inner is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError
    if inner is int:
        return int(text)
    if inner is float:
        return _typed(float(text), float)
    return text


def check_fields(obj, owner: str) -> None:
    """Type and check every field of the dataclass ``obj`` in place (frozen: through ``object.__setattr__``)."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        if not f.init or f.metadata.get("checked_by_itself"):
            continue
        value = getattr(obj, f.name)
        expected = f.metadata.get("expected") or _describe(hints[f.name])
        try:
            typed = _typed(value, hints[f.name])
        except ValueError:
            raise param_error(f.name, owner, _finite(expected, value, hints[f.name]), value) from None
        ok = f.metadata.get("ok")
        if ok is not None and typed is not None and not ok(typed):
            raise param_error(f.name, owner, expected, value)
        object.__setattr__(obj, f.name, typed)


def _finite(expected: str, value: Any, tp) -> str:
    """``expected``, saying "finite" when ``tp`` holds floats and the value given (a number, its text, or a
    list of them) was an infinite or NaN number."""
    inner = _optional(tp)[0]
    if float not in (inner, *typing.get_args(inner)):
        return expected

    def bad(v) -> bool:
        try:
            return not math.isfinite(float(v)) if isinstance(v, (float, str)) else False
        except ValueError:
            return False

    values = list(value) if isinstance(value, (list, tuple)) else str(value).split(",") if isinstance(value, str) \
        else [value]
    return f"{expected}, and finite" if any(bad(v) for v in values) else expected


def _from_strings(cls, owner: str, strings: Mapping[str, str], base: dict | None = None) -> Any:
    """``cls`` from ``base`` (field values) updated by ``strings``, each parsed with its field's type."""
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    values = dict(base or {})
    for key, raw in strings.items():
        if key not in names:
            err = unknown_name(f"parameter of {owner}", key, names)
            if key in SPEC_KEYS:  # a run option given as a recipe parameter
                err = CapscoreError(f"{err}; {key!r} is a run option (the [train] table of a recipe file, "
                                    f"--{key.replace('_', '-')} of capscore train)")
            raise err
        try:
            values[key] = _parse(raw, hints[key])
        except ValueError:
            f = next(f for f in dataclasses.fields(cls) if f.name == key)
            raise param_error(key, owner, _finite(f.metadata.get("expected") or _describe(hints[key]), raw, hints[key]),
                              raw) from None
    return cls(**values)


def _from_values(cls, owner: str, values: Mapping[str, Any], where: str = "", **known) -> Any:
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in known]
    for key in values:
        if key not in names:
            err = unknown_name(f"parameter of {owner}", key, names)
            raise CapscoreError(f"{where}: {err}" if where else str(err))
    return cls(**known, **values)


# ----------------------------------------------------------------------------- recipe parameters
@dataclass(frozen=True)
class RecipeParams:
    """The parameters of one recipe; subclasses declare fields with :func:`option` / :func:`choice`."""

    RECIPE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_fields(self, f"recipe {self.RECIPE}")
        self.check()

    def check(self) -> None:
        """Checks that involve several fields (a subclass's)."""

    def error(self, name: str, expected: str) -> CapscoreError:
        """The one-line error for parameter ``name`` of this recipe."""
        return param_error(name, f"recipe {self.RECIPE}", expected, getattr(self, name))

    @classmethod
    def from_strings(cls, strings: Mapping[str, str], base: RecipeParams | None = None):
        """``--set KEY=VALUE`` strings, each parsed with its field's type, over ``base`` (default: the defaults)."""
        return _from_strings(cls, f"recipe {cls.RECIPE}", strings, dataclasses.asdict(base) if base else None)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], where: str = ""):
        """Typed values (a TOML table); ``where`` names their place in a file for an unknown key."""
        return _from_values(cls, f"recipe {cls.RECIPE}", values, where)

    def as_dict(self) -> dict:
        """The parameters as JSON-ready values (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


# ----------------------------------------------------------------------------- a run
AMP_MODES = ("auto", "bf16", "fp16", "off")
# Bounds on sizes that would otherwise run out of memory or seem to hang before the first step:
# a micro-batch (over all processes) of more than 65,536 examples fits no accelerator with these towers
# (use accum for larger effective batches); synthetic training scenes are rendered in memory (~25 KB each,
# two images per example), and every evaluation scene is drawn and scored at each evaluation.
MAX_BATCH = 65_536
# accumulated micro-batches run one after another: more than this many examples per optimiser step (4,096
# times CLIP's 32,768) is an hours-long first step that looks like a hang
MAX_ACCUM = 65_536
MAX_EXAMPLES_PER_STEP = 2**27
MAX_SCENES = 100_000
MAX_EVAL_SCENES = 10_000
MAX_SEED = 2**32 - 1  # the data order seeds torch with seed * 1000003 + epoch, which must fit in 64 bits


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
        from capscore.train.recipes import get_recipe

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


def bundled_recipe_files() -> dict[str, Path]:
    """{name: path} of the recipe files that ship with capscore (``capscore/train/recipe_files/NAME.toml``)."""
    return {p.stem: p for p in sorted(RECIPE_DIR.glob("*.toml"))}


def find_recipe_file(name_or_path: str | Path) -> Path:
    """A recipe file by path, or by the name of a bundled one (``scenes-tiny-v3``)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    bundled = bundled_recipe_files()
    if str(name_or_path) in bundled:
        return bundled[str(name_or_path)]
    if path.suffix or path.parent != Path("."):
        raise CapscoreError(f"{path}: recipe file not found")
    raise unknown_name("recipe file (a path, or a bundled one)", str(name_or_path), bundled)


_STAGE_KEYS = ("name", "train", "params")


def _spec_from_table(recipe: str, table: Mapping, where: str) -> TrainSpec:
    from capscore.train.recipes import get_recipe

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
    from capscore.train.recipes import RECIPES

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
    import string

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
