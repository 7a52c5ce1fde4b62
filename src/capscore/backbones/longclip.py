"""LongCLIP position surgery (Zhang et al., Long-CLIP, ECCV 2024, section 3.1).

Knowledge-preserved stretching turns a 77-position text embedding into 248:
positions 0..19 are kept (they are well trained), positions 20..76 are
linearly interpolated with ratio 4 (each gap between neighbours gets 3 new
points), and because interpolation ends at position 76 the last 4 positions
are extrapolated from the final difference: 20 + 56·4 + 4 = 248 rows, as in
LongCLIP's ``load_from_clip`` (rows ``PE[76] + k·(PE[76] − PE[75])/4``, k = 0..3).

LongCLIP checkpoints store the first 20 rows in ``positional_embedding`` and
the trainable remainder in ``positional_embedding_res``; loading merges them as
``cat(pe[:20], pe_res[20:])``.
"""
from __future__ import annotations

import torch

from capscore.errors import CapscoreError

KEEP = 20
RATIO = 4


def stretch_positional_embedding(pe: torch.Tensor, *, keep: int = KEEP, ratio: int = RATIO) -> torch.Tensor:
    """(77, W) -> (keep + (77 - keep - 1)·ratio + ratio, W) = (248, W) for the defaults.

    Row ``keep + ratio·j + r`` (0 <= j < 77-keep-1, 0 <= r < ratio) is
    ``(1 - r/ratio)·pe[keep+j] + (r/ratio)·pe[keep+j+1]``; the last ``ratio`` rows
    continue the final step: ``pe[-1] + (r/ratio)·(pe[-1] - pe[-2])`` for r = 0..ratio-1.
    """
    n, _ = pe.shape
    if n <= keep + 1:
        raise ValueError(f"cannot stretch a {n}-position embedding keeping {keep}")
    head = pe[:keep]
    rows = []
    for j in range(keep, n - 1):
        a, b = pe[j], pe[j + 1]
        for r in range(ratio):
            t = r / ratio
            rows.append((1 - t) * a + t * b)
    last, prev = pe[-1], pe[-2]
    for r in range(ratio):
        rows.append(last + (r / ratio) * (last - prev))
    return torch.cat([head, torch.stack(rows)], dim=0)


def stretched_length(n: int = 77, *, keep: int = KEEP, ratio: int = RATIO) -> int:
    return keep + (n - keep) * ratio


def merge_long_positional(state_dict: dict) -> dict:
    """Fold LongCLIP's ``positional_embedding_res`` into ``positional_embedding`` (in a copy)."""
    if "positional_embedding_res" not in state_dict:
        return state_dict
    sd = dict(state_dict)
    pe, res = sd.pop("positional_embedding"), sd.pop("positional_embedding_res")
    sd["positional_embedding"] = torch.cat([pe[:KEEP], res[KEEP:]], dim=0)
    return sd


def split_long_positional(state_dict: dict, original: torch.Tensor | None = None) -> dict:
    """The inverse, for export in LongCLIP's layout: ``positional_embedding`` holds the
    frozen stretched table (only rows < 20 are read) and ``positional_embedding_res``
    the trained one (only rows >= 20 are read); LongCLIP selects rows with two masks."""
    sd = dict(state_dict)
    pe = sd.pop("positional_embedding")
    sd["positional_embedding"] = (original if original is not None else pe).clone()
    sd["positional_embedding_res"] = pe.clone()
    return sd


def resize_text_positions(text: torch.nn.Module, context_length: int, *, keep: int = KEEP, ratio: int = RATIO) -> None:
    """Give a causal CLIP text tower ``context_length`` positions, in place.

    ``context_length`` equal to LongCLIP's stretch of the current length (77 -> 248)
    applies :func:`stretch_positional_embedding`; a shorter one slices the table
    (exact for captions that fit, the mask is causal). Anything else is refused:
    plain interpolation (what open_clip's ``force_context_length`` does) is not
    LongCLIP's rule. The causal mask is rebuilt for the new length.
    """
    pe = text.positional_embedding
    n = pe.shape[0]
    if context_length == n:
        return
    with torch.no_grad():
        if context_length == stretched_length(n, keep=keep, ratio=ratio):
            new = stretch_positional_embedding(pe.detach(), keep=keep, ratio=ratio)
        elif 0 < context_length < n:
            new = pe.detach()[:context_length].clone()
        else:
            raise CapscoreError(
                f"context length {context_length} is not available for a {n}-position text tower; "
                f"use {n}, less, or {stretched_length(n, keep=keep, ratio=ratio)} (LongCLIP's knowledge-preserved stretch)"
            )
    text.positional_embedding = torch.nn.Parameter(new.to(pe.dtype), requires_grad=pe.requires_grad)
    mask = torch.full((context_length, context_length), float("-inf"), device=pe.device).triu_(1)
    text.register_buffer("attn_mask", mask, persistent=False)
    if hasattr(text, "context_length"):
        text.context_length = context_length
