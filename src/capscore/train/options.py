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
did-you-mean error. :class:`TrainSpec` and the recipe files (:func:`load_recipe_file`) are in
:mod:`capscore.train.spec`.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from capscore.errors import CapscoreError, param_error, unknown_name


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
            if key in RUN_OPTIONS:  # a run option given as a recipe parameter
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
#: The run options: the fields of :class:`capscore.train.spec.TrainSpec` besides ``recipe`` and ``params``
#: (tests/test_train_options.py checks that they agree), named so that a recipe parameter called like one
#: gets a hint.
RUN_OPTIONS = ("model", "data", "steps", "batch_size", "accum", "lr", "warmup", "min_lr_ratio", "weight_decay",
               "betas", "eps", "grad_clip", "seed", "amp", "deterministic", "eval_every", "eval_scenes", "languages",
               "ckpt_every", "keep_checkpoints", "tensorboard")


# ----------------------------------------------------------------------------- recipe files
RECIPE_DIR = Path(__file__).parent / "recipe_files"


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
