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
* :func:`output_dir`, :func:`output_file`, :func:`refuse_input_as_output`: :mod:`capscore.report.outputs`.
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from functools import partial

from capscore._log import warn
from capscore.report import outputs


def _number(text: str, kind: type):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}; got {text!r}") \
            from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number; got {text!r}")
    return value


def _ranged(kind: type, ok, what: str, doc: str):
    def parse(text: str):
        value = _number(text, kind)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}; got {text}")
        return value

    parse.__doc__ = doc
    return parse


positive_int = _ranged(int, lambda v: v >= 1, "a positive integer", "An integer >= 1 (batch sizes, step counts).")
non_negative_int = _ranged(int, lambda v: v >= 0, "an integer >= 0", "An integer >= 0 (0 usually means 'none').")
positive_float = _ranged(float, lambda v: v > 0, "a number > 0", "A finite number > 0 (learning rates).")
non_negative_float = _ranged(float, lambda v: v >= 0, "a number >= 0", "A finite number >= 0 (weight decay).")
probability = _ranged(float, lambda v: 0 <= v <= 1, "a probability in [0, 1]", "A number in [0, 1].")
significance_level = _ranged(float, lambda v: 0 < v < 1, "a significance level in (0, 1)", "A number in (0, 1).")
seed = _ranged(int, lambda v: 0 <= v <= 2**63 - 1, "an integer in [0, 2**63 - 1]",
               "A random seed: every generator capscore seeds (numpy, torch, random) takes these.")


FEWEST_RESAMPLES = 40


def resamples(text: str, *, zero: bool = False) -> int:
    """A number of bootstrap resamples or randomisation shuffles, at most :data:`capscore.meta.MAX_RESAMPLES`
    (``zero``: 0, no resampling, is allowed)."""
    from capscore.meta import MAX_RESAMPLES

    value = _number(text, int)
    if not (0 if zero else 1) <= value <= MAX_RESAMPLES:
        raise argparse.ArgumentTypeError(f"must be a number of resamples in [{0 if zero else 1}, "
                                         f"{MAX_RESAMPLES:,}]; got {text}")
    if 0 < value < FEWEST_RESAMPLES:  # the printed intervals are 95 %: each 2.5 % tail needs 1 in 40
        warn(f"{value} resample{'' if value == 1 else 's'} {'is' if value == 1 else 'are'} too few for a 95% "
             f"interval (each 2.5% tail needs at least "
             f"{FEWEST_RESAMPLES}); its ends are the extreme resamples; use 1000 or more")
    return value


resamples_or_zero = partial(resamples, zero=True)


def count_or_all(text: str) -> int | None:
    """A positive integer, or ``all`` (None)."""
    if text == "all":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'all'; got {text!r}")
    return int(text)


# the output checks of capscore.report.outputs, naming the flag
output_dir = partial(outputs.output_dir, name="--out")
output_file = partial(outputs.output_file, name="--out")
refuse_input_as_output = partial(outputs.refuse_input_as_output, name="--out")


def job_of(cls, args, **given):
    """The typed job ``cls`` (a dataclass) from the flags of its fields' names; ``given`` for the others."""
    from dataclasses import fields

    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)} | given)


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


def add_metric(p, choices: Sequence[str], *, default: str | None = "clip-s", single: bool = False,
               default_help: str | None = None) -> None:
    """``--metric NAME [NAME …]`` restricted to ``choices`` (did-you-mean on a typo); ``default=None`` leaves
    the choice to the command (``default_help`` says what it picks)."""
    value = default if single or default is None else [default]
    p.add_argument("--metric", action=_ListOption, single=single, known=choices, kind="metric", metavar="NAME",
                   default=value,
                   help=f"one of {', '.join(choices)}" + ("" if single else "; several: --metric A B")
                        + f" (default {default_help or default})")


def add_device(p, *, default_device: str = "cpu") -> None:
    """``--device`` and ``--dtype``: where and in what precision the backbone runs."""
    p.add_argument("--device", default=default_device, help=f"cpu, cuda or cuda:N (default {default_device})")
    p.add_argument("--dtype", default="fp32", choices=DTYPES,
                   help="fp32, fp16 or bf16 (default fp32; reduced precision is for GPUs)")


def add_common(p, *, top: bool = False) -> None:
    """``-q`` / ``--debug`` on the top parser and on every subcommand (default SUPPRESS there, so an unset
    flag after the subcommand does not overwrite one given before it)."""
    default = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or warnings", **default)
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error", **default)


def add_abe_arguments(p) -> None:
    """ABE-CLIP's knobs (abe-clip.txt: K = 5 and ω = 0.3 as in section 4.2.1; P is not stated)."""
    g = p.add_argument_group("ABE-CLIP (--scorer abe / --metric abe)")
    g.add_argument("--abe-k", type=positive_int, default=None, metavar="K",
                   help="patches averaged per token, top-K (paper default 5; Table 3 sweeps 1,3,5,8,10)")
    g.add_argument("--abe-p", type=positive_int, default=None, metavar="P",
                   help="concept-pool neighbours per object (the paper does not state P; capscore default 5)")
    g.add_argument("--abe-omega", type=probability, default=None, metavar="W",
                   help="weight of the global score, in [0, 1] (paper default 0.3)")
    g.add_argument("--concept-pool", default=None, metavar="FILE",
                   help="concept pool, one word per line, e.g. SPLiCE's data/vocab/laion.txt (the paper's; "
                        "not bundled, see docs/abe.md); default: capscore's bundled 304 nouns")


def abe_options(args) -> dict:
    """The ABE options the user set, as :class:`~capscore.scores.abe.AbeConfig` fields (unset ones keep its
    defaults). The flags' types parse the numbers; the job that receives the options checks them
    (:func:`capscore.scores.abe.make_config`), before any model is loaded."""
    names = (("abe_k", "k"), ("abe_p", "p"), ("abe_omega", "omega"), ("concept_pool", "pool"))
    return {key: getattr(args, flag) for flag, key in names if getattr(args, flag, None) is not None}
