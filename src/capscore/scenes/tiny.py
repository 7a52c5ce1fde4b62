"""The bundled ``scenes-tiny`` model: a small CLIP trained on synthetic scenes (see ``MODEL_CARD.md``).

``load_backbone("scenes-tiny")`` lands here through ``capscore.backbones.registry.BUNDLED``. The
architecture is the open_clip config ``backbones/configs/scenes-tiny.json``; the weights are the fp16
safetensors file shipped in ``capscore/scenes/weights/``, cast to float32 on load (or the dtype asked for).
"""
from __future__ import annotations

from pathlib import Path

import torch

from capscore.errors import CapscoreError

ARCH = "scenes-tiny"
WEIGHTS = Path(__file__).parent / "weights" / "scenes-tiny.safetensors"


def backbone_from_file(path: str | Path, *, spec: str = ARCH, arch: str = ARCH):
    """Build the open_clip architecture ``arch`` (with its convolutional stem where it has one,
    :mod:`capscore.backbones.convstem`) and load an fp16/fp32 safetensors state dict into it (float32)."""
    import logging

    import open_clip
    from safetensors.torch import load_file

    from capscore.backbones.openclip import OpenClipBackbone, _seeded_create  # also registers capscore's configs

    path = Path(path)
    if not path.is_file():
        raise CapscoreError(f"{arch} weights not found at {path}; reinstall capscore or train them with "
                            f"`capscore train scenes-tiny --out DIR` (then DIR/scenes-tiny.safetensors)")
    logging.getLogger("root").setLevel(logging.ERROR)  # open_clip: 'No pretrained weights loaded' on root
    model, preprocess = _seeded_create(arch, pretrained=None, seed=0)  # the init is overwritten
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "text.attn_mask" and not k.endswith("attn_mask")]
    if missing or unexpected:
        raise CapscoreError(f"{path}: not a {arch} state dict (missing {missing[:3]}, unexpected "
                            f"{unexpected[:3]})")
    return OpenClipBackbone(model.float(), preprocess, open_clip.get_tokenizer(arch), spec=spec)


def load_scenes_tiny(*, spec: str = ARCH, device: str = "cpu", dtype: str = "fp32", seed: int = 0,
                     context_length: int | None = None, arch: str = ARCH, weights: Path = WEIGHTS):
    """The registry entry point. ``seed`` is ignored (trained weights); ``context_length`` must be 77 or None."""
    from capscore.backbones.base import resolve_dtype

    if context_length not in (None, 77):
        raise CapscoreError(f"{arch} has a 77-token context; got context_length={context_length}")
    return backbone_from_file(weights, spec=spec, arch=arch).to(device, resolve_dtype(dtype))
