"""Backbones: one interface for every CLIP-style dual encoder (see ``base.Backbone``)."""
from capscore.backbones.base import Backbone
from capscore.backbones.registry import ADAPTERS, BUNDLED, load_backbone, parse_model_spec

__all__ = ["Backbone", "ADAPTERS", "BUNDLED", "load_backbone", "parse_model_spec"]
