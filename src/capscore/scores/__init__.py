"""Scores: pure functions on embeddings, plus the dataset scorer that drives the encoder."""
from capscore.scores.clipscore import (
    CLIPSCORE_PREFIX,
    METRICS,
    MetricSpec,
    clip_s,
    get_metric,
    harmonic_mean,
    ref_clip_s,
    ref_similarity,
)

__all__ = [
    "CLIPSCORE_PREFIX", "METRICS", "MetricSpec", "clip_s", "get_metric", "harmonic_mean",
    "ref_clip_s", "ref_similarity",
]
