"""Scores: the metric registry (:mod:`capscore.scores.metric`), each family's pure formulas, and the functional
core every face scores through (:mod:`capscore.scores.functional`: ``score_batch``, ``compute_values``).

Names are resolved lazily (PEP 562), so reading the registry's names does not import torch.
"""
from capscore.scores.metric import METRICS, EmbeddingBatch, Metric, get_metric, metric_names, registry

_FORMULAS = ("CLIPSCORE_PREFIX", "GlobalCosine", "clip_s", "harmonic_mean", "ref_clip_s", "ref_similarity")


def __getattr__(name: str):
    if name in _FORMULAS:
        from capscore.scores import clipscore

        return getattr(clipscore, name)
    raise AttributeError(f"module 'capscore.scores' has no attribute {name!r}")


registry()  # every family's rows

__all__ = ["METRICS", "EmbeddingBatch", "Metric", "get_metric", "metric_names", "registry", *_FORMULAS]
