"""Persistent, content-addressed embedding cache (one SQLite file).

Key = hash(backbone identity, kind, content key). The backbone identity
already includes the weights hash, context length and preprocessing; the
content key is the exact text (prefix included) or the hash of the image's
bytes/pixels. Every batch is committed as soon as it is encoded, so an
interrupted run keeps everything it finished; SQLite's journal keeps the file
consistent if the process dies mid-write.

Large per-item features (per-token text features; see ``Encoder.text_tokens``)
live in a second table of the same file, bounded in bytes
(``max_feature_bytes``, default :data:`DEFAULT_FEATURE_BYTES` or
``$CAPSCORE_FEATURE_CACHE_MB``): when a commit takes it over the bound, the
least recently used entries are deleted until it is at 90 % of it. Global
vectors are small (2-4 KB each) and are never evicted.
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
DEFAULT_FEATURE_BYTES = 2 * 2**30  # per-token features: 2 GiB (~40 KB per caption for a 512-d tower)


def _feature_bytes_from_env() -> int:
    raw = os.environ.get("CAPSCORE_FEATURE_CACHE_MB")
    if not raw:
        return DEFAULT_FEATURE_BYTES
    try:
        mb = float(raw)
    except ValueError:
        raise CapscoreError(f"$CAPSCORE_FEATURE_CACHE_MB must be a number of megabytes; got {raw!r}") from None
    if not mb >= 0:
        raise CapscoreError(f"$CAPSCORE_FEATURE_CACHE_MB must be >= 0; got {raw!r}")
    return int(mb * 2**20)


def cache_key(identity: str, kind: str, content: str) -> bytes:
    return hashlib.blake2b(f"{identity}\x00{kind}\x00{content}".encode(), digest_size=20).digest()


class EmbeddingCache:
    """Maps cache keys to float32 vectors. Thread-safe for one writer process."""

    def __init__(self, path: str | os.PathLike | None = None, *, max_feature_bytes: int | None = None):
        self.max_feature_bytes = _feature_bytes_from_env() if max_feature_bytes is None else int(max_feature_bytes)
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
        with self._lock, self._damaged():
            total, clock = self._db.execute("SELECT COALESCE(SUM(n), 0), COALESCE(MAX(t), 0) FROM feat").fetchone()
        self._feature_total, self._clock = int(total), int(clock)

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        # timeout: a second process using the same cache waits for the writer's short commit
        db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=60)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS emb (k BLOB PRIMARY KEY, v BLOB NOT NULL)")
            # n: bytes of v; t: a use counter (larger = more recent), for least-recently-used eviction
            db.execute("CREATE TABLE IF NOT EXISTS feat (k BLOB PRIMARY KEY, v BLOB NOT NULL, n INTEGER NOT NULL, "
                       "t INTEGER NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS feat_t ON feat (t)")
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

    # ------------------------------------------------------------------ bounded feature table
    def get_features(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        """Like :meth:`get_many`, from the bounded feature table; a hit counts as a use (for eviction)."""
        out: dict[bytes, np.ndarray] = {}
        if not keys:
            return out
        with self._lock, self._damaged():
            for i in range(0, len(keys), 500):
                chunk = list(keys[i : i + 500])
                q = f"SELECT k, v FROM feat WHERE k IN ({','.join('?' * len(chunk))})"
                for k, v in self._db.execute(q, chunk):
                    out[bytes(k)] = np.frombuffer(v, dtype=np.float32).copy()
            if out:
                self._clock += 1
                self._db.execute("BEGIN")
                self._db.executemany("UPDATE feat SET t = ? WHERE k = ?", [(self._clock, k) for k in out])
                self._db.execute("COMMIT")
        return out

    def put_features(self, items: Iterable[tuple[bytes, np.ndarray]]) -> None:
        """Store large features; evict the least recently used ones beyond ``max_feature_bytes``."""
        rows = [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items]
        if self.max_feature_bytes <= 0 or not rows:
            return
        with self._lock, self._damaged():
            self._clock += 1
            self._db.execute("BEGIN")
            old = 0
            for i in range(0, len(rows), 500):
                chunk = [k for k, _ in rows[i : i + 500]]
                q = f"SELECT COALESCE(SUM(n), 0) FROM feat WHERE k IN ({','.join('?' * len(chunk))})"
                old += int(self._db.execute(q, chunk).fetchone()[0])
            self._db.executemany("INSERT OR REPLACE INTO feat (k, v, n, t) VALUES (?, ?, ?, ?)",
                                 [(k, v, len(v), self._clock) for k, v in rows])
            self._feature_total += sum(len(v) for _, v in rows) - old
            if self._feature_total > self.max_feature_bytes:
                self._evict(int(0.9 * self.max_feature_bytes))
            self._db.execute("COMMIT")

    def _evict(self, target: int) -> None:
        """Delete least recently used features until their total is <= ``target`` (inside a transaction)."""
        doomed, total = [], self._feature_total
        for k, n in self._db.execute("SELECT k, n FROM feat ORDER BY t, k").fetchall():
            if total <= target:
                break
            doomed.append((k,))
            total -= n
        self._db.executemany("DELETE FROM feat WHERE k = ?", doomed)
        self._feature_total = total

    def feature_bytes(self) -> int:
        """Bytes held in the feature table."""
        return self._feature_total

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM emb").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
