"""A convolutional stem for a ViT image tower (Xiao et al., NeurIPS 2021, "Early Convolutions Help
Transformers See Better"), for capscore's own small architectures.

open_clip's ``VisionTransformer`` cuts the image into patches with one ``conv1`` (kernel = stride =
patch size). :class:`ConvStem` replaces that layer with a stack of 3×3 stride-2 convolutions, each
followed by a ReLU, and a final 1×1 convolution to the tower's width: it gives the same grid of
tokens (patch size = 2 ** number of stride-2 convolutions) to the same transformer, so patch tokens,
``capscore explain`` and ABE-CLIP work unchanged. Xiao et al. use BatchNorm after each 3×3 conv;
this stem has none, so an image's embedding never depends on the rest of its batch and train and
eval modes compute the same function.

Why capscore has it: trained only to classify the shape of single-object scenes, the patchify ViT
of ``scenes-tiny-v2`` learns shape far more slowly than the same tower with this stem (the early
convolutions Xiao et al. argue for; ``experiments/scenes_shape.py --supervised``, measurements in
docs/research/scenes-training.md).

open_clip's JSON configs cannot express a stem, so the architectures that have one are listed in
:data:`CONV_STEMS` (open_clip name -> channels of the 3×3 convolutions); every place capscore builds
an open_clip model (random init, ``ckpt:`` checkpoints, the bundled model) adds it, and
:func:`stem_from_state_dict` recognises it in a checkpoint (``visual.conv1.0.weight``).
"""
from __future__ import annotations

import torch

from capscore.errors import CapscoreError

CONV_STEMS: dict[str, tuple[int, ...]] = {"scenes-tiny-v3": (32, 64, 128),
                                          "scenes-tiny-v4": (32, 64, 128)}  # v3's towers, another read-out


class ConvStem(torch.nn.Sequential):
    """3×3 stride-2 conv + ReLU per entry of ``channels``, then a 1×1 conv to ``width`` (with bias)."""

    def __init__(self, width: int, channels: tuple[int, ...]):
        layers: list[torch.nn.Module] = []
        c_in = 3
        for c in channels:
            layers += [torch.nn.Conv2d(c_in, c, 3, stride=2, padding=1), torch.nn.ReLU()]
            c_in = c
        layers.append(torch.nn.Conv2d(c_in, width, 1))
        super().__init__(*layers)
        self.channels = tuple(channels)


def add_conv_stem(model: torch.nn.Module, channels: tuple[int, ...], *, where: str) -> torch.nn.Module:
    """Replace ``model.visual.conv1`` (a patchify conv) by a :class:`ConvStem` giving the same token grid.

    Draws the stem's init from the global torch RNG (callers seed it)."""
    visual = getattr(model, "visual", None)
    conv1 = getattr(visual, "conv1", None)
    if not isinstance(conv1, torch.nn.Conv2d):
        raise CapscoreError(f"{where}: a convolutional stem needs a ViT image tower with a patchify conv1")
    patch = conv1.kernel_size[0]
    if patch != 2 ** len(channels):
        raise CapscoreError(f"{where}: a stem of {len(channels)} stride-2 convolutions gives {2 ** len(channels)}-px "
                            f"patches, the tower has {patch}-px patches")
    visual.conv1 = ConvStem(conv1.out_channels, tuple(channels)).to(conv1.weight.dtype)
    return model


def stem_from_state_dict(sd: dict[str, torch.Tensor]) -> tuple[int, ...] | None:
    """The 3×3 channels of a checkpoint's convolutional stem, or None for a patchify tower."""
    if "visual.conv1.0.weight" not in sd:
        return None
    idx = sorted(int(k.split(".")[2]) for k in sd if k.startswith("visual.conv1.") and k.endswith(".weight"))
    return tuple(int(sd[f"visual.conv1.{i}.weight"].shape[0]) for i in idx[:-1])
