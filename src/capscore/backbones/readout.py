"""A second-order global read-out for capscore's own small architectures (``scenes-tiny-v4``).

CLIP's global embedding is one token (the image's class token, the text's end-of-text token) times a
linear projection, compared by cosine. In capscore's scenes-tiny v3 that embedding does not *bind*: it
tells "a red star and a blue circle" from "a blue star and a red circle" at chance
(docs/research/scenes-training.md, "Perception or binding"), although the tokens hold the binding
(probes find it) and word tokens are aligned with patch tokens (the FILIP term). Any embedding that is a
sum over objects of per-object features has this blindness: the sums of {red, star, blue, circle} are
the same for both captions.

The **second-order** read-out makes the global embedding the flattened mean outer product of the
L2-normalised joint-space tokens (bilinear pooling; Lin, RoyChowdhury and Maji, ICCV 2015, "Bilinear
CNN Models for Fine-grained Visual Recognition"),

    g_image = vec( (1/P) Σ_p p̂_p p̂_pᵀ )   over the P patch tokens (the class token is not one of them),
    g_text  = vec( (1/W) Σ_w t̂_w t̂_wᵀ )   over the W word tokens (start- and end-of-text dropped, as
                                          ABE-CLIP drops them; a caption with no word token: all zeros),

D² numbers for tokens of width D, and no parameter of its own. Its cosine is
``Σ_{p,w} (p̂_p·t̂_w)² / (‖G_image‖ ‖G_text‖)``: every patch–word pair counts through the square of its
similarity, so "red" must sit on the same tokens as "star" for both to match one patch, and the
outer product of a token with itself carries the conjunction. This is this library's choice for its own
test-bed model, not one of the five papers' methods; CLIPScore, PAC-S and the rest then score with it
unchanged (w·max(cos, 0) of two global vectors).

What changes for a user: ``embed_dim`` (the global vectors' width) is D², and ``token_dim`` (patch and
word tokens, the joint space of ABE-CLIP and ``capscore explain``) stays D. A global vector and a token
no longer share a space, so EMScore's frame–word matching (which compares frame *globals* with word
tokens) refuses such a backbone with one line.

With this read-out, a short continuation of the v3 model's training makes its global cosine tell
attribute swaps apart, which the same continuation with CLIP's read-out does not (the measurements:
docs/research/scenes-training.md, "Second-order pooling binds").

open_clip's JSON configs cannot express a read-out, so architectures that have this one are listed in
:data:`GLOBAL_READOUTS` (open_clip name -> read-out); every place capscore builds an open_clip model
(``openclip:NAME`` random init, ``ckpt:PATH#arch=NAME``, the bundled model, whose file names its
architecture) looks the name up. The weights alone cannot say which read-out they were trained with
(they are the class-token architecture's), so a ``ckpt:`` file without ``#arch=`` takes the read-out
capscore recorded when it saved the file (safetensors metadata ``capscore.readout``, written by
:func:`capscore.backbones.openai_ckpt.save_openai_checkpoint`, hence by every ``capscore train`` export;
or the architecture ``arch`` of a bundled-format file, such as a ``scenes-tiny`` run's
``scenes-tiny.safetensors``) and otherwise CLIP's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

READOUTS = ("class", "second-order")
GLOBAL_READOUTS: dict[str, str] = {"scenes-tiny-v4": "second-order"}


def readout_of(arch: str | None) -> str:
    """The global read-out of an open_clip architecture name: "second-order" or CLIP's "class"."""
    return GLOBAL_READOUTS.get(arch or "", "class")


def second_order_pool(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T, D) tokens and a (B, T) 0/1 mask -> (B, D·D): ``vec(mean over masked t of t̂ t̂ᵀ)``, t̂ = t/‖t‖.

    Rows with an empty mask give zeros (their cosine with anything is then 0 after the engine's
    normalisation guard)."""
    t = F.normalize(tokens, dim=-1) * mask[..., None].to(tokens.dtype)
    g = torch.einsum("bti,btj->bij", t, t) / mask.sum(1).clamp(min=1).to(tokens.dtype)[:, None, None]
    return g.flatten(1)


def word_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B,) true lengths (start and end of text included) -> (B, width) mask of positions 1 .. length-2."""
    pos = torch.arange(width, device=lengths.device)[None]
    return (pos >= 1) & (pos < lengths[:, None] - 1)
