"""The encoding engine: the one place that batches, pads, places, casts and caches.

Every metric, probe and trainer evaluation goes through :class:`Encoder`:

* inputs are deduplicated before encoding (an evaluation set repeats one
  image for 3–50 captions);
* texts are sorted by token length and each batch is padded to its longest
  caption, not to the context length (exact for causal CLIP towers; backbones
  that are not set ``pad_to_longest_exact = False`` and get full padding);
  per-token features are batched by a token budget (rows x padded length,
  ``text_token_budget``) rather than a fixed count, so many short phrases
  (ABE-CLIP's) share one forward;
* captions longer than the context are truncated *keeping* the end-of-text
  token, with one warning that counts them;
* images are read and decoded in worker threads;
* all work runs under ``torch.inference_mode`` on the backbone's device/dtype,
  and vectors come back L2-normalised, float32, on the CPU;
* global vectors go to a persistent cache keyed by (backbone identity, kind,
  content), committed batch by batch; per-token text features go to the same
  file's byte-bounded feature table (least recently used evicted first) and a
  bounded in-memory cache; patch tokens, the largest, to the in-memory cache only;
* one image forward serves both the global vector and the patch tokens
  (``encode_images(..., patches=True)``, ``image_patches``): the global vector
  of a patch forward goes to the persistent cache like any other.
"""
from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from capscore._log import warn
from capscore.backbones.base import Backbone
from capscore.embed.cache import EmbeddingCache, cache_key
from capscore.data.images import ImageRef
from capscore.errors import CapscoreError, InputError


# Text that CLIP's BPE tokeniser splits only at spaces, one word at a time: "prefix word" is then
# tokens(prefix) + tokens(word) without tokenising it (Encoder.words_in_context checks other text).
_PLAIN = re.compile(r"[A-Za-z0-9 '-]*")


class MemoryCache:
    """Bounded LRU with the same interface as :class:`EmbeddingCache`."""

    def __init__(self, max_items: int = 200_000):
        self.max_items = max_items
        self._d: OrderedDict[bytes, object] = OrderedDict()

    def get_many(self, keys):
        out = {}
        for k in keys:
            if k in self._d:
                self._d.move_to_end(k)
                out[k] = self._d[k]
        return out

    def put_many(self, items):
        for k, v in items:
            self._d[k] = v
            self._d.move_to_end(k)
        while len(self._d) > self.max_items:
            self._d.popitem(last=False)

    def __len__(self):
        return len(self._d)


@dataclass
class EncoderStats:
    texts_encoded: int = 0
    texts_cached: int = 0
    images_encoded: int = 0
    images_cached: int = 0
    truncated: int = 0
    videos_encoded: int = 0
    videos_cached: int = 0
    frames_encoded: int = 0
    decode_seconds: float = 0.0  # video decode + frame preprocessing (worker threads)
    encode_seconds: float = 0.0  # video frames through the image tower
    seen_truncated: set = field(default_factory=set, repr=False)


@dataclass(frozen=True)
class TokenFeatures:
    """Per-token features of one caption: ids (L,), strings, vectors (L, D), global (D,). Normalised."""

    ids: tuple[int, ...]
    tokens: tuple[str, ...]
    vectors: torch.Tensor
    global_: torch.Tensor


