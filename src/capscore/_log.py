"""Logging, one-time warnings and progress bars shared by the package.

* ``log`` is the ``capscore`` logger. The CLI gives it its own handler
  (:func:`setup_logging`); the root logger is never configured, so third-party
  libraries keep their own format and nothing is printed twice.
* :func:`progress` is the one way to show a progress bar: a context manager
  around tqdm (total, rate, ETA) that is closed — and its line cleared — when
  the block ends, *also* when it ends with an error, so an error or summary
  line never lands in the middle of a bar. Messages written while a bar is
  open go through :func:`echo` / the warning hook, which print above the bar.
* ``quiet`` (``-q``) turns bars and warnings off for the whole run.
* capscore's warnings print as ``capscore: warning: message`` — in the CLI and in
  Python alike, never with the source line that raised them; other libraries'
  warnings keep their own format (the hook passes them to the one it replaced).
"""
from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator

log = logging.getLogger("capscore")

_state = {"quiet": False}
_open_bars: list = []


class CapscoreWarning(UserWarning):
    """Warnings a user should see once (random weights, truncated captions...)."""


def warn(message: str) -> None:
    warnings.warn(message, CapscoreWarning, stacklevel=3)


def is_quiet() -> bool:
    return _state["quiet"]


class _BarSafeHandler(logging.StreamHandler):
    """Writes ``capscore: message`` to stderr, above any open progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            echo(self.format(record), file=self.stream)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def setup_logging(*, quiet: bool = False, debug: bool = False) -> None:
    """Configure the ``capscore`` logger and warnings for a CLI run (idempotent).

    Only the ``capscore`` logger gets a handler (``propagate=False``), so the
    root logger and third-party loggers are left as they are.
    """
    _state["quiet"] = quiet
    for h in list(log.handlers):
        if isinstance(h, _BarSafeHandler):
            log.removeHandler(h)
    handler = _BarSafeHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("capscore: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if debug else logging.ERROR if quiet else logging.INFO)
    log.propagate = False
    warnings.simplefilter("ignore" if quiet else "once", CapscoreWarning)
    warnings.showwarning = _showwarning


def _showwarning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, CapscoreWarning):
        echo(f"capscore: warning: {message}", file=file or sys.stderr)
    else:  # third-party warnings keep their usual format
        echo(warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n"), file=file or sys.stderr)


def _chained_showwarning(previous):
    """For Python use: capscore's warnings print their message only; every other warning goes to ``previous``."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, CapscoreWarning):
            echo(f"capscore: warning: {message}", file=file or sys.stderr)
        else:
            previous(message, category, filename, lineno, file, line)

    show.capscore = True
    return show


if not getattr(warnings.showwarning, "capscore", False):
    warnings.showwarning = _chained_showwarning(warnings.showwarning)


def echo(message: str, *, file=None) -> None:
    """Print a line; above the open progress bar when there is one."""
    file = file or sys.stderr
    if _open_bars:
        from tqdm.auto import tqdm  # noqa: PLC0415  (deferred: tqdm)

        tqdm.write(message, file=file)
    else:
        print(message, file=file, flush=True)


_bar_class = None


def open_bar(total: int | None = None, *, desc: str, unit: str = "it", disable: bool | None = None,
             leave: bool = False):
    """A registered tqdm bar (total, rate, ETA) on stderr; ``close()`` it, or use :func:`progress`.

    Registered bars are closed by :func:`close_bars` before the CLI prints an error.
    ``disable`` defaults to the ``-q`` state.
    """
    global _bar_class
    if _bar_class is None:
        from tqdm.auto import tqdm  # noqa: PLC0415  (deferred: tqdm)

        class _Bar(tqdm):
            def close(self):
                if self in _open_bars:
                    _open_bars.remove(self)
                super().close()

        _bar_class = _Bar
    bar = _bar_class(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=leave,
                     disable=is_quiet() if disable is None else disable)
    _open_bars.append(bar)
    return bar


@contextlib.contextmanager
def progress(total: int | None = None, *, desc: str, unit: str = "it", disable: bool | None = None,
             leave: bool = False) -> Iterator:
    """A bar (see :func:`open_bar`) closed and cleared when the block exits, even on error.

    Yields an object with ``update(n)`` (a disabled bar accepts the same calls).
    """
    bar = open_bar(total, desc=desc, unit=unit, disable=disable, leave=leave)
    try:
        yield bar
    finally:
        bar.close()


def close_bars() -> None:
    """Close every open bar (the CLI calls it before printing an error)."""
    for bar in list(_open_bars):
        bar.close()
