"""Persistent, content-addressed embedding cache (one SQLite file).

Key = hash(backbone identity, kind, content key). The backbone identity
already includes the weights hash, context length and preprocessing; the
content key is the exact text (prefix included) or the hash of the image's
bytes/pixels. Every batch is committed as soon as it is encoded, so an
interrupted run keeps everything it finished; SQLite's journal keeps the file
consistent if the process dies mid-write.
"""
from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

DEFAULT_CACHE_DIR = Path(os.environ.get("CAPSCORE_CACHE", Path.home() / ".cache" / "capscore"))


def cache_key(identity: str, kind: str, content: str) -> bytes:
    return hashlib.blake2b(f"{identity}\x00{kind}\x00{content}".encode(), digest_size=20).digest()


class EmbeddingCache:
    """Maps cache keys to float32 vectors. Thread-safe for one writer process."""

    def __init__(self, path: str | os.PathLike | None = None):
        path = Path(path).expanduser() if path is not None else DEFAULT_CACHE_DIR / "embeddings.sqlite"
        if path.suffix != ".sqlite":
            path = path / "embeddings.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS emb (k BLOB PRIMARY KEY, v BLOB NOT NULL)")

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        out: dict[bytes, np.ndarray] = {}
        with self._lock:
            for i in range(0, len(keys), 500):
                chunk = list(keys[i : i + 500])
                q = f"SELECT k, v FROM emb WHERE k IN ({','.join('?' * len(chunk))})"
                for k, v in self._db.execute(q, chunk):
                    out[bytes(k)] = np.frombuffer(v, dtype=np.float32).copy()
        return out

    def put_many(self, items: Iterable[tuple[bytes, np.ndarray]]) -> None:
        rows = [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items]
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO emb (k, v) VALUES (?, ?)", rows)
            self._db.execute("COMMIT")

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM emb").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
