"""ABE-CLIP's row in the metric registry (the method itself: :mod:`capscore.scores.abe`).

ABE-CLIP (Sec. 3, eqs. 1–12) needs patch tokens, text tokens and a parser
(spaCy) besides the global vectors. It scores captions as written (no prefix;
docs/abe.md) and its formula options (``k``, ``p``, ``omega``, ``pool``,
``ablation``) come from the batch's options, so every face passes them the same way.
"""
from __future__ import annotations

import math

from capscore.scores.metric import EmbeddingBatch, Metric, Values, register


class AbeFormula:
    """S_final of ABE-CLIP (eq. 12) per (image, caption) pair."""

    needs = frozenset({"global", "patches", "tokens", "parse"})
    columns: tuple[str, ...] = ()

    def compute(self, batch: EmbeddingBatch) -> Values:
        from capscore.scores.abe import make_abe_scorer  # noqa: PLC0415  (deferred: numpy, torch)

        scorer = make_abe_scorer(**dict(batch.options.get("abe") or {}))
        values = scorer(batch.encoder, [r.image for r in batch.records], batch.captions)
        return Values([float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)])


register(Metric("abe", "Zhang, Chen, Deng & Shen, ABE-CLIP: Training-Free Attribute Binding Enhancement, "
                "arXiv:2512.17178 (2025)",
                image=AbeFormula(), prefix="", range=(-math.inf, math.inf),
                note="token-patch alignment with semantic refinement; options k, p, omega, pool"))
