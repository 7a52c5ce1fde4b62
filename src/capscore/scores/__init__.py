"""Scores: the metric registry (:mod:`capscore.scores.metric`) and each family's pure formulas.

Names are resolved lazily (PEP 562), so reading the registry's names does not import torch.
"""
from capscore.scores.metric import METRICS, EmbeddingBatch, Metric, get_metric, metric_names, registry

_FORMULAS = ("CLIPSCORE_PREFIX", "MetricSpec", "clip_s", "harmonic_mean", "ref_clip_s", "ref_similarity")


def __getattr__(name: str):
    if name in _FORMULAS:
        from capscore.scores import clipscore

        return getattr(clipscore, name)
    raise AttributeError(f"module 'capscore.scores' has no attribute {name!r}")


registry()  # every family's rows

__all__ = ["METRICS", "EmbeddingBatch", "Metric", "get_metric", "metric_names", "registry", *_FORMULAS]
