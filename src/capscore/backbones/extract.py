"""Raw (unnormalised) CLIP vectors for metrics that feed them to a trained head (Polos, DENEB).

The encoding engine (:mod:`capscore.embed`) returns L2-normalised vectors, which is what every cosine
metric needs; Polos and DENEB take element-wise products and differences of the *raw* projections
(``encode_image`` / ``encode_text`` of the authors' CLIP, never normalised), so these helpers call a
:class:`~capscore.backbones.base.Backbone`'s own preprocessing, tokenizer and forward passes directly.
Inputs are deduplicated (images by content key, texts by string): each distinct image or text is
encoded once per call, in batches of similar length, and results come back in input order.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from capscore.backbones.base import Backbone
from capscore.data.images import ImageRef


@torch.inference_mode()
def raw_image_vectors(bb: Backbone, images: Sequence, *, batch_size: int = 64) -> torch.Tensor:
    """Images (paths, PIL images or ImageRefs) -> (N, D) float32 raw image projections, input order.

    Decoding follows the backbone's ``rgb_order`` (default: RGB on decode, then resize and crop — the
    order of the Polos and DENEB code, which open every image with ``.convert("RGB")``)."""
    refs = [ImageRef.of(x) for x in images]
    first: dict[str, int] = {}
    uniq: list = []
    slot = []
    for r in refs:
        hint = r.identity_hint()
        if hint not in first:
            first[hint] = len(uniq)
            uniq.append(r)
        slot.append(first[hint])
    out = torch.empty(len(uniq), bb.embed_dim)
    for s in range(0, len(uniq), batch_size):  # decoded a batch at a time: memory stays bounded
        part = [r.load(convert_rgb=bb.rgb_order == "first")[1] for r in uniq[s: s + batch_size]]
        pixels = torch.stack([bb.preprocess(im) for im in part])
        g, _ = bb.forward_images(pixels.to(bb.device))
        out[s: s + len(part)] = g.float().cpu()
    return out[torch.tensor(slot, dtype=torch.long)] if refs else out


@torch.inference_mode()
def raw_text_vectors(bb: Backbone, texts: Sequence[str], *, batch_size: int = 256) -> torch.Tensor:
    """Texts -> (N, D) float32 raw text projections, input order; truncated as the backbone truncates
    (OpenAI's and open_clip's ``tokenize(truncate=True)``: the first tokens and the end-of-text token)."""
    uniq = list(dict.fromkeys(texts))
    index = {t: i for i, t in enumerate(uniq)}
    ids = [bb.truncate(row) for row in bb.tokenize(uniq)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = torch.empty(len(uniq), bb.embed_dim)
    for s in range(0, len(order), batch_size):
        pos = order[s: s + batch_size]
        rows = [ids[i] for i in pos]
        width = max(len(r) for r in rows) if bb.pad_to_longest_exact else bb.context_length
        x = torch.full((len(rows), width), bb.pad_id, dtype=torch.long)
        for j, r in enumerate(rows):
            x[j, : len(r)] = torch.tensor(r, dtype=torch.long)
        g, _ = bb.forward_texts(x.to(bb.device), torch.tensor([len(r) for r in rows]))
        out[torch.tensor(pos)] = g.float().cpu()
    return out[torch.tensor([index[t] for t in texts], dtype=torch.long)] if texts else out


__all__ = ["raw_image_vectors", "raw_text_vectors"]
