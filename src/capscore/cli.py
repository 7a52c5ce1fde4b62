"""``capscore`` command line: parses, dispatches, and turns user errors into one line.

Each subcommand lives in ``capscore/commands/<name>.py`` with ``configure(parser)``
and ``run(args) -> int``; this file only knows their names.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

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


def _available(names=COMMANDS) -> dict[str, object]:
    mods = {}
    for name in names:
        try:
            mods[name] = importlib.import_module(f"capscore.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"capscore.commands.{name}":
                raise
    return mods


def _version() -> str:
    from capscore import __version__

    return __version__


def build_parser(mods: dict[str, object], configure: set[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the subcommands in ``configure`` (default: all) get their options.

    ``capscore --help`` configures none, so it imports no command's dependencies (torch).
    """
    from capscore.commands._args import add_common

    parser = argparse.ArgumentParser(prog="capscore", description="Judge, probe and train CLIP-style caption metrics.")
    parser.add_argument("--version", action="version", version=f"capscore {_version()}")
    add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in mods.items():
        p = sub.add_parser(name, help=COMMANDS[name], description=COMMANDS[name])
        if configure is None or name in configure:
            add_common(p)
            mod.configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    from capscore._log import close_bars, setup_logging
    from capscore.errors import CapscoreError

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((a for a in argv if a in COMMANDS), None)  # configure only the command being run
    mods = _available([chosen] if chosen else COMMANDS)
    parser = build_parser(mods, configure={chosen} if chosen else set())
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    setup_logging(quiet=args.quiet, debug=args.debug)
    try:
        return int(mods[args.command].run(args) or 0)
    except CapscoreError as e:
        close_bars()
        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"capscore: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        close_bars()
        print("capscore: interrupted; results written so far are kept (re-run with --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
