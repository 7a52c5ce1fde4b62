"""Backbones: one interface for every CLIP-style dual encoder (see ``base.Backbone``).

Names are resolved lazily (PEP 562): ``from capscore.backbones import load_backbone``
imports the registry only, not torch, so a command can check its arguments and
input files before paying for the deep-learning imports.
"""
from __future__ import annotations

import importlib

_WHERE = {"Backbone": "base", "ADAPTERS": "registry", "BUNDLED": "registry", "load_backbone": "registry",
          "parse_model_spec": "registry"}

__all__ = ["Backbone", "ADAPTERS", "BUNDLED", "load_backbone", "parse_model_spec"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"capscore.backbones.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'capscore.backbones' has no attribute {name!r}")
