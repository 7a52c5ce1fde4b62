"""Synthetic scenes with exact ground truth (see ``docs/scenes.md``).

Public API (stable):
    generate_scenes(n, *, seed, split="train"|"heldout"|"all", size=64, ...) -> list[Scene]
    render_size(backbone_or_encoder) -> int   the model's input side: render scenes at it
    Scene: id, graph, render(), frames(n), short_caption(lang), detail_units(lang), long_caption(lang),
           captions(lang), paraphrases(lang), translations(), flawed(kind, rng), oracle(caption), graded(rng)
    ERROR_KINDS, applicable_errors(scene), make_flaw(scene, kind, rng), oracle(scene, caption), truth(scene)
    Caption, Flaw, OracleScore, heldout_pairs(seed), LANGUAGES
"""
from capscore.scenes.captions import (
    ERROR_KINDS, Caption, Flaw, OracleScore, applicable_errors, caption_set, graded, make_flaw, oracle, truth,
)
from capscore.scenes.claims import Mention, Motion, Relation, Total, Unit, Where
from capscore.scenes.graph import Clip, Group, Scene, SceneGraph, SceneObject, generate_scenes, render_objects
from capscore.scenes.lexicon import LANGUAGES
from capscore.scenes.vocab import COLOR_NAMES, COLORS, PATTERNS, RELATIONS, SHAPES, SIZES, heldout_pairs


def render_size(model=None, default: int = 64) -> int:
    """The side (px) to render scenes at for a backbone or an encoder: its image tower's input size,
    so a model sees scenes drawn at the resolution it takes (scenes-tiny 96, scenes-tiny-v1 64,
    a ViT-B/32 224) instead of 64-px drawings upsampled by its preprocessing; ``default`` when the
    model does not say (or no model is given)."""
    bb = getattr(model, "backbone", model)
    size = getattr(bb, "image_size", None) if bb is not None else None
    return int(size) if size else default


__all__ = [
    "render_size", "generate_scenes", "Scene", "SceneGraph", "SceneObject", "Group", "Clip",
    "Caption", "Flaw", "OracleScore", "ERROR_KINDS", "applicable_errors", "make_flaw", "oracle", "truth",
    "caption_set", "graded", "Mention", "Relation", "Total", "Where", "Motion", "Unit",
    "LANGUAGES", "SHAPES", "COLORS", "COLOR_NAMES", "SIZES", "PATTERNS", "RELATIONS", "heldout_pairs",
    "render_objects",
]
