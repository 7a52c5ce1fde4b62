"""The concept pool of ABE-CLIP: object words whose phrase encodings estimate binding vectors.

ABE-CLIP's semantic refinement (see :mod:`capscore.scores.abe`) does not measure
what an attribute does to the caption's own object directly; it averages over
the ``P`` objects of a *concept pool* that are nearest to that object. The paper
(abe-clip.txt, section 3.2) names its pool: "we adopt the more comprehensive and
empirically-grounded conceptual vocabulary provided by SPLiCE [bhalla2024interpreting],
containing over 12K concepts" (Magnet, which ABE follows, used 614 object nouns).

**Why capscore does not ship SPLiCE's vocabulary.** The vocabulary is public and
readable (AI4LIFE-GROUP/SpLiCE on GitHub, ``data/vocab/laion.txt``; also
``data/vocab/mscoco.txt``), but the repository carries no licence file and its
``setup.py`` declares none, so nothing grants the right to redistribute it inside
capscore. Point ABE at your own copy instead::

    git clone https://github.com/AI4LIFE-GROUP/SpLiCE
    capscore probe --suite aro-vg-attribution --scorer abe --concept-pool SpLiCE/data/vocab/laion.txt ...
    AbeConfig(pool="SpLiCE/data/vocab/laion.txt")          # from Python

SpLiCE's files are one concept per line, sorted from least to most important
(its ``vocabulary_size=k`` keeps the *last* k lines); the paper does not say which
size it used ("over 12K"), so capscore reads the whole file you give it — trim it
first (e.g. ``tail -n 12000``) to mimic a size. The file format below reads SpLiCE's
files unchanged (a ``#`` glued to a word, as in its ``...#`` entries, is kept).

Pools capscore can use:

* **bundled** (default): ``scores/data/concept_pool.txt``, ~300 common depictable
  object nouns written for capscore (shapes, people, animals, vehicles, street,
  nature, home, food, clothing, tools). Lower case, singular, one per line. It works
  offline and is the same on every machine; it is *not* the paper's pool, so ABE
  numbers with it are capscore's, not a replication.
* **a user file** (``--concept-pool FILE`` / ``AbeConfig(pool=FILE)``): UTF-8, one
  word or short phrase per line; a ``#`` at the start of a line or after whitespace
  starts a comment.

Neighbours are chosen by cosine similarity of the backbone's *global* text
embeddings of the bare words (``Encoder.encode_texts``). :func:`pool_vectors`
keeps the whole (C, D) matrix as one entry of the engine's cache under
(backbone identity, pool content hash), persistent when the engine has an
on-disk cache, so a later run reads one row instead of looking up and
tokenising every word. Ties are broken by the order of the file, so the choice
is reproducible. The query object itself counts as a neighbour when it is in
the pool (it is then its own nearest neighbour).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import numpy as np

from capscore.errors import CapscoreError, InputError
from capscore.embed.cache import cache_key

BUNDLED_POOL = Path(__file__).parent / "data" / "concept_pool.txt"
_COMMENT = re.compile(r"(?:^|\s)#")  # a comment starts at the line's start or after whitespace


@dataclass(frozen=True)
class ConceptPool:
    """Words of a concept pool, where they came from, and a content hash (for records)."""

    words: tuple[str, ...]
    source: str
    sha: str

    def __len__(self) -> int:
        return len(self.words)


def parse_pool(text: str, *, source: str) -> ConceptPool:
    """Pool file contents -> :class:`ConceptPool` (comments and blanks skipped, lower-cased, deduplicated)."""
    words: list[str] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _COMMENT.split(raw, 1)[0].strip().lower()
        if not line:
            continue
        if "\t" in line:
            raise InputError(f"{source}:{lineno}", "a concept must be a word or short phrase, one per line", got=raw)
        line = " ".join(line.split())
        if line not in seen:
            seen.add(line)
            words.append(line)
    if not words:
        raise InputError(source, "concept pool is empty", expected="one object word per line")
    sha = hashlib.sha256("\n".join(words).encode()).hexdigest()[:12]
    return ConceptPool(tuple(words), source, sha)


@lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int) -> ConceptPool:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(path, "concept pool is not UTF-8 text") from None
    return parse_pool(text, source=path)


def load_concept_pool(path: str | Path | None = None) -> ConceptPool:
    """The bundled pool (``path=None``) or a user file; cached per (path, modification time)."""
    p = Path(path).expanduser() if path is not None else BUNDLED_POOL
    if not p.is_file():
        raise CapscoreError(f"concept pool file not found: {p}")
    return _load_cached(str(p.resolve()), p.stat().st_mtime_ns)


def nearest_concepts(queries: torch.Tensor, pool_vectors: torch.Tensor, *, p: int) -> torch.Tensor:
    """Indices (Q, min(p, C)) of the ``p`` pool rows most cosine-similar to each query row.

    ``queries`` (Q, D) and ``pool_vectors`` (C, D) are L2-normalised. Ties go to the
    earlier pool entry (a stable sort), so the result does not depend on hardware.
    """
    sims = queries @ pool_vectors.T  # (Q, C)
    order = torch.sort(-sims, dim=1, stable=True).indices
    return order[:, : min(p, pool_vectors.shape[0])]


def pool_vectors(encoder, pool: ConceptPool) -> torch.Tensor:
    """The pool's global text vectors (C, D), normalised, in pool order; cached as one matrix.

    Computed once per (backbone identity, pool contents) with ``encoder.encode_texts`` (the same
    vectors as encoding the words one by one) and stored in ``encoder.cache`` under that key.
    """
    bb = encoder.backbone
    key = cache_key(bb.identity, "concept-pool", f"{pool.sha}:{len(pool)}:{bb.embed_dim}")
    hit = encoder.cache.get_many([key]).get(key)
    if hit is not None and hit.size == len(pool) * bb.embed_dim:
        return torch.from_numpy(np.ascontiguousarray(hit.reshape(len(pool), bb.embed_dim)))
    vecs = encoder.encode_texts(list(pool.words))
    encoder.cache.put_many([(key, vecs.numpy().ravel())])
    return vecs
