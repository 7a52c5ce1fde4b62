"""Synthetic scenes with exact ground truth (see ``docs/scenes.md``).

Public API (stable):
    generate_scenes(n, *, seed, split="train"|"heldout"|"all", size=64, ...) -> list[Scene]
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

__all__ = [
    "generate_scenes", "Scene", "SceneGraph", "SceneObject", "Group", "Clip",
    "Caption", "Flaw", "OracleScore", "ERROR_KINDS", "applicable_errors", "make_flaw", "oracle", "truth",
    "caption_set", "graded", "Mention", "Relation", "Total", "Where", "Motion", "Unit",
    "LANGUAGES", "SHAPES", "COLORS", "COLOR_NAMES", "SIZES", "PATTERNS", "RELATIONS", "heldout_pairs",
    "render_objects",
]
