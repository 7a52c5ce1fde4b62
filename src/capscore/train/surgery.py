"""Model surgery before training: LongCLIP stretching, freezing by name, OpenAI-layout export.

Stretching follows Long-CLIP (Zhang et al., ECCV 2024, section 3.1) through the core's
:func:`capscore.backbones.longclip.stretch_positional_embedding`; this module only
installs the stretched table in a live open_clip text tower and keeps its first
``keep`` rows frozen during training (a gradient hook zeroes their gradient and the
trainer never applies weight decay to positional embeddings, so AdamW leaves them
bit-identical — the effect of LongCLIP's separate frozen ``positional_embedding`` /
trainable ``positional_embedding_res`` pair).
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from capscore.backbones.base import Backbone
from capscore.backbones.longclip import KEEP, RATIO, resize_text_positions, split_long_positional, stretched_length
from capscore.errors import CapscoreError

# Parameter-name patterns of each tower of an open_clip CLIP (OpenAI key names).
TOWERS: dict[str, list[str]] = {
    "image": ["visual.*"],
    "text": ["token_embedding.*", "positional_embedding", "transformer.*", "ln_final.*", "text_projection*", "text.*"],
}


def _text_tower(backbone: Backbone) -> torch.nn.Module:
    text = backbone.model  # classic CLIP: the text tower's parameters live on the model itself
    if not hasattr(text, "positional_embedding") or getattr(text, "attn_mask", None) is None:
        raise CapscoreError(f"cannot stretch {backbone.spec}: needs an OpenAI-style CLIP with a causal text tower")
    return text


def stretch_text_tower(backbone: Backbone, *, keep: int = KEEP, ratio: int = RATIO) -> Backbone:
    """Stretch the text tower's positions in place: (n, W) -> (keep + (n − keep)·ratio, W), 77 -> 248.

    Rows < ``keep`` are frozen (gradient hook); rows >= ``keep`` train. The stretched
    table before training is kept (non-persistent buffer ``positional_embedding_init``)
    so the export can write LongCLIP's two-table layout.
    """
    text = _text_tower(backbone)
    if getattr(text, "_capscore_keep", None) is not None:
        raise CapscoreError(f"{backbone.spec} is already stretched")
    n = stretched_length(text.positional_embedding.shape[0], keep=keep, ratio=ratio)
    resize_text_positions(text, n, keep=keep, ratio=ratio)  # stretched table + causal mask for n positions
    text.positional_embedding.requires_grad_(True)
    text.register_buffer("positional_embedding_init", text.positional_embedding.detach().clone(), persistent=False)
    text.context_length = n
    text._capscore_keep = keep

    def zero_frozen_rows(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad[:keep] = 0
        return grad

    text.positional_embedding.register_hook(zero_frozen_rows)
    backbone.context_length = n
    if hasattr(backbone, "tokenizer") and hasattr(backbone.tokenizer, "context_length"):
        backbone.tokenizer.context_length = n
    backbone.invalidate_identity()
    return backbone


def freeze(model: torch.nn.Module, patterns: list[str]) -> list[str]:
    """Set ``requires_grad=False`` on parameters whose name matches any glob in ``patterns``.

    Returns the frozen names; a pattern that matches nothing is a user error.
    """
    names = [n for n, _ in model.named_parameters()]
    frozen = []
    for pat in patterns:
        hit = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hit:
            raise CapscoreError(f"freeze pattern {pat!r} matches no parameter (e.g. {names[0]!r}, {names[-1]!r})")
        frozen += hit
    params = dict(model.named_parameters())
    for n in frozen:
        params[n].requires_grad_(False)
    return sorted(set(frozen))


def freeze_tower(backbone: Backbone, tower: str) -> list[str]:
    """Freeze the ``image`` or ``text`` tower of an open_clip CLIP."""
    if tower not in TOWERS:
        raise CapscoreError(f"unknown tower {tower!r}; expected 'image' or 'text'")
    names = [n for n, _ in backbone.model.named_parameters()]
    pats = [p for p in TOWERS[tower] if any(fnmatch.fnmatchcase(n, p) for n in names)]
    return freeze(backbone.model, pats)


def export_openai(backbone: Backbone, path: str | Path, *, metadata: dict | None = None) -> Path:
    """Write the weights in the OpenAI state-dict layout (open_clip's CLIP uses the same keys)
    as safetensors; a stretched tower is written in LongCLIP's layout
    (``positional_embedding`` = the stretched table before training, read for rows < keep;
    ``positional_embedding_res`` = the trained one, read for rows >= keep), which
    :func:`capscore.backbones.longclip.merge_long_positional` folds back on load.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = backbone.model
    sd = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    if getattr(model, "_capscore_keep", None) is not None:
        sd = split_long_positional(sd, model.positional_embedding_init.detach().float().cpu())
    meta = {"format": "openai", "source": "capscore.train"}
    if metadata:
        meta["capscore"] = json.dumps(metadata, sort_keys=True)
    save_file(sd, str(path), metadata=meta)
    return path
