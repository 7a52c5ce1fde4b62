"""Text perturbations: PR-MCS word-level perturbations and LGIP paraphrases/flips."""
from capscore.perturb.lgip import COLORS, COUNTS, OBJECTS, TEMPLATES, Flip, Variants, flips, lgip_variants, paraphrases
from capscore.perturb.prmcs import PERTURBATIONS, Perturbed, perturb, perturb_all, sub_in_sent
from capscore.perturb.words import Words, split_words

__all__ = [
    "COLORS", "COUNTS", "OBJECTS", "TEMPLATES", "Flip", "Variants", "flips", "lgip_variants", "paraphrases",
    "PERTURBATIONS", "Perturbed", "perturb", "perturb_all", "sub_in_sent", "Words", "split_words",
]
