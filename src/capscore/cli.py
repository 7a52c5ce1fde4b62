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
    "score": "score captions against images (CLIP-S, RefCLIP-S, PAC-S, RefPAC-S, MCS, ABE, Polos, DENEB, FLEUR, ...)",
    "probe": "probe a backbone: perturbations, LGIP, specificity, compositional suites",
    "explain": "save a token-patch similarity heat map for one (image, caption, word)",
    "correlate": "meta-evaluate metrics against human judgments",
    "compare": "paired bootstrap and randomisation tests between two systems' score files",
    "reproduce": "recompute the papers' headline numbers on local data and compare (--list: the tables)",
    "doctor": "list which datasets, weights and tools (Java, CoreNLP, GPU) are present, offline",
    "train": "train or fine-tune a metric backbone (specs, prmcs, pacs, contrastive)",
    "scenes": "generate synthetic scenes and evaluate a model on them (train one with capscore train scenes-tiny)",
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


class _Parser(argparse.ArgumentParser):
    """argparse with capscore's one-line error (no usage block): ``capscore: error: score: argument ...``."""

    def error(self, message: str):
        sub = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        self.exit(2, f"capscore: error: {sub}{' '.join(message.split())} (see {self.prog} -h)\n")

    def _print_message(self, message: str, file=None) -> None:
        """argparse's, without swallowing a closed pipe: ``capscore -h | head -1`` ends as every command does."""
        file = file or sys.stderr
        if message and file is not None:
            file.write(message)


def _version() -> str:
    from capscore._version import __version__

    return __version__


