"""Checks made before writing results: an output folder or file that can be written, and an output that is
not one of the inputs. ``name`` is how the caller's user knows the path (a parameter, or a flag)."""
from __future__ import annotations

import os
from pathlib import Path

from capscore.errors import CapscoreError


def output_dir(path: str | Path, name: str = "out") -> Path:
    """Refuse an existing file (instead of failing deep inside), create the folder -> its path."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise CapscoreError(f"{name} {out}: is an existing file; {name} names a folder here")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CapscoreError(f"{name} {out}: cannot create the folder ({e.strerror or e})") from None
    return out


def output_file(path: str | Path, name: str = "out", *, what: str = "a file") -> Path:
    """Refuse a folder, make sure the parent folder exists and is writable -> the file's path.

    ``what`` says what ``name`` should name, for the message on a folder ("a .jsonl or .csv file")."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise CapscoreError(f"{name} {out}: is a folder; {name} names {what} here")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CapscoreError(f"{name} {out}: cannot create its folder ({e.strerror or e})") from None
    if not os.access(out.parent, os.W_OK):
        raise CapscoreError(f"{name} {out}: the folder {out.parent} is not writable")
    return out


def refuse_input_as_output(out: str | Path, inputs: dict[str, object], name: str = "out") -> None:
    """Refuse an output that is one of the input files (``inputs``: {name: path or paths}); overwriting it
    would destroy it."""
    target = Path(out).expanduser().resolve()
    for what, value in inputs.items():
        for p in value if isinstance(value, (list, tuple)) else [value]:
            if p and Path(p).expanduser().resolve() == target:
                raise CapscoreError(f"{name} {out} is also the {what} input; writing results there would "
                                    "destroy it — choose another output file")
