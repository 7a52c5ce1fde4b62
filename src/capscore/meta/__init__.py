"""Meta-evaluation: human-judgment datasets, agreement statistics, ``capscore correlate``.

* :mod:`capscore.meta.datasets` — loaders for the published formats (Flickr8k, Composite,
  Pascal-50S, FOIL, Polaris, Nebula, LongCap-Arena, DeCapBench/M-CapEval1k-style JSONL, generic)
  and the registry :data:`~capscore.meta.datasets.DATASETS`;
* :mod:`capscore.meta.stats` — Kendall τ-b/τ-c, Pearson, Spearman, 1 − R², sample-wise τ,
  pairwise accuracy, system-level correlation, seeded bootstrap intervals (all scipy);
* :mod:`capscore.meta.evaluate` — score a dataset with a metric + backbone and correlate;
* :mod:`capscore.meta.oracle` — the synthetic-scenes oracle (ground-truth F1 as the human score).
"""
