"""One error type for user mistakes, one template for its message.

Every error a user can cause (a bad file, a bad option, an unknown model) is a
:class:`CapscoreError`. The CLI prints ``capscore: error: <message>`` on one line
and exits non-zero, never a traceback. Programming errors stay ordinary
exceptions.

The template bounds every message: line breaks become ``\\n`` and a message over
:data:`MAX_MESSAGE` characters keeps its head and tail around a marker saying how
much was cut (a file name or a quoted cell can be arbitrarily long; the line must
stay readable).
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


#: Longest error message, in characters; longer ones keep their head and tail (:func:`bounded`).
MAX_MESSAGE = 1000


def bounded(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` on one line and at most about ``limit`` characters (head ... [N characters cut] ... tail)."""
    text = str(message).replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r")
    if len(text) <= limit:
        return text
    head, tail = (limit * 3) // 4, limit // 4
    return f"{text[:head]} ... [{len(text) - head - tail} characters cut] ... {text[-tail:]}"


class CapscoreError(Exception):
    """A user-facing error whose message fits on one line (bounded by :func:`bounded`)."""

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str):
            args = (bounded(args[0]),)
        super().__init__(*args)


class InputError(CapscoreError):
    """Bad input data; ``where`` names the file and line or the item id."""

    def __init__(self, where: str, what: str, *, expected: str | None = None, got: object = None):
        self.where = bounded(where, 300)  # a hostile file name or id must not fill the line
        self.what = bounded(what)
        where, what = self.where, self.what
        msg = f"{where}: {what}"
        if expected is not None:
            msg += f"; expected {expected}"
        if got is not None:
            msg += f"; got {short_repr(got)}"
        super().__init__(msg)

    @classmethod
    def from_message(cls, message: str) -> "InputError":
        """Re-raise a message built earlier by an InputError (``where: what``)."""
        where, _, what = message.partition(": ")
        return cls(where, what)


def short_repr(value: object, limit: int = 60) -> str:
    """A short, single-line copy of what was passed, for error messages."""
    text = repr(value).replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def param_error(param: str, func: str, expected: str, got: object) -> CapscoreError:
    """scikit-learn style: The 'x' parameter of f must be ...; got ... instead."""
    return CapscoreError(
        f"The {param!r} parameter of {func} must be {expected}; got {short_repr(got)} instead."
    )


def unknown_name(kind: str, name: str, known: Iterable[str]) -> CapscoreError:
    """An unknown name with did-you-mean suggestions (never the full list)."""
    known = list(dict.fromkeys(known))  # a name listed twice (e.g. by two registries) is suggested once
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if not close:
        lowered = {k.lower(): k for k in known}
        close = [lowered[k] for k in difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.5)]
    if not close and name:  # a family by its first word: 'aro' -> 'aro-vg-relation', ...
        close = [k for k in known if k.lower().startswith(name.lower())][:3]
    close = list(dict.fromkeys(close))
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return CapscoreError(f"unknown {kind} {name!r}{hint}")


def braced(value: object) -> str:
    """``value`` as text safe inside an :class:`OptionError` template (its braces doubled)."""
    return str(value).replace("{", "{{").replace("}", "}}")


class OptionError(CapscoreError):
    """A user error that names options, written once for both faces.

    The template's fields are parameter names: ``{resume}`` reads ``resume`` from the library and
    ``--resume`` on the command line (:meth:`on_command_line`). A field whose flag is not ``--`` plus its
    name carries the flag after a colon: ``{metrics:--metric}`` reads ``metrics`` / ``--metric``. Literal
    braces in the template are doubled (:func:`braced`)."""

    def __init__(self, template: str):
        self.template = template
        super().__init__(self.render(lambda name, flag: name))

    def render(self, spell) -> str:
        """The template with each field spelled by ``spell(name, flag)`` (``flag``: the one written after
        the field's colon, or None)."""
        class _Field:
            def __init__(self, name: str):
                self.name = name

            def __format__(self, flag: str) -> str:
                return spell(self.name, flag or None)

        class _Fields(dict):
            def __missing__(self, key: str) -> _Field:
                return _Field(key)

        return self.template.format_map(_Fields())

    def on_command_line(self) -> str:
        """The message with flags for parameters: ``--chunk-size`` for ``chunk_size``, or the field's own flag."""
        return self.render(lambda name, flag: flag or "--" + name.replace("_", "-"))
