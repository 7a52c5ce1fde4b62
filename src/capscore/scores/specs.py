"""The SPECS score (Chen, Salazar, Kementchedjhieva, 2025, "SPECS: Specificity-Enhanced CLIP-Score for
Long Image Caption Evaluation") — a pure formula and its registry row.

The paper calls SPECS "a version of CLIP-Score which builds on our specificity-enhanced LongCLIP model"
(§4.4) and prints no formula; the authors' code (github mbzuai-nlp/SPECS, the README's scoring snippet)
scores a caption as

    SPECS(c, v) = max((cos(c, v) + 1) / 2, 0)

on the LongCLIP-SPECS embeddings of the image and of the caption *as it is* (no prompt such as CLIPScore's
"A photo depicts "). The clamp never binds (cos >= -1); it is kept because it is the authors' formula.
Unlike CLIP-S, a negative cosine is not cut to 0: the score is an affine map of the cosine onto [0, 1],
so it ranks exactly as the cosine does, while its scale (what the unfitted 1 - R² of SPECS Table 2
depends on) is its own.

Which checkpoints are SPECS checkpoints. A SPECS checkpoint is a LongCLIP state dict (248 positions,
``positional_embedding_res``), loaded by the OpenAI-format adapter (``ckpt:PATH``); an original LongCLIP
state dict has the same layout, so the weights cannot tell them apart. capscore goes by the file name,
as it does for PAC-S (``pac`` in the name): a ``ckpt:`` or bare checkpoint path whose file name contains
``spec`` (the authors' released ``spec.pt``) or ``longclipdetails`` (what their training script writes)
is a SPECS checkpoint (:func:`is_specs_checkpoint`). ``capscore score`` without ``--metric`` then scores
with ``specs`` (:func:`capscore.pipeline.default_metric`); ``--metric clip-s`` (with its prefix) stays
available. ``--metric specs`` on other weights warns and still computes the formula.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING

from capscore.scores.metric import EmbeddingBatch, Metric, Values, register

if TYPE_CHECKING:  # torch is imported where the formula runs
    import torch

CITATION = "Chen, Salazar, Kementchedjhieva, SPECS, 2025 (score: the authors' README)"
#: File-name marks of a SPECS checkpoint: the authors' release (``spec.pt``) and their trainer's output.
CHECKPOINT_MARKS = ("spec", "longclipdetails")
_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def specs_score(image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """max((cos(image, text) + 1) / 2, 0) per row of normalised (N, D) embeddings."""
    return (((image * text).sum(-1) + 1.0) / 2.0).clamp(min=0.0)


def is_specs_checkpoint(spec: str) -> bool:
    """Whether a ``--model`` string names a SPECS checkpoint: an OpenAI-format checkpoint (``ckpt:PATH`` or a
    bare ``.pt/.pth/.bin/.safetensors`` path) whose file name contains one of :data:`CHECKPOINT_MARKS`."""
    if not isinstance(spec, str):
        return False
    path = spec[len("ckpt:"):] if spec.startswith("ckpt:") else spec
    path = path.split("#", 1)[0]  # ckpt:PATH#arch=...,quick_gelu=...
    if not (spec.startswith("ckpt:") or path.lower().endswith(_CHECKPOINT_SUFFIXES)):
        return False
    name = PurePath(path).name.lower()
    return any(mark in name for mark in CHECKPOINT_MARKS)


@dataclass(frozen=True)
class SpecsFormula:
    """The SPECS score on images as a registry formula (global vectors only, no extra columns)."""

    name: str = "specs"
    needs = frozenset({"global"})
    columns: tuple[str, ...] = ()

    def formula(self, image, text) -> torch.Tensor:
        return specs_score(image, text)

    def compute(self, batch: EmbeddingBatch) -> Values:
        return Values(specs_score(batch.images(), batch.texts()).tolist())


def _specs_weights(spec: str, family: str) -> str | None:
    if is_specs_checkpoint(spec):
        return None
    return (f"metric specs is the SPECS formula for LongCLIP-SPECS weights; {spec} does not look like a SPECS "
            f"checkpoint (no {' or '.join(repr(m) for m in CHECKPOINT_MARKS)} in its file name), so these are "
            "(cos + 1)/2 of other weights")


register(Metric("specs", CITATION, image=SpecsFormula(), prefix="", range=(0.0, 1.0),
                default_model="ckpt:PATH/spec.pt", weights_check=_specs_weights,
                note="max((cos(image, caption) + 1)/2, 0) with LongCLIP-SPECS weights (--model ckpt:PATH/spec.pt), "
                     "no prefix; the default for SPECS checkpoints"))
