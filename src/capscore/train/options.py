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
    if inner is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            return float(value)
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
            raise param_error(f.name, owner, expected, value) from None
        ok = f.metadata.get("ok")
        if ok is not None and typed is not None and not ok(typed):
            raise param_error(f.name, owner, expected, value)
        object.__setattr__(obj, f.name, typed)


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
            raise param_error(key, owner, f.metadata.get("expected") or _describe(hints[key]), raw) from None
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
    model: str | None = None
    data: str | None = None
    steps: int | None = option(None, "a positive whole number", positive)
    batch_size: int | None = option(None, "a positive whole number", positive)
    accum: int | None = option(None, "a positive whole number", positive)
    lr: float | None = option(None, "a positive float", positive)
    warmup: int | None = option(None, "a whole number >= 0", non_negative)
    min_lr_ratio: float | None = option(None, "a float in [0, 1]", probability)
    weight_decay: float | None = option(None, "a float >= 0", non_negative)
    betas: tuple[float, float] | None = option(None, "two floats in [0, 1), e.g. 0.9,0.999", _betas_ok)
    eps: float | None = option(None, "a positive float", positive)
    grad_clip: float | None = option(None, "a positive float", positive)
    seed: int = 0
    amp: str = option("auto", " or ".join(map(repr, AMP_MODES)), lambda v: v in AMP_MODES)
    deterministic: bool = False
    eval_every: int = option(0, "a whole number >= 0", non_negative)
    eval_scenes: int = option(48, "a whole number >= 0", non_negative)
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
                raise param_error(key, f"recipe {recipe}", f.metadata.get("expected") or _describe(hints[key]),
                                  raw) from None
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
    p = get_recipe(recipe).params_type.from_values(params, f"{where}.params")
    return _from_values(TrainSpec, f"recipe {recipe}", train, f"{where}.train", recipe=recipe, params=p)


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
    stages: list[Stage] = []
    for i, table in enumerate(doc["stage"], 1):
        where = f"{path}: stage {i}"
        name = table.get("name") if isinstance(table, Mapping) else None
        if not isinstance(name, str) or not name or "/" in name or name in {s.name for s in stages}:
            raise CapscoreError(f"{where}: needs a unique name = \"...\" (its output sub-folder)")
        stages.append(Stage(name, _spec_from_table(recipe, table, f"{path}: stage {name!r}")))
        earlier = {s.name for s in stages[:-1]}
        for ref in _references(stages[-1].spec.model):
            if ref not in earlier:
                raise CapscoreError(f"{where}: model names {{{ref}}}, which is not an earlier stage "
                                    f"({', '.join(sorted(earlier)) or 'none'})")
    return recipe, stages


def _references(model: str | None) -> list[str]:
    import string

    return [name for _, name, _, _ in string.Formatter().parse(model or "") if name]


def stage_model(model: str | None, folders: Mapping[str, Path]) -> str | None:
    """``model`` with each ``{NAME}`` replaced by the output folder of stage NAME."""
    if model is None or not _references(model):
        return model
    return model.format(**{k: str(v) for k, v in folders.items()})
