"""``capscore`` command line: parses, dispatches, and turns user errors into one line.

Each subcommand lives in ``capscore/commands/<name>.py`` with ``configure(parser)``
and ``run(args) -> int``; this file only knows their names.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import warnings

COMMANDS: dict[str, str] = {
    "demo": "run the offline demo on synthetic scenes with the bundled scenes-tiny model",
    "score": "score captions against images (CLIP-S, RefCLIP-S, PAC-S, RefPAC-S, MCS, ABE)",
    "probe": "probe a backbone: perturbations, LGIP, specificity, compositional suites",
    "explain": "save a token-patch similarity heat map for one (image, caption, word)",
    "correlate": "meta-evaluate metrics against human judgments",
    "train": "train or fine-tune a metric backbone (specs, prmcs, pacs, contrastive)",
    "scenes": "generate synthetic scenes; train scenes-tiny",
    "models": "show the --model grammar and bundled models",
    "report": "one self-contained HTML page of plots and tables from score/probe/correlate/train/explain runs",
}


def _available() -> dict[str, object]:
    mods = {}
    for name in COMMANDS:
        try:
            mods[name] = importlib.import_module(f"capscore.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"capscore.commands.{name}":
                raise
    return mods


def build_parser(mods: dict[str, object]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capscore", description="Judge, probe and train CLIP-style caption metrics.")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars or warnings")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in mods.items():
        p = sub.add_parser(name, help=COMMANDS[name], description=COMMANDS[name])
        mod.configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    from capscore._log import CapscoreWarning
    from capscore.errors import CapscoreError

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    mods = _available()
    parser = build_parser(mods)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.WARNING, format="capscore: %(message)s")
    warnings.simplefilter("ignore" if args.quiet else "once", CapscoreWarning)
    warnings.formatwarning = lambda msg, cat, *a, **k: f"capscore: warning: {msg}\n"
    try:
        return int(mods[args.command].run(args) or 0)
    except CapscoreError as e:
        print(f"capscore: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("capscore: interrupted; results written so far are kept (re-run with --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
