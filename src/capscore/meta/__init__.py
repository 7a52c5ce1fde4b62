"""Meta-evaluation: human-judgment datasets, agreement statistics, ``capscore correlate``.

* :mod:`capscore.meta.datasets` — loaders for the published formats (Flickr8k, Composite,
  Pascal-50S, FOIL, Polaris, Nebula, LongCap-Arena, DeCapBench/M-CapEval1k-style JSONL, generic)
  and the registry :data:`~capscore.meta.datasets.DATASETS`;
* :mod:`capscore.meta.stats` — Kendall τ-b/τ-c, Pearson, Spearman, 1 − R², sample-wise τ,
  pairwise accuracy, system-level correlation, seeded bootstrap intervals (all scipy);
* :mod:`capscore.meta.evaluate` — score a dataset with a metric + backbone and correlate;
* :mod:`capscore.meta.oracle` — the synthetic-scenes oracle (ground-truth F1 as the human score).
"""

#: Most resamples a bootstrap or randomisation test takes (``compare --resamples``, ``correlate --bootstrap``):
#: 10 million resolve a p-value to 1e-7; draws are made in blocks, so memory stays bounded and time is what
#: grows with the count.
MAX_RESAMPLES = 10_000_000
