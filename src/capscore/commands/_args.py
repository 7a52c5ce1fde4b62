"""Arguments shared by every command, written once.

* ``--model A B …`` / ``--metric A B …``: one grammar everywhere. Values may be
  given after one flag or by repeating the flag (``--model A --model B`` is
  ``--model A B``); the same value twice is an error, never silently merged.
  Commands that take exactly one model say so with ``single=True`` and reject
  a second one instead of keeping the last.
* ``--device`` / ``--dtype`` on every command that encodes.
* ``-q`` / ``--debug``, accepted before *and* after the subcommand.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence

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
