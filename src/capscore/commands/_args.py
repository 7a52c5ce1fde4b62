"""Reusable argparse ``type=`` helpers: ranges are checked where the option is parsed.

argparse turns the ``ArgumentTypeError`` raised here into its usual one-line
usage error (``capscore score: error: argument --batch-size: must be a positive
integer; got 0``) and exit status 2, before any file is read or model loaded.
Also: :func:`output_dir` and :func:`refuse_input_as_output`, the checks every
command makes before writing to ``--out``.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from capscore.errors import CapscoreError


def _number(text: str, kind: type):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}; got {text!r}") \
            from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number; got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (batch sizes, step counts, number of scenes)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (0 usually means 'none' or 'off')."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0; got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (learning rates)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0; got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (weight decay, gradient clipping)."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0; got {text}")
    return value


def probability(text: str) -> float:
    """A number in [0, 1]."""
    value = _number(text, float)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1]; got {text}")
    return value


def output_dir(path: str | Path, option: str = "--out") -> Path:
    """``--out DIR``: refuse an existing file (instead of failing deep inside), create the folder."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise CapscoreError(f"{option} {out}: is an existing file; {option} names a folder here")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CapscoreError(f"{option} {out}: cannot create the folder ({e.strerror or e})") from None
    return out


def output_file(path: str | Path, option: str = "--out") -> Path:
    """``--out FILE``: refuse a folder, make sure the parent folder exists and is writable."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise CapscoreError(f"{option} {out}: is a folder; {option} names a file here")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CapscoreError(f"{option} {out}: cannot create its folder ({e.strerror or e})") from None
    return out


def refuse_input_as_output(out: str | Path, inputs: dict[str, object], option: str = "--out") -> None:
    """Refuse an ``--out`` that is one of the input files (``--overwrite`` would destroy it)."""
    target = Path(out).expanduser().resolve()
    for name, value in inputs.items():
        for p in value if isinstance(value, (list, tuple)) else [value]:
            if p and Path(p).expanduser().resolve() == target:
                raise CapscoreError(f"{option} {out} is also the {name} input; writing results there would "
                                    "destroy it — choose another output file")
