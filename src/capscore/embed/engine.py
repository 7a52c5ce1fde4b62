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
  of a patch forward goes to the persistent cache like any other;
* ``raw=True`` gives the projections before normalisation, for metrics that feed
  them to a trained head (Polos, DENEB). They are cached under their own kinds
  (``image-raw``, ``text-raw``) by the same forward that gives the normalised
  vectors, whenever the encoder is asked for them or ``keep_raw`` is set: a
  cosine metric and a trained head on one backbone encode each input once.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from capscore._log import open_bar, warn
from capscore.backbones.base import Backbone
from capscore.backbones.sentence import SentenceFeatures
from capscore.embed.cache import EmbeddingCache, cache_key
from capscore.data.images import ImageRef
from capscore.errors import CapscoreError, InputError
from capscore.data.video import DEFAULT_SAMPLING, Sampling, VideoRef


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
        # also cache the raw projections of what is encoded (set by a run whose metrics read them, or by the
        # first raw=True request), so one forward serves normalised and raw readers alike
        self.keep_raw = False
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

    def encode_texts(self, texts: Sequence[str], *, raw: bool = False) -> torch.Tensor:
        """Texts -> (N, D) normalised float32 vectors, in input order (``raw=True``: the text projections
        before normalisation)."""
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InputError(f"text #{i}", "caption is not a string", got=t)
        bb = self.backbone
        self.keep_raw = self.keep_raw or raw
        uniq = list(dict.fromkeys(texts))
        keys = [cache_key(bb.identity, "text-raw" if raw else "text", t) for t in uniq]
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
                    g_raw = g.float().cpu()
                    g = F.normalize(g_raw, dim=-1).numpy()
                    done = [uniq[missing[p]] for p in pos]
                    rows = [(cache_key(bb.identity, "text", t), v) for t, v in zip(done, g)]
                    if self.keep_raw:
                        rows += [(cache_key(bb.identity, "text-raw", t), v) for t, v in zip(done, g_raw.numpy())]
                    self.cache.put_many(rows)  # one commit
                    got = g_raw.numpy() if raw else g
                    vecs.update((keys[missing[p]], got[j]) for j, p in enumerate(pos))
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

    def cached_features(self, kind: str, items: Sequence, compute, *, key=str) -> list[torch.Tensor]:
        """Features a metric derives from the towers itself (one tensor per item, in input order), kept
        like :meth:`text_tokens`' features: in memory and, with a persistent cache, in its bounded
        feature table under (backbone identity, ``kind``, ``key(item)``). ``compute(items) -> tensors``
        runs once, on the distinct items found in neither."""
        bb = self.backbone
        uniq = list(dict.fromkeys(items))
        keys = [cache_key(bb.identity, kind, key(x)) for x in uniq]
        found = self._features.get_many(keys)
        if isinstance(self.cache, EmbeddingCache) and len(found) < len(keys):
            stored = {k: torch.from_numpy(v) for k, v in self.cache.get_features([k for k in keys if k not in found]).items()}
            found.update(stored)
            self._features.put_many(stored.items())
        missing = [i for i, k in enumerate(keys) if k not in found]
        if missing:
            new = [(keys[i], v) for i, v in zip(missing, compute([uniq[i] for i in missing]))]
            found.update(new)
            self._features.put_many(new)
            if isinstance(self.cache, EmbeddingCache):
                self.cache.put_features((k, v.numpy()) for k, v in new)
        key_of = dict(zip(uniq, keys))
        return [found[key_of[x]] for x in items]

    def masked_text_tokens(self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """The text tower on token rows the caller lays out: ``ids`` (B, L), ``positions`` (B, L) each token's
        position, ``allowed`` (B, L, L) which keys each query attends to -> per-token features (B, L, token_dim),
        normalised float32 on the CPU. For backbones with ``supports_packed_text`` (causal towers), which
        lets a metric pack many short texts into one row (:mod:`capscore.scores.abe_phrases`)."""
        with torch.inference_mode():
            return F.normalize(self.backbone.forward_packed_texts(ids, positions, allowed).float(), dim=-1).cpu()

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
                      patches: bool = False, raw: bool = False) -> torch.Tensor:
        """Images (paths, PIL images or ImageRefs) -> (N, D) normalised float32 vectors.

        A missing, unreadable or truncated file raises :class:`InputError` naming
        it; if ``errors`` is a dict, the failure is recorded there (index ->
        message) instead and that row is NaN. With ``patches=True`` the images
        whose patch tokens are not in memory yet go through one forward that also
        yields them (kept for :meth:`image_patches`), so a metric that needs both
        (ABE-CLIP) encodes each image once. ``raw=True``: the image projections
        before normalisation (not with ``patches``).
        """
        bb = self.backbone
        if raw and patches:
            raise ValueError("encode_images: raw=True gives global projections only, not patches")
        self.keep_raw = self.keep_raw or raw
        refs = [ImageRef.of(x) for x in images]
        first_of = _first_of(refs)
        failed: dict[int, str] | None = {} if errors is not None else None
        got = self._image_features(refs, list(first_of.values()), failed, patches=patches, raw=raw)
        out = torch.full((len(refs), bb.embed_dim), float("nan"))
        for i, r in enumerate(refs):
            u = first_of[r.identity_hint()]
            if u in got:
                g = got[u][0] if patches else got[u]
                out[i] = g if isinstance(g, torch.Tensor) else torch.from_numpy(g)
            else:
                errors[i] = failed[u]
        return out

    def _encode_unique(self, refs: list, uniq: list[int], failed: dict[int, str] | None, *, kind: str, chunk: int,
                       read, lookup, encode, cached_stat: str, what: str) -> dict[int, object]:
        """index -> value for the inputs at ``uniq`` (one per identity): the bookkeeping images and videos share.

        Chunk by chunk: ``read(i, ref) -> (content key, payload)`` in worker threads; ``lookup(keys, content)``
        returns the cached values (``keys``: index -> cache key (backbone identity, ``kind``, content key));
        the misses are encoded with ``encode([(i, content key, payload)]) -> {i: value}`` once per distinct
        content (the same bytes under two names: one forward), and the others copy its value or its failure.
        An :class:`InputError` is raised, or with ``failed`` recorded there (index -> message)."""
        bb = self.backbone
        got: dict[int, object] = {}
        bar = self._bar(len(uniq), what)
        for s in range(0, len(uniq), chunk):
            idx = uniq[s : s + chunk]
            read_ = self._map(read, [(i, refs[i]) for i in idx], failed)
            ok = [(i, item) for i, item in zip(idx, read_) if item is not None]
            content = {i: item[0] for i, item in ok}
            keys = {i: cache_key(bb.identity, kind, c) for i, c in content.items()}
            hits = lookup(keys, content)
            misses, lead = [], {}
            for i, (c, payload) in ok:
                k = keys[i]
                if i in hits:
                    got[i] = hits[i]
                    setattr(self.stats, cached_stat, getattr(self.stats, cached_stat) + 1)
                elif k in lead:  # same bytes under two names in this chunk: encode once
                    continue
                else:
                    lead[k] = i
                    misses.append((i, c, payload))
            got.update(encode(misses))
            for i, _ in ok:  # duplicates of an input encoded (or failed) just now
                if i not in got and lead.get(keys[i]) in got:
                    got[i] = got[lead[keys[i]]]
                elif i not in got and failed is not None and lead.get(keys[i]) in failed:
                    failed[i] = failed[lead[keys[i]]]
            if bar:
                bar.update(len(idx))
        if bar:
            bar.close()
        return got

    def _image_features(self, refs: list[ImageRef], uniq_idx: list[int], failed: dict[int, str] | None, *,
                        patches: bool, raw: bool = False) -> dict[int, object]:
        """index -> global vector (np; ``raw``: before normalisation), or with ``patches`` -> (global (D,),
        patches (P, D)) tensors.

        Reads and hashes in worker threads, consults the caches (the patch tokens live in memory only),
        then decodes and preprocesses only the misses (worker threads again) and encodes them in batches."""
        bb = self.backbone

        def patch_key(content: str) -> bytes:
            return cache_key(bb.identity, "image-patches", content)

        def lookup(keys: dict, content: dict) -> dict:
            if patches:
                found = self._features.get_many([patch_key(c) for c in content.values()])
                return {i: found[patch_key(c)] for i, c in content.items() if patch_key(c) in found}
            found = self.cache.get_many(list(keys.values()))
            return {i: found[k] for i, k in keys.items() if k in found}

        def encode(misses: list) -> dict:
            # Decode + preprocess in worker threads (PIL and torchvision release the GIL).
            pixels = self._map(lambda i, payload: bb.preprocess(self._decode(refs[i], payload)),
                               [(i, payload) for i, _, payload in misses], failed)
            todo = [(i, c, px) for (i, c, _), px in zip(misses, pixels) if px is not None]
            vecs = self._forward_pixels([c for _, c, _ in todo], [px for _, _, px in todo], patches=patches,
                                        raw=raw)
            return {i: v for (i, _, _), v in zip(todo, vecs)}

        # Hash the bytes first; decode only what the cache does not already hold.
        return self._encode_unique(refs, uniq_idx, failed, kind="image-raw" if raw else "image",
                                   chunk=self.image_batch_size * 4,
                                   read=lambda i, ref: ref.read(), lookup=lookup, encode=encode,
                                   cached_stat="images_cached", what="images")

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
        kind = "image-raw" if self.keep_raw else "image"  # the raw one is what a later raw reader lacks
        uniq = dict(zip(content_keys, pixels))
        found = self.cache.get_many([cache_key(bb.identity, kind, c) for c in uniq])
        todo = [(c, px) for c, px in uniq.items() if cache_key(bb.identity, kind, c) not in found]
        self._forward_pixels([c for c, _ in todo], [px for _, px in todo])

    def _forward_pixels(self, contents: list[str], pixels: list[torch.Tensor], *, patches: bool = False,
                        raw: bool = False) -> list:
        """Preprocessed images (``contents``: their content keys) -> normalised vectors (``raw``: the
        projections before normalisation), batch by batch, each batch committed to the cache (the raw ones
        too when ``keep_raw``).

        With ``patches`` the same forward also yields the patch tokens: each image's (global, patches) pair
        goes to the in-memory feature cache and is returned."""
        bb = self.backbone
        out: list = []
        with torch.inference_mode():
            for b in range(0, len(pixels), self.image_batch_size):
                px = torch.stack(list(pixels[b : b + self.image_batch_size]))
                done = contents[b : b + len(px)]
                g, p = bb.forward_images(px.to(bb.device, bb.dtype), patches=patches)
                g_raw = g.float().cpu()
                g = F.normalize(g_raw, dim=-1)
                rows = [(cache_key(bb.identity, "image", c), v) for c, v in zip(done, g.numpy())]
                if self.keep_raw:
                    rows += [(cache_key(bb.identity, "image-raw", c), v) for c, v in zip(done, g_raw.numpy())]
                self.cache.put_many(rows)  # one commit
                if raw:
                    out.extend(g_raw.numpy())
                elif not patches:
                    out.extend(g.numpy())
                else:
                    p = F.normalize(p.float(), dim=-1).cpu()
                    pairs = [(g[j].clone(), p[j].clone()) for j in range(len(px))]
                    self._features.put_many([(cache_key(bb.identity, "image-patches", c), pair)
                                             for c, pair in zip(done, pairs)])
                    out.extend(pairs)
                self.stats.images_encoded += len(px)
        return out

    def encode_videos(self, videos: Sequence, *, sampling=None,
                      errors: dict[int, str] | None = None) -> list[torch.Tensor | None]:
        """Videos (paths, frame folders, frame lists or :class:`~capscore.data.video.VideoRef`) ->
        one (F, D) tensor of normalised frame vectors per video, F = the sampled frames.

        A video is decoded and encoded once per call however many captions share it, and its
        frame matrix is cached under (backbone identity, hash of the video's bytes, sampling,
        time window), so a later run or another metric re-encodes nothing (the bookkeeping of
        :meth:`encode_images`). Decoding and preprocessing run in worker threads; frames of
        several videos share image batches. A bad video raises :class:`InputError` naming it,
        or with ``errors`` is recorded there (index -> message) and its entry is None.
        """
        bb = self.backbone
        sampling = DEFAULT_SAMPLING if sampling is None else Sampling.parse(sampling)
        refs = [VideoRef.of(v) for v in videos]
        first_of = _first_of(refs)
        failed: dict[int, str] | None = {} if errors is not None else None

        def lookup(keys: dict, content: dict) -> dict:
            found = self.cache.get_many(list(dict.fromkeys(keys.values())))
            return {i: found[k].reshape(-1, bb.embed_dim) for i, k in keys.items() if k in found}

        def encode(misses: list) -> dict:
            t0 = time.perf_counter()
            pixels = self._map(lambda i, r: torch.stack([bb.preprocess(im) for im in r.load(sampling)]),
                               [(i, refs[i]) for i, _, _ in misses], failed)
            t1 = time.perf_counter()
            self.stats.decode_seconds += t1 - t0
            todo = [(i, c, px) for (i, c, _), px in zip(misses, pixels) if px is not None]
            got = {}
            if todo:
                allpx = torch.cat([px for _, _, px in todo])
                vecs = []
                with torch.inference_mode():
                    for b in range(0, len(allpx), self.image_batch_size):
                        g, _ = bb.forward_images(allpx[b : b + self.image_batch_size].to(bb.device, bb.dtype))
                        vecs.append(F.normalize(g.float(), dim=-1).cpu())
                vecs = torch.cat(vecs).numpy()
                k0 = 0
                new = []
                for i, c, px in todo:
                    got[i] = vecs[k0 : k0 + len(px)]
                    k0 += len(px)
                    new.append((cache_key(bb.identity, "video-frames", c), got[i].reshape(-1)))
                    self.stats.frames_encoded += len(px)
                self.stats.videos_encoded += len(todo)
                self.cache.put_many(new)
            self.stats.encode_seconds += time.perf_counter() - t1
            return got

        # videos decoded at a time: enough frames to fill image batches (~10 per clip), few enough to bound memory
        got = self._encode_unique(refs, list(first_of.values()), failed, kind="video-frames",
                                  chunk=max(self.workers * 2, self.image_batch_size // 10),
                                  read=lambda i, r: (r.content_key(sampling), None), lookup=lookup, encode=encode,
                                  cached_stat="videos_cached", what="videos")
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
        first_of = _first_of(refs)
        got = self._image_features(refs, list(first_of.values()), None, patches=True)
        if not refs:
            return torch.empty(0, bb.embed_dim), torch.empty(0, 0, bb.token_dim)
        rows = [got[first_of[r.identity_hint()]] for r in refs]
        return torch.stack([g for g, _ in rows]), torch.stack([p for _, p in rows])

    # ---------------------------------------------------------------- utils
    def _bar(self, total: int, what: str):
        if not self.progress or total == 0:
            return None

        return open_bar(total, desc=f"encoding {what}", unit=what[:-1])


class CachedSentences:
    """A sentence encoder's features through a cache: Polos's and DENEB's SimCSE-RoBERTa
    (:class:`~capscore.backbones.sentence.SentenceEncoder`), each distinct text once.

    With a persistent cache (:class:`EmbeddingCache`) the per-text features go to its bounded feature
    table under (encoder identity, ``sentence-features``, text): a later run, or the other metric of a run
    whose checkpoint carries the same encoder weights (Polos and DENEB both carry SimCSE's), encodes none
    of them again. The float64 sums are stored bit for bit. With an in-memory cache nothing is kept
    beyond the call (the features of one text are 40 KB for RoBERTa-base)."""

    KIND = "sentence-features"

    def __init__(self, sentence, cache=None):
        self.sentence = sentence
        self.cache = cache

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> SentenceFeatures:
        """Features of ``texts`` in input order (as :meth:`SentenceEncoder.encode`)."""
        if not isinstance(self.cache, EmbeddingCache):
            return self.sentence.encode(texts, batch_size=batch_size)
        uniq = list(dict.fromkeys(texts))
        keys = [cache_key(self.sentence.identity, self.KIND, t) for t in uniq]
        found = {k: _unpack_sentence(v) for k, v in self.cache.get_features(keys).items()}
        todo = [t for t, k in zip(uniq, keys) if k not in found]
        if todo:
            new = self.sentence.encode(todo, batch_size=batch_size)
            packed = [(cache_key(self.sentence.identity, self.KIND, t), _pack_sentence(new, j))
                      for j, t in enumerate(todo)]
            self.cache.put_features(packed)
            found.update((k, _unpack_sentence(v)) for k, v in packed)
        rows = [found[k] for k in keys]
        feats = SentenceFeatures(*(torch.stack([r[f] for r in rows]) for f in range(4))) if rows else \
            self.sentence.encode([], batch_size=batch_size)
        index = {t: i for i, t in enumerate(uniq)}
        return feats.select(torch.tensor([index[t] for t in texts], dtype=torch.long))


def _pack_sentence(f, j: int) -> np.ndarray:
    """Row ``j`` of SentenceFeatures as float32: L, D, first (L·D), then sums, sumsq, count as float64 bits."""
    first = f.first[j].numpy().astype(np.float32)
    wide = np.concatenate([f.sums[j].numpy(), f.sumsq[j].numpy(), f.counts[j: j + 1].numpy()]).astype(np.float64)
    return np.concatenate([np.array(first.shape, dtype=np.float32), first.ravel(), wide.view(np.float32)])


def _unpack_sentence(v: np.ndarray) -> tuple:
    L, D = int(v[0]), int(v[1])
    first = torch.from_numpy(v[2: 2 + L * D].reshape(L, D).copy())
    wide = torch.from_numpy(v[2 + L * D:].copy().view(np.float64))
    return first, wide[:L], wide[L: 2 * L], wide[2 * L]


def _first_of(refs: Sequence) -> dict[str, int]:
    """identity hint -> index of its first occurrence: an input named twice in one call is handled once."""
    first_of: dict[str, int] = {}
    for i, r in enumerate(refs):
        first_of.setdefault(r.identity_hint(), i)
    return first_of
