"""Persistent, content-addressed embedding cache (one SQLite file).

Key = hash(backbone identity, kind, content key). The backbone identity
already includes the weights hash, context length and preprocessing; the
content key is the exact text (prefix included) or the hash of the image's
bytes/pixels. Every batch is committed as soon as it is encoded, so an
interrupted run keeps everything it finished; SQLite's journal keeps the file
consistent if the process dies mid-write.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from capscore._log import warn
from capscore.errors import CapscoreError

DEFAULT_CACHE_DIR = Path(os.environ.get("CAPSCORE_CACHE", Path.home() / ".cache" / "capscore"))


def cache_key(identity: str, kind: str, content: str) -> bytes:
    return hashlib.blake2b(f"{identity}\x00{kind}\x00{content}".encode(), digest_size=20).digest()


class EmbeddingCache:
    """Maps cache keys to float32 vectors. Thread-safe for one writer process."""

    def __init__(self, path: str | os.PathLike | None = None):
        path = Path(path).expanduser() if path is not None else DEFAULT_CACHE_DIR / "embeddings.sqlite"
        if path.suffix != ".sqlite" or path.is_dir():  # a folder, even one named like the database
            path = path / "embeddings.sqlite"
        if path.parent.exists() and not path.parent.is_dir():
            raise CapscoreError(f"cache folder {path.parent} is a file; give --cache-dir a folder")
        if path.is_dir():
            raise CapscoreError(f"cache database {path} is a folder; give --cache-dir another folder")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CapscoreError(f"cache folder {path.parent}: cannot create it ({e.strerror or e})") from None
        self.path = path
        self._lock = threading.Lock()
        try:
            self._db = self._open(path)
        except sqlite3.DatabaseError as e:
            if not path.is_file() or "not a database" not in str(e) and "malformed" not in str(e):
                raise CapscoreError(f"cache database {path}: cannot open it ({e})") from None
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            os.replace(path, aside)
            for extra in ("-wal", "-shm"):
                stale = path.with_name(path.name + extra)
                if stale.exists():
                    os.replace(stale, aside.with_name(aside.name + extra))
            warn(f"cache database {path} was corrupt ({e}); moved it to {aside.name} and started an empty one")
            self._db = self._open(path)

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        # timeout: a second process using the same cache waits for the writer's short commit
        db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=60)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS emb (k BLOB PRIMARY KEY, v BLOB NOT NULL)")
            db.execute("SELECT k, v FROM emb LIMIT 1").fetchall()  # no full integrity scan: caches grow to GBs
        except BaseException:
            db.close()
            raise
        return db

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        out: dict[bytes, np.ndarray] = {}
        with self._lock, self._damaged():
            for i in range(0, len(keys), 500):
                chunk = list(keys[i : i + 500])
                q = f"SELECT k, v FROM emb WHERE k IN ({','.join('?' * len(chunk))})"
                for k, v in self._db.execute(q, chunk):
                    out[bytes(k)] = np.frombuffer(v, dtype=np.float32).copy()
        return out

    @contextlib.contextmanager
    def _damaged(self):
        """Damage found after opening (a bad page deep in the file) -> one line naming the file."""
        try:
            yield
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
                raise CapscoreError(f"cache database {self.path} stayed locked by another process ({e})") from None
            raise CapscoreError(f"cache database {self.path}: {e}; delete it (it is only a cache) or use "
                                "--no-cache") from None

    def put_many(self, items: Iterable[tuple[bytes, np.ndarray]]) -> None:
        rows = [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items]
        with self._lock, self._damaged():
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO emb (k, v) VALUES (?, ?)", rows)
            self._db.execute("COMMIT")

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM emb").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
