"""Scores: the metric registry (:mod:`capscore.scores.metric`), each family's pure formulas, and the functional
core every face scores through (:mod:`capscore.scores.functional`: ``score_batch``, ``compute_values``).

Importing the package imports every family, each of which registers its rows (in this order, the order of
``metric_names``); none of them imports torch, so reading the registry's names does not.
"""
import capscore.scores.clipscore  # noqa: I001  (CLIP-S, RefCLIP-S, PAC-S, RefPAC-S, MCS; EMScore on videos)
import capscore.scores.abe_metric  # noqa: F401
import capscore.scores.specs  # noqa: F401  (SPECS)
from capscore.scores.clipscore import CLIPSCORE_PREFIX, GlobalCosine, clip_s, harmonic_mean, ref_clip_s, ref_similarity
from capscore.scores.metric import METRICS, EmbeddingBatch, Metric, get_metric, metric_names, registry

try:
    import capscore.scores.classic  # noqa: F401  (BLEU, METEOR, ROUGE-L, CIDEr-D, SPICE)
except ModuleNotFoundError as e:
    if e.name != "capscore.scores.classic":
        raise
import capscore.scores.learned  # noqa: F401, E402  (Polos, DENEB, FLEUR, RefFLEUR, EXPERT)

__all__ = ["METRICS", "EmbeddingBatch", "Metric", "get_metric", "metric_names", "registry",
           "CLIPSCORE_PREFIX", "GlobalCosine", "clip_s", "harmonic_mean", "ref_clip_s", "ref_similarity"]