class Encoder:
    """Encode texts and images with one backbone; see the module docstring."""

    def __init__(
        self,
        backbone: Backbone,
        *,
        batch_size: int = 64,
        image_batch_size: int | None = None,
        cache: EmbeddingCache | MemoryCache | str | os.PathLike | None = None,
        workers: int = 2,
        progress: bool = False,
        text_token_budget: int | None = None,
    ):
        self.backbone = backbone
        self.batch_size = batch_size
        # per-token features: rows x padded length per forward; default = batch_size full-context captions
        self.text_token_budget = text_token_budget or batch_size * backbone.context_length
        self.image_batch_size = image_batch_size or batch_size
        if cache is None:
            cache = MemoryCache()
        elif not isinstance(cache, (EmbeddingCache, MemoryCache)):
            cache = EmbeddingCache(cache)
        self.cache = cache
        self.workers = max(1, workers)
        self.progress = progress
        self.stats = EncoderStats()
        self._warned_truncation = False
        self._features = MemoryCache(max_items=4096)  # patch/token features

    # ---------------------------------------------------------------- texts
    def _prepare_ids(self, texts: Sequence[str]) -> list[list[int]]:
        bb = self.backbone
        ids = bb.tokenize(list(texts))
        out = []
        newly = 0
        for t, row in zip(texts, ids):
            if len(row) > bb.context_length:
                if t not in self.stats.seen_truncated:
                    self.stats.seen_truncated.add(t)
                    newly += 1
                row = bb.truncate(row)
            out.append(row)
        if newly:
            self.stats.truncated += newly
            if not self._warned_truncation:  # once per run (per encoder), not once per chunk; the total is in stats
                self._warned_truncation = True
                warn(
                    f"captions longer than the {bb.context_length}-token context of {bb.spec} are truncated "
                    "(end-of-text token kept; the count is in the run's summary); use a longer-context backbone "
                    "(e.g. LongCLIP, 248) to avoid it"
                )
        return out

    def _batches(self, ids: list[list[int]], size: int, *, budget: int | None = None):
        """Yield (positions, padded ids (B, L), lengths (B,)) sorted by length to minimise padding.

        ``size`` rows per batch; with ``budget``, instead as many rows as keep rows x padded length
        within it (at least one row), so short texts share a batch, and no row more than a quarter
        (at least 2 tokens) longer than the batch's first, so padding stays a small share."""
        bb = self.backbone
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        width = (lambda n: len(ids[order[n]])) if bb.pad_to_longest_exact else (lambda n: bb.context_length)
        groups, s = [], 0
        while s < len(order):
            if budget is None:
                e = min(s + size, len(order))
            else:  # ascending lengths: the batch's last row is its longest
                e = s + 1
                cap = max(width(s) + 2, width(s) * 5 // 4)
                while e < len(order) and (e + 1 - s) * width(e) <= budget and width(e) <= cap:
                    e += 1
            groups.append(order[s:e])
            s = e
        for pos in groups:
            rows = [ids[i] for i in pos]
            L = max(len(r) for r in rows) if bb.pad_to_longest_exact else bb.context_length
            x = torch.full((len(rows), L), bb.pad_id, dtype=torch.long)
            for j, r in enumerate(rows):
                x[j, : len(r)] = torch.tensor(r, dtype=torch.long)
            yield pos, x, torch.tensor([len(r) for r in rows], dtype=torch.long)

    def encode_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Texts -> (N, D) normalised float32 vectors, in input order."""
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InputError(f"text #{i}", "caption is not a string", got=t)
        bb = self.backbone
        uniq = list(dict.fromkeys(texts))
        keys = [cache_key(bb.identity, "text", t) for t in uniq]
        found = self.cache.get_many(keys)
        missing = [i for i, k in enumerate(keys) if k not in found]
        self.stats.texts_cached += len(uniq) - len(missing)
        vecs: dict[bytes, np.ndarray] = dict(found)
        if missing:
            ids = self._prepare_ids([uniq[i] for i in missing])
            bar = self._bar(len(missing), "texts")
            with torch.inference_mode():
                for pos, x, lengths in self._batches(ids, self.batch_size):
                    g, _ = bb.forward_texts(x.to(bb.device), lengths)
                    g = F.normalize(g.float(), dim=-1).cpu().numpy()
                    new = [(keys[missing[p]], g[j]) for j, p in enumerate(pos)]
                    self.cache.put_many(new)
                    vecs.update(new)
                    self.stats.texts_encoded += len(pos)
                    if bar:
                        bar.update(len(pos))
            if bar:
                bar.close()
        index = {t: vecs[k] for t, k in zip(uniq, keys)}
        if not texts:
            return torch.empty(0, bb.embed_dim)
        return torch.from_numpy(np.stack([index[t] for t in texts]).astype(np.float32, copy=False))

    def text_tokens(self, texts: Sequence[str]) -> list[TokenFeatures]:
        """Per-token features in the joint space (start and end tokens included), normalised.

        Kept in memory and, with a persistent cache, in its bounded feature table under
        (backbone identity, "text-tokens", text), so a later run re-encodes nothing."""
        bb = self.backbone
        if not bb.has_token_features:
            raise CapscoreError(f"backbone {bb.spec} does not expose per-token text features")
        uniq = list(dict.fromkeys(texts))
        keys = [cache_key(bb.identity, "text-tokens", t) for t in uniq]
        found = self._features.get_many(keys)
        if isinstance(self.cache, EmbeddingCache) and len(found) < len(keys):
            stored = self.cache.get_features([k for k in keys if k not in found])
            for k, blob in stored.items():
                found[k] = self._unpack_tokens(blob)
            self._features.put_many((k, found[k]) for k in stored)
        missing = [i for i, k in enumerate(keys) if k not in found]
        if missing:
            ids = self._prepare_ids([uniq[i] for i in missing])
            with torch.inference_mode():
                for pos, x, lengths in self._batches(ids, self.batch_size, budget=self.text_token_budget):
                    g, tok = bb.forward_texts(x.to(bb.device), lengths, tokens=True)
                    g = F.normalize(g.float(), dim=-1).cpu()
                    tok = F.normalize(tok.float(), dim=-1).cpu()
                    new = []
                    for j, p in enumerate(pos):
                        n = int(lengths[j])
                        row = tuple(ids[p])
                        feat = TokenFeatures(row, tuple(bb.token_strings(row)), tok[j, :n].clone(), g[j].clone())
                        found[keys[missing[p]]] = feat
                        new.append((keys[missing[p]], feat))
                    self._features.put_many(new)
                    if isinstance(self.cache, EmbeddingCache):
                        self.cache.put_features((k, self._pack_tokens(f)) for k, f in new)
        index = dict(zip(uniq, (found[k] for k in keys)))
        return [index[t] for t in texts]

    def words_in_context(self, items: Sequence[tuple[str, str]]) -> list[torch.Tensor]:
        """F(prefix, word) for each ``(prefix, word)``: the mean of the normalised final-layer
        features of ``word``'s tokens when the text tower encodes ``f"{prefix} {word}"`` (``word``
        alone for an empty prefix); (token_dim,) float32 each, in input order.

        This is ABE-CLIP's phrase feature. On a causal tower the word's tokens see only the
        start token, the prefix and themselves, so texts are *packed*: one row holds the start
        token, then the prefixes as a token trie (a prefix's leading tokens shared with another
        prefix in the row are there once) with every word under its prefix, each token masked to
        see only the tokens of its own text before it, at the positions it has there, and no end
        token (nothing before it depends on it).
        The result is the text's own encoding, up to float summation order (≤ 1e-6), at a
        fraction of the tokens. Backbones without ``supports_packed_text``, and texts whose
        tokens are not prefix tokens + word tokens, or that would not fit the context, are
        encoded whole (:meth:`text_tokens`). Kept like :meth:`text_tokens`' features."""
        bb = self.backbone
        if not bb.has_token_features:
            raise CapscoreError(f"backbone {bb.spec} does not expose per-token text features")
        uniq = list(dict.fromkeys((p, w) for p, w in items))
        keys = [cache_key(bb.identity, "word-in-context", f"{p}\x1f{w}") for p, w in uniq]
        found = self._features.get_many(keys)
        if isinstance(self.cache, EmbeddingCache) and len(found) < len(keys):
            stored = {k: torch.from_numpy(v) for k, v in self.cache.get_features([k for k in keys if k not in found]).items()}
            found.update(stored)
            self._features.put_many(stored.items())
        missing = [i for i, k in enumerate(keys) if k not in found]
        if missing:
            new = self._words_in_context([uniq[i] for i in missing])
            new = [(keys[i], v) for i, v in zip(missing, new)]
            found.update(new)
            self._features.put_many(new)
            if isinstance(self.cache, EmbeddingCache):
                self.cache.put_features((k, v.numpy()) for k, v in new)
        key_of = dict(zip(uniq, keys))
        return [found[key_of[(p, w)]] for p, w in items]

    def _words_in_context(self, items: list[tuple[str, str]]) -> list[torch.Tensor]:
        bb = self.backbone
        memo: dict[str, list[int]] = {}

        def tokens(s: str) -> list[int]:  # without the start and end tokens
            if s not in memo:
                memo[s] = bb.tokenize([s])[0][1:-1]
            return memo[s]

        packed, whole = [], []
        sot = getattr(bb, "sot_id", None)
        for i, (p, w) in enumerate(items):
            pre, wt = (tokens(p) if p else []), tokens(w)
            ok = (bb.supports_packed_text and sot is not None and wt and len(pre) + len(wt) + 2 <= bb.context_length
                  and (not p or _PLAIN.fullmatch(p + w) or tokens(f"{p} {w}") == pre + wt))
            (packed if ok else whole).append((i, pre, wt))
        out: list[torch.Tensor | None] = [None] * len(items)
        if whole:
            texts = [f"{items[i][0]} {items[i][1]}" if items[i][0] else items[i][1] for i, _, _ in whole]
            for (i, _, wt), f in zip(whole, self.text_tokens(texts)):
                v = f.vectors  # the word's tokens end just before the end token
                out[i] = v[len(v) - 1 - len(wt) : len(v) - 1].mean(0)
        if packed:
            for i, v in self._packed_forward(packed, sot):
                out[i] = v
        return out

    packed_row_tokens = 64  # tokens per packed row (a row longer only for one prefix + word that needs it)

    def _packed_forward(self, items: list[tuple[int, list[int], list[int]]], sot: int):
        """Yield (index, F) for (index, prefix ids, word ids) items; see :meth:`words_in_context`.

        Each row is a token trie rooted at the start token: a prefix token is added once per row
        under the longest of its leading prefix tokens already there (so "red", "red small" and
        "red large" share "red"), a word's tokens hang under its whole prefix, and every token
        attends to itself and its ancestors only, at its depth as position. That is exactly the
        causal view each token has in its own text."""
        bb = self.backbone
        groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
        for i, pre, wt in items:
            groups.setdefault(tuple(pre), []).append((i, wt))
        rows: list[dict] = []

        def new_row():
            rows.append({"ids": [sot], "pos": [0], "parent": [-1], "nodes": {(): 0}, "out": []})
            return rows[-1]

        def add(row, token: int, parent: int) -> int:
            row["ids"].append(token)
            row["pos"].append(row["pos"][parent] + 1)
            row["parent"].append(parent)
            return len(row["ids"]) - 1

        row = new_row()
        for pre in sorted(groups):  # prefixes with the same leading tokens side by side
            for i, wt in groups[pre]:
                k = len(pre)
                while pre[:k] not in row["nodes"]:  # the longest leading part already in the row
                    k -= 1
                if len(row["ids"]) > 1 and len(row["ids"]) + len(pre) - k + len(wt) > self.packed_row_tokens:
                    row, k = new_row(), 0
                node = row["nodes"][pre[:k]]
                for j in range(k, len(pre)):
                    node = row["nodes"][pre[: j + 1]] = add(row, pre[j], node)
                start = len(row["ids"])
                for t in wt:
                    node = add(row, t, node)
                row["out"].append((i, start, len(row["ids"])))
        rows.sort(key=lambda r: len(r["ids"]))
        budget = self.text_token_budget
        s = 0
        with torch.inference_mode():
            while s < len(rows):
                e = s + 1
                while e < len(rows) and (e + 1 - s) * len(rows[e]["ids"]) <= budget:
                    e += 1
                batch, s = rows[s:e], e
                L = len(batch[-1]["ids"])
                ids = torch.full((len(batch), L), bb.pad_id, dtype=torch.long)
                pos = torch.zeros((len(batch), L), dtype=torch.long)
                allowed = np.zeros((len(batch), L, L), dtype=bool)
                allowed[:, np.arange(L), np.arange(L)] = True  # padding sees only itself
                for j, r in enumerate(batch):
                    n = len(r["ids"])
                    ids[j, :n], pos[j, :n] = torch.tensor(r["ids"]), torch.tensor(r["pos"])
                    sees = allowed[j]
                    for q, parent in enumerate(r["parent"]):  # ancestors come first: sees[parent] is final
                        if parent >= 0:
                            sees[q] |= sees[parent]
                allowed = torch.from_numpy(allowed)
                tok = F.normalize(bb.forward_packed_texts(ids, pos, allowed).float(), dim=-1).cpu()
                for j, r in enumerate(batch):
                    for i, a, b in r["out"]:
                        yield i, tok[j, a:b].mean(0).clone()

    @staticmethod
    def _pack_tokens(f: TokenFeatures) -> np.ndarray:
        """TokenFeatures -> one float32 row: [L, Dg, Dt, ids (L), global (Dg), vectors (L*Dt)]
        (token ids < 2^24 are exact in float32)."""
        L, dt = f.vectors.shape
        head = np.array([L, f.global_.numel(), dt, *f.ids], dtype=np.float32)
        return np.concatenate([head, f.global_.numpy().ravel(), f.vectors.numpy().ravel()])

    def _unpack_tokens(self, blob: np.ndarray) -> TokenFeatures:
        L, dg, dt = (int(x) for x in blob[:3])
        ids = tuple(int(x) for x in blob[3 : 3 + L])
        g = torch.from_numpy(blob[3 + L : 3 + L + dg].copy())
        v = torch.from_numpy(blob[3 + L + dg :].reshape(L, dt).copy())
        return TokenFeatures(ids, tuple(self.backbone.token_strings(ids)), v, g)

    # ---------------------------------------------------------------- images
    def _map(self, fn, items: list[tuple[int, object]], errors: dict[int, str] | None):
        """Apply ``fn(i, x)`` in worker threads; an InputError is raised, or recorded in
        ``errors`` (keyed by i) with None in its place."""

        def call(item):
            i, x = item
            try:
                return fn(i, x)
            except InputError as e:
                if errors is None:
                    raise
                errors[i] = str(e)
                return None

        if len(items) <= 1:
            return [call(it) for it in items]
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(call, items))

    def _decode(self, ref: ImageRef, payload):
        """RGB on decode, unless the backbone converts after resize + crop (``rgb_order="after-crop"``:
        the clipscore/pacscore order, which then sees the file's own mode)."""
        if self.backbone.rgb_order == "first":
            return ref.decode(payload)
        return ref.decode(payload, convert_rgb=False)

    def encode_images(self, images: Sequence, *, errors: dict[int, str] | None = None,
                      patches: bool = False) -> torch.Tensor:
        """Images (paths, PIL images or ImageRefs) -> (N, D) normalised float32 vectors.

        A missing, unreadable or truncated file raises :class:`InputError` naming
        it; if ``errors`` is a dict, the failure is recorded there (index ->
        message) instead and that row is NaN. With ``patches=True`` the images
        whose patch tokens are not in memory yet go through one forward that also
        yields them (kept for :meth:`image_patches`), so a metric that needs both
        (ABE-CLIP) encodes each image once.
        """
        bb = self.backbone
        refs = [ImageRef.of(x) for x in images]
        first_of: dict[str, int] = {}
        for i, r in enumerate(refs):
            first_of.setdefault(r.identity_hint(), i)
        failed: dict[int, str] | None = {} if errors is not None else None
        got = self._image_features(refs, list(first_of.values()), failed, patches=patches)
        out = torch.full((len(refs), bb.embed_dim), float("nan"))
        for i, r in enumerate(refs):
            u = first_of[r.identity_hint()]
            if u in got:
                g = got[u][0] if patches else got[u]
                out[i] = g if isinstance(g, torch.Tensor) else torch.from_numpy(g)
            else:
                errors[i] = failed[u]
        return out

    def _image_features(self, refs: list[ImageRef], uniq_idx: list[int], failed: dict[int, str] | None, *,
                        patches: bool) -> dict[int, object]:
        """index -> global vector (np), or with ``patches`` -> (global (D,), patches (P, D)) tensors.

        Reads and hashes in worker threads, consults the caches, then decodes and preprocesses only
        the misses (worker threads again) and encodes them in batches."""
        bb = self.backbone
        got: dict[int, object] = {}
        bar = self._bar(len(uniq_idx), "images")
        chunk = self.image_batch_size * 4
        for s in range(0, len(uniq_idx), chunk):
            idx = uniq_idx[s : s + chunk]
            # Hash the bytes first; decode only what the cache does not already hold.
            read = self._map(lambda i, ref: ref.read(), [(i, refs[i]) for i in idx], failed)
            ok = [(i, item) for i, item in zip(idx, read) if item is not None]
            keys = {i: cache_key(bb.identity, "image", item[0]) for i, item in ok}
            if patches:
                pkeys = {i: cache_key(bb.identity, "image-patches", item[0]) for i, item in ok}
                found = self._features.get_many(list(pkeys.values()))
                hit = lambda i: pkeys[i] in found  # noqa: E731
                value = lambda i: found[pkeys[i]]  # noqa: E731
            else:
                pkeys = None
                found = self.cache.get_many(list(keys.values()))
                hit = lambda i: keys[i] in found  # noqa: E731
                value = lambda i: found[keys[i]]  # noqa: E731
            misses, lead = [], {}
            for i, (_, payload) in ok:
                k = keys[i]
                if hit(i):
                    got[i] = value(i)
                    self.stats.images_cached += 1
                elif k in lead:  # same bytes under two names in this chunk: encode once
                    continue
                else:
                    lead[k] = i
                    misses.append((i, payload))
            # Decode + preprocess in worker threads (PIL and torchvision release the GIL).
            pixels = self._map(lambda i, payload: bb.preprocess(self._decode(refs[i], payload)), misses, failed)
            todo = [(i, px) for (i, _), px in zip(misses, pixels) if px is not None]
            vecs = self._forward_pixels([keys[i] for i, _ in todo], [px for _, px in todo],
                                        patch_keys=[pkeys[i] for i, _ in todo] if patches else None)
            got.update((i, v) for (i, _), v in zip(todo, vecs))
            for i, _ in ok:  # duplicates of an image encoded (or failed) just now
                if i not in got and lead.get(keys[i]) in got:
                    got[i] = got[lead[keys[i]]]
                elif i not in got and failed is not None and lead.get(keys[i]) in failed:
                    failed[i] = failed[lead[keys[i]]]
            if bar:
                bar.update(len(idx))
        if bar:
            bar.close()
        return got

    def encode_pixels(self, content_keys: Sequence[str], pixels: Sequence[torch.Tensor]) -> None:
        """Encode images decoded and preprocessed elsewhere into the cache; nothing is returned.

        ``content_keys`` are what :meth:`ImageRef.read` returns for each image
        (the SHA-256 of its bytes) and ``pixels`` its ``backbone.preprocess``
        output. Engines that decode in other processes (the Ray engine's CPU
        tasks) call this first; the :meth:`encode_images` that follows then
        finds every vector in the cache and decodes nothing, so the metric code
        and its error handling stay the ones of the single-process engine.
        """
        bb = self.backbone
        uniq = dict(zip((cache_key(bb.identity, "image", k) for k in content_keys), pixels))
        found = self.cache.get_many(list(uniq))
        todo = [(k, px) for k, px in uniq.items() if k not in found]
        self._forward_pixels([k for k, _ in todo], [px for _, px in todo])

    def _forward_pixels(self, keys: list[bytes], pixels: list[torch.Tensor], *,
                        patch_keys: list[bytes] | None = None) -> list:
        """Preprocessed images -> normalised vectors, batch by batch, each batch committed to the cache.

        With ``patch_keys`` the same forward also yields the patch tokens: each image's
        (global, patches) pair goes to the in-memory feature cache and is returned."""
        bb = self.backbone
        out: list = []
        with torch.inference_mode():
            for b in range(0, len(pixels), self.image_batch_size):
                px = torch.stack(list(pixels[b : b + self.image_batch_size]))
                g, p = bb.forward_images(px.to(bb.device, bb.dtype), patches=patch_keys is not None)
                g = F.normalize(g.float(), dim=-1).cpu()
                self.cache.put_many(zip(keys[b : b + len(px)], g.numpy()))
                if patch_keys is None:
                    out.extend(g.numpy())
                else:
                    p = F.normalize(p.float(), dim=-1).cpu()
                    pairs = [(g[j].clone(), p[j].clone()) for j in range(len(px))]
                    self._features.put_many(zip(patch_keys[b : b + len(px)], pairs))
                    out.extend(pairs)
                self.stats.images_encoded += len(px)
        return out

    def encode_videos(self, videos: Sequence, *, sampling=None,
                      errors: dict[int, str] | None = None) -> list[torch.Tensor | None]:
        """Videos (paths, frame folders, frame lists or :class:`~capscore.data.video.VideoRef`) ->
        one (F, D) tensor of normalised frame vectors per video, F = the sampled frames.

        A video is decoded and encoded once per call however many captions share it, and its
        frame matrix is cached under (backbone identity, hash of the video's bytes, sampling,
        time window), so a later run or another metric re-encodes nothing. Decoding and
        preprocessing run in worker threads; frames of several videos share image batches.
        A bad video raises :class:`InputError` naming it, or with ``errors`` is recorded there
        (index -> message) and its entry is None.
        """
        from capscore.data.video import DEFAULT_SAMPLING, Sampling, VideoRef

        bb = self.backbone
        sampling = DEFAULT_SAMPLING if sampling is None else Sampling.parse(sampling)
        refs = [VideoRef.of(v) for v in videos]
        first_of: dict[str, int] = {}
        for i, r in enumerate(refs):
            first_of.setdefault(r.identity_hint(), i)
        uniq = list(first_of.values())
        failed: dict[int, str] | None = {} if errors is not None else None
        got: dict[int, np.ndarray] = {}
        # videos decoded at a time: enough frames to fill image batches (~10 per clip), few enough to bound memory
        per_chunk = max(self.workers * 2, self.image_batch_size // 10)
        bar = self._bar(len(uniq), "videos")
        for s in range(0, len(uniq), per_chunk):
            idx = uniq[s : s + per_chunk]
            t0 = time.perf_counter()
            ckeys = self._map(lambda i, r: r.content_key(sampling), [(i, refs[i]) for i in idx], failed)
            keys = {i: cache_key(bb.identity, "video-frames", k) for i, k in zip(idx, ckeys) if k is not None}
            found = self.cache.get_many(list(dict.fromkeys(keys.values())))
            misses: list[int] = []
            lead: dict[bytes, int] = {}  # two paths with the same bytes: decode one
            for i, k in keys.items():
                if k in found:
                    got[i] = found[k].reshape(-1, bb.embed_dim)
                    self.stats.videos_cached += 1
                elif k in lead:
                    continue
                else:
                    lead[k] = i
                    misses.append(i)
            pixels = self._map(lambda i, r: torch.stack([bb.preprocess(im) for im in r.load(sampling)]),
                               [(i, refs[i]) for i in misses], failed)
            t1 = time.perf_counter()
            self.stats.decode_seconds += t1 - t0
            todo = [(i, px) for i, px in zip(misses, pixels) if px is not None]
            if todo:
                allpx = torch.cat([px for _, px in todo])
                vecs = []
                with torch.inference_mode():
                    for b in range(0, len(allpx), self.image_batch_size):
                        g, _ = bb.forward_images(allpx[b : b + self.image_batch_size].to(bb.device, bb.dtype))
                        vecs.append(F.normalize(g.float(), dim=-1).cpu())
                vecs = torch.cat(vecs).numpy()
                k0 = 0
                new = []
                for i, px in todo:
                    m = vecs[k0 : k0 + len(px)]
                    k0 += len(px)
                    got[i] = m
                    new.append((keys[i], m.reshape(-1)))
                    self.stats.frames_encoded += len(px)
                self.stats.videos_encoded += len(todo)
                self.cache.put_many(new)
            for i, k in keys.items():  # same bytes as a video decoded just now
                if i not in got and lead.get(k) in got:
                    got[i] = got[lead[k]]
                elif i not in got and lead.get(k) in (failed or {}):
                    failed[i] = failed[lead[k]]
            self.stats.encode_seconds += time.perf_counter() - t1
            if bar:
                bar.update(len(idx))
        if bar:
            bar.close()
        out: list[torch.Tensor | None] = []
        for i, r in enumerate(refs):
            u = first_of[r.identity_hint()]
            if u in got:
                out.append(torch.from_numpy(np.ascontiguousarray(got[u], dtype=np.float32)))
            else:
                errors[i] = failed[u]
                out.append(None)
        return out

    def image_patches(self, images: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
        """Images -> (global (N, D), patch tokens (N, P, D)), both normalised, in the joint space.

        One forward per image yields both; its global vector also goes to the persistent cache.
        Files are read and hashed first and only those not in memory are decoded (worker threads).
        """
        bb = self.backbone
        if not bb.has_patch_tokens:
            raise CapscoreError(
                f"backbone {bb.spec} does not expose patch tokens in the joint space "
                "(needs a ViT image tower with a projection, e.g. open_clip ViTs or HF CLIP)"
            )
        refs = [ImageRef.of(x) for x in images]
        first_of: dict[str, int] = {}
        for i, r in enumerate(refs):
            first_of.setdefault(r.identity_hint(), i)
        got = self._image_features(refs, list(first_of.values()), None, patches=True)
        if not refs:
            return torch.empty(0, bb.embed_dim), torch.empty(0, 0, bb.token_dim)
        rows = [got[first_of[r.identity_hint()]] for r in refs]
        return torch.stack([g for g, _ in rows]), torch.stack([p for _, p in rows])

    # ---------------------------------------------------------------- utils
    def _bar(self, total: int, what: str):
        if not self.progress or total == 0:
            return None
        from capscore._log import open_bar

        return open_bar(total, desc=f"encoding {what}", unit=what[:-1])