def build_parser(mods: dict[str, object], configure: set[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the subcommands in ``configure`` (default: all) get their options.

    ``capscore --help`` configures none, so it imports no command's dependencies (torch).
    Subparsers inherit ``_Parser`` (argparse uses the parent's class), so every usage error is one line.
    """
    from capscore.commands._args import add_common

    parser = _Parser(prog="capscore", description="Judge, probe and train CLIP-style caption metrics.")
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
    """Run one command; the exit status (0, 2 for a user error, 1 for a bug, 130 on Ctrl-C, 141 when the
    reader of the output went away)."""
    try:
        return _main(argv)
    except BrokenPipeError:  # stdout (or stderr) is a pipe whose reader has gone: stop quietly, as Unix tools do
        return _closed_pipe()


def _main(argv: list[str] | None) -> int:
    from capscore._log import close_bars, setup_logging
    from capscore.errors import CapscoreError, OptionError

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)  # the top level takes flags only
    if first is not None and first not in COMMANDS:  # argparse would list every command; suggest the close ones
        from capscore.errors import unknown_name

        print(f"capscore: error: {unknown_name('command', first, COMMANDS)} (see capscore -h)", file=sys.stderr)
        return 2
    chosen = first  # configure only the command being run
    mods = _available([chosen] if chosen else COMMANDS)
    parser = build_parser(mods, configure={chosen} if chosen else set())
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # -h, --version, or a bad argument (already reported on one line)
        sys.stdout.flush()  # `capscore score -h | head -1`: a closed pipe is seen here, not at exit
        return e.code if isinstance(e.code, int) else 2
    if not args.command:
        parser.print_help()
        sys.stdout.flush()
        return 2
    setup_logging(quiet=args.quiet, debug=args.debug)
    try:
        _check_models(args)
        code = int(mods[args.command].run(args) or 0)
        sys.stdout.flush()  # now, so that a reader that went away (capscore ... | head) is seen here
        return code
    except BrokenPipeError:
        raise  # main's: before the OSError handler below, which would call it a bug
    except CapscoreError as e:
        close_bars()
        _traceback(args)
        if isinstance(e, OptionError):  # the library names parameters; here they are flags
            e = CapscoreError(e.on_command_line())
        print(f"capscore: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        close_bars()
        print("capscore: interrupted; results written so far are kept (re-run with --resume)", file=sys.stderr)
        return 130
    except OSError as e:
        close_bars()
        _traceback(args)
        if e.filename is None:  # no file to name: not something the user can act on
            return _bug(e)
        # a file the user named (or its folder) cannot be read or written: permissions, disk full, ...
        what = e.strerror or type(e).__name__
        print(f"capscore: error: {e.filename}: {what}", file=sys.stderr)
        return 2
    except RecursionError as e:  # e.g. a JSON file nested 100000 levels deep that no loader caught
        close_bars()
        _traceback(args)
        print(f"capscore: error: input nested too deeply to read ({e})", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001  (the safety net: one line, never a traceback)
        close_bars()
        _traceback(args)
        return _bug(e)


#: Exit status when the reader of stdout went away (``capscore doctor | head -1``): 128 + SIGPIPE, what the
#: shell reports for a Unix tool stopped by the signal, so ``set -o pipefail`` still tells it from success.
EXIT_CLOSED_PIPE = 141


def _closed_pipe() -> int:
    """Point stdout and stderr at /dev/null (the interpreter's final flush must not fail again) and give
    :data:`EXIT_CLOSED_PIPE`; nothing is printed: there is no one to read it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError, AttributeError):  # not a real file (pytest's capture): nothing to redirect
            pass
    os.close(devnull)
    return EXIT_CLOSED_PIPE


def _check_models(args) -> None:
    """``--model`` grammar and open_clip architecture names, checked before the command imports torch
    (a typo is reported in a fraction of a second, not after loading inputs and libraries)."""
    models = getattr(args, "model", None)
    if not models:
        return
    from capscore.backbones.registry import check_model_spec

    for spec in [models] if isinstance(models, str) else models:
        if isinstance(spec, str):
            check_model_spec(spec)


def _traceback(args) -> None:
    """Under --debug, the traceback goes before the one-line message."""
    if getattr(args, "debug", False):
        import traceback

        traceback.print_exc()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _bug(e: BaseException) -> int:
    msg = " ".join(str(e).split()) or "(no message)"
    if len(msg) > 300:
        msg = msg[:297] + "..."
    print(f"capscore: error: {type(e).__name__}: {msg} (this is a bug in capscore; re-run with --debug for the "
          "traceback and report it)", file=sys.stderr)
    return 1


def entry() -> None:
    """The ``capscore`` console script: :func:`main`, then :func:`exit_fast`."""
    exit_fast(main())


def exit_fast(code: int | None) -> None:
    """End the process with ``code``, skipping the interpreter's teardown once torch is loaded.

    Tearing down a process that imported torch is slow (Python's finalisation of torch's modules
    and objects, then its C++ static destructors), slower than capscore's own share of a warm
    one-pair run (``benchmarks/startup.py``). Before leaving, everything a normal exit does
    that can matter is done: the ``atexit`` handlers run (logging flushed, Ray shut down,
    temporary folders removed) and stdout/stderr are flushed. Files are closed by the code that
    opens them, and the caches commit every batch. When a non-daemon thread is still alive
    (which a normal exit would wait for), or torch was never imported (nothing to gain), or
    ``CAPSCORE_FAST_EXIT=0``, it exits normally."""
    import atexit
    import threading

    code = 0 if code is None else code
    others = lambda: any(t.is_alive() and not t.daemon for t in threading.enumerate()  # noqa: E731
                         if t is not threading.main_thread())
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)  # CPython's, undocumented: without it, exit normally
    if ("torch" not in sys.modules or others() or run_exitfuncs is None
            or os.environ.get("CAPSCORE_FAST_EXIT", "1").strip().lower() in ("0", "false", "no", "off")):
        sys.exit(code)
    run_exitfuncs()  # what the interpreter would run first at exit; they are then cleared
    if others():  # a handler started a thread that a normal exit would wait for
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (capscore ... | head) or stream
            pass
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    entry()
