"""Arguments shared by every command, written once.

* ``--model A B …`` / ``--metric A B …``: one grammar everywhere. Values may be
  given after one flag or by repeating the flag (``--model A --model B`` is
  ``--model A B``); the same value twice is an error, never silently merged.
  Commands that take exactly one model say so with ``single=True`` and reject
  a second one instead of keeping the last.
* ``--device`` / ``--dtype`` on every command that encodes.
* ``-q`` / ``--debug``, accepted before *and* after the subcommand.
* Range ``type=`` helpers (positive_int, …): argparse turns the ``ArgumentTypeError``
  raised here into its one-line usage error and exit status 2, before any file is read or model loaded.
* :func:`output_dir`, :func:`output_file` and :func:`refuse_input_as_output`, the checks every
  command makes before writing to ``--out``.
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
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


DTYPES = ("fp32", "fp16", "bf16")
DEFAULT_MODEL = "scenes-tiny"


class _ListOption(argparse.Action):
    """``nargs='+'``; repeating the flag adds values; a repeated value, or more than one with
    ``single``, is an error. The default is replaced (not extended) by the first value given."""

    def __init__(self, option_strings, dest, *, single: bool = False, known: Sequence[str] | None = None,
                 kind: str = "value", **kw):
        super().__init__(option_strings, dest, nargs="+", **kw)
        self.single = single
        self.known = tuple(known) if known is not None else None
        self.kind = kind

    def __call__(self, parser, namespace, values, option_string=None):
        from capscore.errors import unknown_name

        flag = f"_{self.dest}_given"
        before = getattr(namespace, self.dest) if getattr(namespace, flag, False) else None
        current = [] if before is None else [before] if isinstance(before, str) else list(before)
        for v in values:
            if self.known is not None and v not in self.known:
                parser.error(str(unknown_name(self.kind, v, self.known)))
            if v in current:
                parser.error(f"{option_string} {v} is given twice")
            current.append(v)
        if self.single and len(current) > 1:
            parser.error(f"{option_string} takes one {self.kind} in this command; got {' '.join(current)} "
                         f"(several are supported by score, probe and correlate)")
        setattr(namespace, flag, True)
        setattr(namespace, self.dest, current[0] if self.single else current)


def add_model(p, *, default: str | None = DEFAULT_MODEL, single: bool = False, required: bool = False,
              help: str | None = None) -> None:
    """``--model SPEC [SPEC …]`` (a list) or, with ``single``, one spec (a string)."""
    what = "backbone" if single else "backbone(s)"
    text = help or (f"{what}, e.g. ViT-B-32/openai, ckpt:PATH.pth, hf:DIR (see `capscore models`)"
                    + ("" if single else "; several: --model A B (or repeat the flag)"))
    if default is not None:
        text += f"; default {default}"
    p.add_argument("--model", action=_ListOption, single=single, kind="model", metavar="SPEC",
                   required=required, default=(default if single else ([default] if default else [])),
                   help=text)


def add_metric(p, choices: Sequence[str], *, default: str = "clip-s", single: bool = False) -> None:
    """``--metric NAME [NAME …]`` restricted to ``choices`` (did-you-mean on a typo)."""
    p.add_argument("--metric", action=_ListOption, single=single, known=choices, kind="metric", metavar="NAME",
                   default=default if single else [default],
                   help=f"one of {', '.join(choices)}" + ("" if single else "; several: --metric A B")
                        + f" (default {default})")


def add_device(p, *, default_device: str = "cpu") -> None:
    """``--device`` and ``--dtype``: where and in what precision the backbone runs."""
    p.add_argument("--device", default=default_device, help=f"cpu, cuda or cuda:N (default {default_device})")
    p.add_argument("--dtype", default="fp32", choices=DTYPES,
                   help="fp32, fp16 or bf16 (default fp32; reduced precision is for GPUs)")


def add_common(p, *, top: bool = False) -> None:
    """``-q`` / ``--debug``: on the top parser, and on every subcommand so they also work after it.

    On subcommands the default is SUPPRESS, so an unset flag there does not
    overwrite one given before the subcommand.
    """
    default = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or warnings", **default)
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error", **default)
