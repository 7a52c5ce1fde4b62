"""BLEU, ROUGE-L and CIDEr-D on tokenised text, computed with numpy; equal to pycocoevalcap's to rounding.

Every n-gram (n = 1…4) of every sentence is interned once to an integer (tokens to ids through one dict,
then each order's (previous order's id, next token) pair to a dense id with ``np.unique``), so clipped
counts, reference maxima, document frequencies and tf-idf dot products become sorts, searches and
``bincount`` sums over flat arrays instead of dictionaries of tuples. The arithmetic of each formula
follows pycocoevalcap's code operation by operation (its smoothing constants, its ``closest`` reference
length, CIDEr-D's quirks below); sums run in another order, so values agree to ~1e-15, not bit for bit.

Tokens are what pycocoevalcap's scorers see: BLEU and CIDEr-D split on whitespace (``str.split()``),
ROUGE-L on single spaces (``str.split(" ")``, where an empty text is one empty token).

CIDEr-D as pycocoevalcap computes it (Vedantam et al. 2015, §3 and the CIDEr-D changes): tf-idf vectors
per n with IDF ``log(N) − log(max(1, df))`` over the N images of the set (df counted once per image over
its references), the candidate's weights clipped at the reference's (``min(vc, vr)·vr``), cosines divided
only where both norms are non-zero, a Gaussian length penalty ``e^(−Δ²/2σ²)`` whose length is the number of
*bigrams* (pycocoevalcap counts the n = 2 term frequencies), the mean over n, over references, × 10.

ROUGE-L's longest common subsequence is computed with the bit-parallel algorithm of Hyyrö (2004,
"Bit-parallel LCS-length computation revisited"): one Python integer per candidate holds a bit per
position, and each reference token costs a few integer operations, so a 10,000-word caption is cheap.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CIDER_SIGMA = 6.0
ROUGE_BETA = 1.2


class TokenSet:
    """The candidates and references of one evaluated set (token strings), interned once for every metric.

    ``cands[i]`` is scored against ``refs[i]`` (at least one reference each). The set keeps one token id
    and one n-gram id per order per token position; counts, matches and dot products are made ``chunk``
    items at a time, so the working memory does not grow with the set (CIDEr-D's document frequencies are
    one counter per distinct n-gram)."""

    def __init__(self, cands: Sequence[str], refs: Sequence[Sequence[str]], *, chunk: int = 512):
        self.cands = list(cands)
        self.refs = [list(r) for r in refs]
        self.n = len(self.cands)
        self.n_refs = np.array([len(r) for r in self.refs], dtype=np.int64)
        self.owner = np.repeat(np.arange(self.n, dtype=np.int64), self.n_refs)  # item of each reference
        self.first_ref = np.concatenate(([0], np.cumsum(self.n_refs)))  # item i's references: [first_ref[i], ..[i+1])
        self.chunk = chunk
        self._ids: tuple | None = None

    # --------------------------------------------------------------------------------- n-grams
    def _interned(self):
        """(sentence lengths in whitespace tokens, the start of each sentence in the token stream (one more
        entry: the end), the n-gram id starting at each position for n = 1…4 (−1 where the sentence ends
        first), the number of distinct n-grams); sentences = candidates then references."""
        if self._ids is not None:
            return self._ids
        sentences = self.cands + [r for rs in self.refs for r in rs]
        lens = np.fromiter((len(x.split()) for x in sentences), dtype=np.int64, count=len(sentences))
        vocab: dict[str, int] = {}
        parts = []
        for i in range(0, len(sentences), 4096):  # a block of sentences at a time: no list of every word
            words = " ".join(sentences[i:i + 4096]).split()  # the same tokens as each sentence's split()
            for w in dict.fromkeys(words):
                vocab.setdefault(w, len(vocab))
            parts.append(np.fromiter(map(vocab.__getitem__, words), dtype=np.int64, count=len(words)))
        tok = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        del parts
        starts = np.concatenate(([0], np.cumsum(lens)))
        left = np.repeat(starts[1:], lens) - np.arange(len(tok))  # tokens from each position to its sentence's end
        v = max(len(vocab), 1)
        small = np.int32 if 4 * len(tok) + v < 2**31 else np.int64  # every n-gram id fits
        ids, prev, base = [tok.astype(small)], tok, len(vocab)
        for n in range(2, 5):
            pos = np.flatnonzero(left >= n)
            uniq, inv = np.unique(prev[pos] * v + tok[pos + n - 1], return_inverse=True)
            gid = np.full(len(tok), -1, dtype=small)
            gid[pos] = inv + base
            ids.append(gid)
            prev = np.zeros(len(tok), dtype=np.int64)
            prev[pos] = inv
            base += len(uniq)
            del pos, inv
        self._ids = (lens, starts, ids, base)
        return self._ids

    def _counts(self, s0: int, s1: int):
        """Distinct (sentence, n-gram) pairs of sentences [s0, s1), sorted, with order and count:
        (sentence, order 1…4, n-gram id, count)."""
        lens, starts, ids, g = self._interned()
        p0, p1 = starts[s0], starts[s1]
        sent = np.repeat(np.arange(s1 - s0, dtype=np.int64), lens[s0:s1])
        keys, orders = [], []
        for n, grams in enumerate(ids, start=1):
            part = grams[p0:p1]
            ok = part >= 0
            keys.append(sent[ok] * g + part[ok])
            orders.append(np.full(int(ok.sum()), n, dtype=np.int8))
        key = np.concatenate(keys)
        uniq, first, count = np.unique(key, return_index=True, return_counts=True)
        return uniq // g + s0, np.concatenate(orders)[first], uniq % g, count

    def _chunks(self):
        """(first item, end item, candidate counts, reference counts) for ``chunk`` items at a time."""
        n = self.n
        for a in range(0, n, self.chunk):
            b = min(n, a + self.chunk)
            yield a, b, self._counts(a, b), self._counts(n + self.first_ref[a], n + self.first_ref[b])

    # --------------------------------------------------------------------------------- BLEU
    def bleu_stats(self) -> np.ndarray:
        """(N, 10) rows of ``classic_stats.BLEU_COLUMNS``: candidate length, closest reference length,
        n-gram counts and clipped matches for n = 1…4 (pycocoevalcap's ``cook_test`` with ``closest``)."""
        lens, _, _, g = self._interned()
        n = self.n
        correct = np.zeros((n, 4))
        for a, b, (c_sent, c_order, c_gram, c_count), (r_sent, _, r_gram, r_count) in self._chunks():
            # the most times each n-gram occurs in one reference of the item
            r_key = self.owner[r_sent - n] * g + r_gram
            srt = np.argsort(r_key, kind="stable")
            r_key, r_cnt = r_key[srt], r_count[srt]
            cut = np.flatnonzero(np.concatenate(([True], r_key[1:] != r_key[:-1]))) if len(r_key) else srt[:0]
            r_key, r_max = r_key[cut], np.maximum.reduceat(r_cnt, cut) if len(cut) else r_cnt
            clipped = np.minimum(c_count, _lookup(r_key, r_max, c_sent * g + c_gram))
            correct[a:b] = np.bincount((c_sent - a) * 4 + c_order - 1, weights=clipped,
                                       minlength=4 * (b - a)).reshape(b - a, 4)
        testlen = lens[:n]
        guess = np.maximum(0, testlen[:, None] - np.arange(4)[None, :])
        # closest reference length: min over references of (|len - testlen|, len)
        rlen = lens[n:]
        dist = np.abs(rlen - testlen[self.owner])
        best = np.lexsort((rlen, dist, self.owner))
        reflen = rlen[best[self.first_ref[:-1]]]
        return np.column_stack([testlen, reflen, guess, correct]).astype(float)

    # --------------------------------------------------------------------------------- CIDEr-D
    def _document_frequency(self) -> np.ndarray:
        """Per n-gram id: the number of images whose references hold it."""
        n, g = self.n, self._interned()[3]
        df = np.zeros(g)
        for a, b in ((a, min(n, a + self.chunk)) for a in range(0, n, self.chunk)):
            r_sent, _, r_gram, _ = self._counts(n + self.first_ref[a], n + self.first_ref[b])
            df += np.bincount(_distinct(self.owner[r_sent - n] * g + r_gram) % g, minlength=g)
        return df

    def cider_d(self, sigma: float = CIDER_SIGMA) -> np.ndarray:
        """Per-item CIDEr-D with the IDF over this set (module docstring)."""
        n, g = self.n, self._interned()[3]
        ref_len = np.log(float(n))
        weight = ref_len - np.log(np.maximum(1.0, self._document_frequency()))
        out = np.zeros(n)
        for a, b, (c_sent, c_order, c_gram, c_count), (r_sent, r_order, r_gram, r_count) in self._chunks():
            m = b - a
            c_vec, r_vec = c_count * weight[c_gram], r_count * weight[r_gram]
            c_norm = np.sqrt(np.bincount((c_sent - a) * 4 + c_order - 1, weights=c_vec ** 2,
                                         minlength=4 * m)).reshape(m, 4)
            r0 = self.first_ref[a]
            k = self.first_ref[b] - r0  # references in the chunk
            r_local = r_sent - n - r0
            r_norm = np.sqrt(np.bincount(r_local * 4 + r_order - 1, weights=r_vec ** 2, minlength=4 * k)).reshape(k, 4)
            # pycocoevalcap's "length" is the number of bigrams (its n == 1 index is n-grams of order 2)
            c_len = np.bincount(c_sent - a, weights=np.where(c_order == 2, c_count, 0), minlength=m)
            r_len = np.bincount(r_local, weights=np.where(r_order == 2, r_count, 0), minlength=k)
            # dot products: each reference n-gram against the same n-gram of its item's candidate
            r_item = self.owner[r_sent - n]
            vc = _lookup(c_sent * g + c_gram, c_vec, r_item * g + r_gram)  # the candidate keys come sorted
            val = np.bincount(r_local * 4 + r_order - 1, weights=np.minimum(vc, r_vec) * r_vec,
                              minlength=4 * k).reshape(k, 4)
            own = self.owner[r0:r0 + k] - a
            nc, nr = c_norm[own], r_norm
            with np.errstate(divide="ignore", invalid="ignore"):
                val = np.where((nc != 0) & (nr != 0), val / (nc * nr), val)
            delta = c_len[own] - r_len
            val = val * (np.e ** (-(delta ** 2) / (2 * sigma ** 2)))[:, None]
            per_item = np.zeros((m, 4))
            np.add.at(per_item, own, val)
            out[a:b] = per_item.mean(axis=1) / self.n_refs[a:b] * 10.0
        return out

    # --------------------------------------------------------------------------------- ROUGE-L
    def rouge_l(self, beta: float = ROUGE_BETA) -> np.ndarray:
        """Per-item ROUGE-L F (pycocoevalcap's ``Rouge.calc_score``: the best precision and the best recall
        over the references, then F with β; 0 where either is 0)."""
        prec = np.zeros(self.n)
        rec = np.zeros(self.n)
        for i, (c, rs) in enumerate(zip(self.cands, self.refs)):
            tc = c.split(" ")
            masks: dict[str, int] = {}
            for k, w in enumerate(tc):
                masks[w] = masks.get(w, 0) | (1 << k)
            full = (1 << len(tc)) - 1
            p = r = 0.0
            for ref in rs:
                tr = ref.split(" ")
                lcs = _lcs(masks, full, len(tc), tr)
                p = max(p, lcs / float(len(tc)))
                r = max(r, lcs / float(len(tr)))
            prec[i], rec[i] = p, r
        b2 = beta ** 2
        with np.errstate(divide="ignore", invalid="ignore"):
            score = ((1 + b2) * prec * rec) / (rec + b2 * prec)
        return np.where((prec != 0) & (rec != 0), score, 0.0)


def _distinct(keys: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an integer array (a plain sort: faster here than ``np.unique``)."""
    k = np.sort(keys)
    return k[np.concatenate(([True], k[1:] != k[:-1]))] if len(k) else k


def _lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at each query's position in the sorted unique ``keys``; 0 where a query is absent."""
    if not len(keys):
        return np.zeros(len(queries), dtype=values.dtype)
    at = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
    return np.where(keys[at] == queries, values[at], 0)


def _lcs(masks: dict[str, int], full: int, m: int, other: Sequence[str]) -> int:
    """Length of the longest common subsequence of a sequence of ``m`` tokens (``masks``: token -> bit set of
    its positions) and ``other`` (Hyyrö 2004: V' = (V + U) | (V − U), U = V & M[y]; the LCS is the number
    of zero bits of V among the low m)."""
    v = full
    for y in other:
        u = v & masks.get(y, 0)
        v = ((v + u) | (v - u)) & full
    return m - v.bit_count()
