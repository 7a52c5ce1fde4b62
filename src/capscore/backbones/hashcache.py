"""A small cache of weights hashes, keyed by the files the weights were loaded from.

The backbone identity contains a SHA-256 over every parameter
(:func:`capscore.backbones.base.weights_hash`), which costs seconds of CPU per run
for a ViT and grows with the model's size. When a loader knows the files the weights came
from, the hash is remembered under (each file's resolved path, size and modification
time in ns, the load recipe: spec, dtype, context length, read-out, capscore/torch/
open_clip versions) in ``$CAPSCORE_CACHE/weights-hashes.json``. Any change of size or
mtime — and any other recipe — computes the hash again. A file rewritten in place with
the same size *and* the same mtime (to the nanosecond) would not be noticed; tools that
write files set the mtime, so this takes a deliberate ``touch -d``.

Backbones whose weights change after loading (training, a dtype change) drop the
remembered source (``Backbone.invalidate_identity``) and hash their parameters again.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
import hashlib

MAX_ENTRIES = 512
_lock = threading.Lock()


def cache_file() -> Path:
    # the embedding cache's folder (capscore.embed.cache.DEFAULT_CACHE_DIR), without importing the engine
    return Path(os.environ.get("CAPSCORE_CACHE", Path.home() / ".cache" / "capscore")) / "weights-hashes.json"


def file_fingerprint(files: Sequence[str | os.PathLike]) -> tuple[tuple[str, int, int], ...] | None:
    """(resolved path, size, mtime_ns) of each file; None if one cannot be read (then nothing is cached)."""
    out = []
    for f in files:
        try:
            p = Path(f).expanduser().resolve()
            st = p.stat()
        except OSError:
            return None
        if not p.is_file():
            return None
        out.append((str(p), st.st_size, st.st_mtime_ns))
    return tuple(out) if out else None


def source_key(fingerprint: tuple, recipe: str) -> str:
    return hashlib.sha256(json.dumps([list(map(list, fingerprint)), recipe]).encode()).hexdigest()[:32]


def cached_hash(key: str, compute: Callable[[], str], *, path: Path | None = None) -> str:
    """The hash remembered under ``key``, else ``compute()`` (then remembered). A damaged or unwritable
    cache file is ignored (the hash is computed); it is only a cache."""
    found = lookup(key, path=path)
    if found is not None:
        return found
    value = compute()
    remember(key, value, path=path)
    return value


def lookup(key: str, *, path: Path | None = None) -> str | None:
    """The string remembered under ``key`` in the table at ``path`` (default :func:`cache_file`), or None."""
    with _lock:
        return _read(path or cache_file()).get(key)


def remember(key: str, value: str | None, *, path: Path | None = None) -> None:
    """Remember ``value`` under ``key`` (the oldest of more than ``MAX_ENTRIES`` go); None forgets ``key``."""
    path = path or cache_file()
    with _lock:
        table = _read(path)
        table.pop(key, None)
        if value is not None:
            table[key] = value
        while len(table) > MAX_ENTRIES:
            table.pop(next(iter(table)))
        _write(path, table)


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def _write(path: Path, table: dict[str, str]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".weights-hashes.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(table, f)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old or the new table
    except OSError:
        pass
