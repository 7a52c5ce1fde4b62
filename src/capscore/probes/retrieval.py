"""Image–text retrieval R@1/5/10 in both directions (SPECS Table 4; ABE-CLIP Table 2, sec. 4.2.2).

The standard zero-shot protocol of CLIP and the VSE line of work, on the Karpathy splits:

* the gallery is every test image and every test caption (Flickr30K: 1,000 images × 5 captions,
  MSCOCO: 5,000 images × 5 captions);
* image → text: an image query is a hit at K when **any** of its own captions is among the K
  captions most similar to it; text → image: a caption query is a hit at K when its image is among
  the K most similar images;
* R@K is the share of queries that hit, in % (as the papers print it). The median rank of the first
  true match is reported too.

Similarity is the cosine of the shared :class:`~capscore.embed.engine.Encoder`'s normalised global
embeddings (each unique image and caption encoded once, through the cache).

Choices the papers leave open, exposed as parameters and recorded in the result:

* ``captions_per_image`` (default 5). A few MSCOCO Karpathy test images carry 6 or 7 sentences
  (slightly more than 25,000 in all); the VSE++/SCAN protocol that the "5K test" numbers descend from keeps the first
  five of each image (25,000 captions). ``None`` keeps every caption (every extra caption is then one
  more text query and one more true match for its image). How many images had more (or fewer) and how
  many captions were dropped is recorded, never silent.
* Ties: a true match must score strictly higher than a wrong one to rank above it (a tie counts
  against the query), as everywhere in capscore's probes; with float cosines ties are rare.

Ranking by a pair scorer (ABE-CLIP Table 2, "ABE-CLIP" / "ABE-FG-CLIP" rows): ABE scores an
(image, text) pair from token and patch features, so it cannot rank a gallery with one matrix
product; scoring every pair is 5,000 × 25,000 for MSCOCO. ``run_retrieval(scorer=..., rerank_k=k)``
ranks in two stages (:func:`reranked_ranks`): the cosine picks each query's ``k`` most similar
gallery items, the scorer re-ranks those ``k``, and the rest follow in cosine order. So R@K for
K ≤ k is the scorer's ranking among the cosine's top k, and R@k itself equals the cosine's (the
same k candidates, reordered); a true match outside the top k keeps its cosine rank (> k).
``rerank_k=None`` is the exact mode: every gallery item is a candidate, i.e. the brute-force
ranking by the scorer over all I × T pairs (for small sets: scenes, a few hundred images).
The paper does not say how it ranked (exhaustively or re-ranking); it reports text→image only,
capscore reports both directions. Each distinct (image, text) pair is scored once.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from capscore.embed.engine import Encoder
from capscore.data.images import ImageRef
from capscore.errors import CapscoreError, InputError
from capscore.probes.run import ProbeResult

KS = (1, 5, 10)


# ============================================================================ pure metric
def retrieval_ranks(image_emb: torch.Tensor, text_emb: torch.Tensor, text_image: Sequence[int], *,
                    chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """1-based rank of the first true match: (per image, image→text), (per text, text→image).

    ``image_emb`` (I, D) and ``text_emb`` (T, D) are normalised; ``text_image[t]`` is the index of
    caption t's image. Rank = 1 + the number of *wrong* candidates scoring ≥ the best true one
    (ties count against the query). Queries are processed ``chunk`` at a time so MSCOCO's
    5,000 × 25,000 similarity table is never held at once.
    """
    owner = torch.as_tensor(np.asarray(text_image, dtype=np.int64))
    n_img, n_txt = image_emb.shape[0], text_emb.shape[0]
    if owner.numel() != n_txt:
        raise CapscoreError(f"text_image has {owner.numel()} entries for {n_txt} texts")
    img, txt = image_emb.double(), text_emb.double()
    i2t = np.zeros(n_img, dtype=np.int64)
    for s in range(0, n_img, chunk):
        sim = img[s : s + chunk] @ txt.T  # (q, T)
        true = owner[None, :] == torch.arange(s, s + sim.shape[0])[:, None]  # (q, T)
        best = torch.where(true, sim, torch.full_like(sim, -torch.inf)).max(dim=1).values  # (q,)
        wrong_ge = ((sim >= best[:, None]) & ~true).sum(dim=1)
        # an image without any caption has no true match: rank = beyond the gallery
        i2t[s : s + sim.shape[0]] = torch.where(torch.isfinite(best), wrong_ge + 1, n_txt + 1).numpy()
    t2i = np.zeros(n_txt, dtype=np.int64)
    for s in range(0, n_txt, chunk):
        sim = txt[s : s + chunk] @ img.T  # (q, I)
        own = owner[s : s + sim.shape[0]]
        pos = sim.gather(1, own[:, None])  # (q, 1)
        # the true image counts itself once (it is >= itself): that is the "1 +"; the rest are wrong images
        t2i[s : s + sim.shape[0]] = (sim >= pos).sum(dim=1).numpy()
    return i2t, t2i


def _topk(query: torch.Tensor, gallery: torch.Tensor, k: int, chunk: int) -> torch.Tensor:
    """(Q, k) indices of each query's k most similar gallery items by cosine, best first."""
    out = []
    for s in range(0, query.shape[0], chunk):
        out.append((query[s : s + chunk].double() @ gallery.double().T).topk(k, dim=1).indices)
    return torch.cat(out) if out else torch.zeros(0, k, dtype=torch.long)


