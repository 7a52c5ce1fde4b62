"""Powered miniature replications (issue 11, part 3) — the skeleton: one experiment, the table format.

Each experiment is a function ``(model spec, seed, n, eval seed) -> {metric: per-item values}``; the
script runs it for every (model, seed), and the table gives, per metric and model, the mean over
seeds with two 95 % intervals:

* across seeds: Student-t over the per-seed means (``scipy.stats.t``; needs ≥ 2 seeds);
* across items: percentile bootstrap over evaluation items, resampled within each seed and
  averaged over seeds (``scipy.stats.bootstrap``, 2000 resamples, seeded).

Implemented experiments:

``flips``  correct-vs-flawed accuracy per error kind (colour, shape, count, attribute swap,
           relation, hallucination) of global CLIP-S on held-out scenes, seen combinations
           (:func:`capscore.scenes.evaluate.flip_items`: one flip per kind per scene).
           The model spec may contain ``{seed}``: ``runs/v2-s{seed}/model.safetensors`` evaluates
           one trained model per seed; without it, the seed only changes the evaluation scenes.

Not yet written (the issue's list; a later session adds them as rows of ``EXPERIMENTS``): ABE-CLIP
ablation and K sweep, SPECS stretch → SPECS vs equal-steps contrastive control, PR-MCS drops
before/after fine-tuning, PAC-S low-data regime, LGIP E_inv / E_sens / PR per flip type.

    python benchmarks/replicate.py --smoke --out /tmp/rep.md        # seconds: random tiny models
    python benchmarks/replicate.py --experiment flips --model scenes-tiny --seeds 0 1 2 --n 500 \\
        --out docs/replications.md
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import stats


def flips(spec: str, seed: int, n: int, eval_seed: int) -> dict[str, np.ndarray]:
    from capscore.backbones import load_backbone
    from capscore.embed.engine import Encoder, MemoryCache
    from capscore.scenes import generate_scenes
    from capscore.scenes.evaluate import flip_items

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random-init specs warn; the table names the spec
        bb = load_backbone(spec.format(seed=seed), seed=seed)
    enc = Encoder(bb, cache=MemoryCache())
    scenes = generate_scenes(n, seed=eval_seed + seed, split="train")
    items = flip_items(scenes, seed=eval_seed + seed)
    index = {s.id: i for i, s in enumerate(scenes)}
    img = enc.encode_images([s.render() for s in scenes])[[index[it["scene"]] for it in items]]
    good = enc.encode_texts([it["correct"] for it in items])
    bad = enc.encode_texts([it["flawed"] for it in items])
    wins = ((img * good).sum(1) > (img * bad).sum(1)).numpy().astype(float)  # ties count as failures
    kinds = np.array([it["kind"] for it in items])
    return {kind: wins[kinds == kind] for kind in dict.fromkeys(kinds)}


EXPERIMENTS = {"flips": flips}


def seed_interval(means: list[float]) -> tuple[float, float]:
    """95 % Student-t interval of the mean of per-seed values."""
    m = np.asarray(means, float)
    if len(m) < 2:
        return float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(m) - 1) * m.std(ddof=1) / np.sqrt(len(m))
    return float(m.mean() - half), float(m.mean() + half)


def item_interval(per_seed: list[np.ndarray], *, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval over items, each seed resampled separately, then averaged."""
    lows, highs = [], []
    for k, x in enumerate(per_seed):
        if len(x) < 2 or np.all(x == x[0]):
            lows.append(float(np.mean(x)))
            highs.append(float(np.mean(x)))
            continue
        ci = stats.bootstrap((x,), np.mean, n_resamples=2000, method="percentile",
                             random_state=np.random.default_rng([seed, k])).confidence_interval
        lows.append(float(ci.low))
        highs.append(float(ci.high))
    return float(np.mean(lows)), float(np.mean(highs))


def run(experiment: str, models: list[str], seeds: list[int], n: int, eval_seed: int) -> list[dict]:
    fn = EXPERIMENTS[experiment]
    rows = []
    for spec in models:
        t0 = time.perf_counter()
        per_seed = [fn(spec, s, n, eval_seed) for s in seeds]
        wall = time.perf_counter() - t0
        for metric in per_seed[0]:
            vals = [r.get(metric, np.array([])) for r in per_seed]
            means = [float(np.mean(v)) for v in vals if len(v)]
            rows.append({"experiment": experiment, "model": spec, "metric": metric, "seeds": len(means),
                         "items": int(sum(len(v) for v in vals)), "mean": float(np.mean(means)),
                         "ci_seeds": seed_interval(means), "ci_items": item_interval(vals), "wall_s": wall})
    return rows


def table(rows: list[dict], command: str) -> str:
    out = ["| experiment | model | metric | seeds | items | mean | 95 % CI (seeds) | 95 % CI (items) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cs, ci = r["ci_seeds"], r["ci_items"]
        out.append(f"| {r['experiment']} | `{r['model']}` | {r['metric']} | {r['seeds']} | {r['items']} | "
                   f"{r['mean']:.3f} | [{cs[0]:.3f}, {cs[1]:.3f}] | [{ci[0]:.3f}, {ci[1]:.3f}] |")
    walls = {r["model"]: r["wall_s"] for r in rows}
    out += ["", f"Command: `{command}`", "", "Wall time per model: "
            + ", ".join(f"`{m}` {w:.0f} s" for m, w in walls.items())]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiment", choices=sorted(EXPERIMENTS), default="flips")
    ap.add_argument("--model", nargs="+", default=["scenes-tiny"], help="model specs; '{seed}' is replaced")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=500, help="evaluation scenes per seed")
    ap.add_argument("--eval-seed", type=int, default=12345)
    ap.add_argument("--out", default="docs/replications.md")
    ap.add_argument("--smoke", action="store_true",
                    help="seconds-long check: random-init capscore-test-tiny, 3 seeds, 8 scenes")
    a = ap.parse_args(argv)
    if a.smoke:
        a.experiment, a.model, a.seeds, a.n = "flips", ["capscore-test-tiny"], [0, 1, 2], 8
    if a.n < 2:
        ap.error("--n must be >= 2")
    rows = run(a.experiment, a.model, a.seeds, a.n, a.eval_seed)
    command = "python benchmarks/replicate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(a.out).write_text(f"# Replications ({a.experiment})\n\n" + table(rows, command))
    print(table(rows, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