def _candidate_ranks(cand_scores: torch.Tensor, true: torch.Tensor, fallback: np.ndarray) -> np.ndarray:
    """Rank of the best true candidate among the candidates (1 + wrong candidates scoring >= it);
    ``fallback`` (the first stage's rank) where no candidate is true."""
    best = torch.where(true, cand_scores, torch.full_like(cand_scores, -torch.inf)).max(dim=1).values
    wrong_ge = ((cand_scores >= best[:, None]) & ~true).sum(dim=1)
    has = true.any(dim=1)
    return np.where(has.numpy(), (wrong_ge + 1).numpy(), fallback).astype(np.int64)


def reranked_ranks(image_emb: torch.Tensor, text_emb: torch.Tensor, text_image: Sequence[int],
                   pair_scores: Callable[[np.ndarray, np.ndarray], np.ndarray], *, rerank_k: int | None,
                   chunk: int = 256) -> tuple[np.ndarray, np.ndarray, int]:
    """Ranks as :func:`retrieval_ranks`, with a second stage: ``pair_scores`` re-ranks each query's
    ``rerank_k`` cosine-nearest candidates (``None``: all of them, the exact ranking).

    ``pair_scores(image_idx, text_idx)`` -> one score per (image, text) pair (higher = better);
    it is called once, with every distinct candidate pair of both directions. Returns (image→text
    ranks, text→image ranks, number of pairs scored). A query whose true match is not among its
    candidates keeps its cosine rank, which is then > ``rerank_k``.
    """
    owner = torch.as_tensor(np.asarray(text_image, dtype=np.int64))
    n_img, n_txt = image_emb.shape[0], text_emb.shape[0]
    if rerank_k is not None and rerank_k < 1:
        raise CapscoreError(f"rerank_k must be a positive integer or None (exact); got {rerank_k}")
    cos_i2t, cos_t2i = retrieval_ranks(image_emb, text_emb, text_image, chunk=chunk)
    k_t = n_txt if rerank_k is None else min(rerank_k, n_txt)
    k_i = n_img if rerank_k is None else min(rerank_k, n_img)
    cand_i2t = _topk(image_emb, text_emb, k_t, chunk)  # (I, k_t) text indices
    cand_t2i = _topk(text_emb, image_emb, k_i, chunk)  # (T, k_i) image indices
    # every distinct candidate pair, as the key image * T + text (sorted): scored once
    key_i2t = (torch.arange(n_img)[:, None] * n_txt + cand_i2t).numpy()  # (I, k_t)
    key_t2i = (cand_t2i * n_txt + torch.arange(n_txt)[:, None]).numpy()  # (T, k_i)
    keys = np.unique(np.concatenate([key_i2t.reshape(-1), key_t2i.reshape(-1)]))
    values = np.asarray(pair_scores(keys // n_txt, keys % n_txt), dtype=np.float64)
    if values.shape != keys.shape:
        raise CapscoreError(f"pair_scores returned {values.shape} values for {keys.size} pairs")
    s_i2t = torch.from_numpy(values[np.searchsorted(keys, key_i2t)])  # (I, k_t)
    s_t2i = torch.from_numpy(values[np.searchsorted(keys, key_t2i)])  # (T, k_i)
    i2t = _candidate_ranks(s_i2t, owner[cand_i2t] == torch.arange(n_img)[:, None], cos_i2t)
    t2i = _candidate_ranks(s_t2i, cand_t2i == owner[:, None], cos_t2i)
    return i2t, t2i, int(keys.size)


def recall_at(ranks: np.ndarray, ks: Sequence[int] = KS) -> dict[str, float]:
    """{"R@K": % of queries whose first true match has rank ≤ K}, plus the median rank."""
    r = np.asarray(ranks)
    if r.size == 0:
        raise CapscoreError("retrieval needs at least one query")
    out = {f"R@{k}": 100.0 * float((r <= k).mean()) for k in ks}
    out["median_rank"] = float(np.median(r))
    return out


# ============================================================================ data
@dataclass(frozen=True)
class RetrievalSet:
    """Images, their captions (``text_image[t]`` = caption t's image) and how the set was built."""

    images: tuple[ImageRef, ...]
    names: tuple[str, ...]  # file names (or scene ids), for per-query rows
    texts: tuple[str, ...]
    text_image: tuple[int, ...]
    info: dict = field(default_factory=dict)  # dataset, split, counts, caption policy


def load_karpathy(path: str | Path, images: str | Path | None, *, split: str = "test",
                  captions_per_image: int | None = 5) -> RetrievalSet:
    """A Karpathy-split JSON (``dataset_flickr30k.json`` / ``dataset_coco.json``) -> one split.

    Layout: ``{"dataset": ..., "images": [{"split", "filename", ["filepath"], "sentences": [{"raw"}, ...]}]}``
    (COCO's ``filepath`` is ``val2014``/``train2014``; Flickr30K has none). An image is looked up as
    ``IMAGES/filepath/filename`` and then ``IMAGES/filename`` (a flattened folder); a missing one is an
    error naming its entry. ``captions_per_image``: see the module docstring.
    """
    path = Path(path).expanduser()
    if captions_per_image is not None and captions_per_image < 1:
        raise CapscoreError(f"captions_per_image must be a positive integer or None; got {captions_per_image}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(path), "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(path), f"cannot read file ({e})") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}", f"malformed JSON ({e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise InputError(str(path), "not a Karpathy-split file",
                         expected='{"images": [{"split", "filename", "sentences": [{"raw"}]}], "dataset"}')
    root = Path(images).expanduser() if images is not None else None
    if root is None:
        raise CapscoreError("retrieval needs --images (the folder the Karpathy 'filename'/'filepath' fields are under)")
    refs, names, texts, owner = [], [], [], []
    splits: dict[str, int] = {}
    more = fewer = dropped = 0
    for i, entry in enumerate(data["images"]):
        where = f"{path}: images[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("split"), str):
            raise InputError(where, "missing field 'split'", got=entry)
        splits[entry["split"]] = splits.get(entry["split"], 0) + 1
        if entry["split"] != split:
            continue
        fname = entry.get("filename")
        if not isinstance(fname, str) or not fname:
            raise InputError(where, "field 'filename' must be a non-empty string", got=fname)
        sents = entry.get("sentences")
        if not isinstance(sents, list) or not sents:
            raise InputError(f"{where} ({fname})", "field 'sentences' must be a non-empty list", got=sents)
        raws = []
        for j, s in enumerate(sents):
            raw = s.get("raw") if isinstance(s, dict) else None
            if not isinstance(raw, str) or not raw.strip():
                raise InputError(f"{where} ({fname})", f"sentences[{j}] has no 'raw' text", got=s)
            raws.append(raw.strip())
        if captions_per_image is not None:
            if len(raws) > captions_per_image:
                more += 1
                dropped += len(raws) - captions_per_image
                raws = raws[:captions_per_image]
            elif len(raws) < captions_per_image:
                fewer += 1
        sub = entry.get("filepath") or ""
        cands = [root / sub / fname, root / fname] if sub else [root / fname]
        found = next((c for c in cands if c.is_file()), None)
        if found is None:
            raise InputError(f"{where} ({fname})", f"image not found under {root}",
                             expected=" or ".join(str(c) for c in cands))
        k = len(refs)
        refs.append(ImageRef(path=found, name=f"{where}: image {fname}"))
        names.append(f"{sub}/{fname}" if sub else fname)
        texts += raws
        owner += [k] * len(raws)
    if not refs:
        raise InputError(str(path), f"no image in split {split!r}",
                         expected="one of " + ", ".join(f"{k} ({v})" for k, v in sorted(splits.items())))
    info = {"dataset": str(data.get("dataset", "")), "split": split, "n_images": len(refs), "n_texts": len(texts),
            "captions_per_image": "all" if captions_per_image is None else captions_per_image,
            "n_images_with_more_captions": more, "n_captions_dropped": dropped,
            "n_images_with_fewer_captions": fewer}
    return RetrievalSet(tuple(refs), tuple(names), tuple(texts), tuple(owner), info)


# ============================================================================ runner
RERANK_K = 20  # default candidates per query re-ranked by a pair scorer (> 10, so R@10 can move too)


def run_retrieval(encoder: Encoder, data: RetrievalSet, *, suite: str = "retrieval", source: str = "",
                  chunk: int = 256, seed: int = 0, scorer: Callable | None = None, scorer_name: str | None = None,
                  rerank_k: int | None = RERANK_K, pair_chunk: int = 2048):
    """Encode the gallery once and report R@1/5/10 (%) and the median rank in both directions.

    ``scorer=None``: ranked by cosine. A pair scorer (``get_pair_scorer("abe")``): ranked by it
    over each query's ``rerank_k`` cosine-nearest candidates, or over every pair with
    ``rerank_k=None`` (see the module docstring); pairs are scored ``pair_chunk`` at a time.
    Per-query rows: ``direction`` (``image->text`` / ``text->image``), the query, its true match(es)
    and the rank of the first true match (and, re-ranked, the cosine rank beside it).
    """
    img = encoder.encode_images(list(data.images))
    txt = encoder.encode_texts(list(data.texts))
    params = dict(data.info)
    if scorer is None:
        i2t, t2i = retrieval_ranks(img, txt, data.text_image, chunk=chunk)
        cos_i2t = cos_t2i = None
        name = "cosine"
    else:
        images, texts = list(data.images), list(data.texts)

        def pair_scores(ii: np.ndarray, tt: np.ndarray) -> np.ndarray:
            out = []
            for s in range(0, len(ii), pair_chunk):
                a, b = ii[s : s + pair_chunk], tt[s : s + pair_chunk]
                v = scorer(encoder, [images[i] for i in a], [texts[t] for t in b])
                out.append(v.detach().cpu().double().numpy() if hasattr(v, "detach") else np.asarray(v, float))
            return np.concatenate(out) if out else np.zeros(0)

        i2t, t2i, n_pairs = reranked_ranks(img, txt, data.text_image, pair_scores, rerank_k=rerank_k, chunk=chunk)
        cos_i2t, cos_t2i = retrieval_ranks(img, txt, data.text_image, chunk=chunk)
        name = scorer_name or getattr(scorer, "name", "custom")
        params.update(first_stage="cosine", rerank_k="all" if rerank_k is None else rerank_k,
                      n_pairs_scored=n_pairs)
    rows = [{"direction": "image->text", "query": name_, "rank": int(r)} for name_, r in zip(data.names, i2t)]
    rows += [{"direction": "text->image", "query": t, "image": data.names[o], "rank": int(r)}
             for t, o, r in zip(data.texts, data.text_image, t2i)]
    if cos_i2t is not None:
        for row, c in zip(rows, np.concatenate([cos_i2t, cos_t2i])):
            row["cosine_rank"] = int(c)
    summary = [{"direction": "image->text", "n_queries": len(i2t), "n_gallery": len(data.texts), "unit": "%",
                **recall_at(i2t)},
               {"direction": "text->image", "n_queries": len(t2i), "n_gallery": len(data.images), "unit": "%",
                **recall_at(t2i)}]
    if scorer is not None:
        for s_ in summary:
            s_["rerank_k"] = params["rerank_k"]
    bb = encoder.backbone
    return ProbeResult(suite, bb.spec, bb.identity, name, params, seed, source, tuple(rows), tuple(summary))
