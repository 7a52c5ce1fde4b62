"""SR_neg of the SPECS replication split by the kind of false fact (docs/research/replications-log.md, "By kind of false fact").

``replicate.py``'s SR_neg pools every controlled wrong unit: a colour, count or shape changed in an object
mention, a region changed ("where"), or a relation reversed. This script scores the runs that
``replicate.py --experiment specs`` (and the ``specs-grid`` rows) left in ``--work`` on the same held-out
scenes and triplets (``replicate._specificity_items``) and prints, per arm and kind, SR_neg (the share of
triplets where θ(c_k) > θ(c_k + d⁻)) and the mean gap θ(c_k) − θ(c_k + d⁻), per seed and over seeds.

    python experiments/specs_by_kind.py --work runs/replicate-v4 --seeds 0 1 2 --n 500
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import replicate as rep  # noqa: E402

ARMS = {"start": "long", "control": "control", "SPECS (paper d⁻)": "specs",
        "SPECS, controlled d⁻": "grid-negativescontrolled"}


def kind(true_unit, wrong_unit) -> str:
    """Which fact ``captions._corrupt`` changed: the unit's form, or for an object mention its field."""
    a, b = true_unit.claims[0], wrong_unit.claims[0]
    if true_unit.form in ("total", "where", "relation") or not hasattr(a, "shape"):
        return true_unit.form
    return next((f for f in ("count", "color", "shape") if getattr(a, f) != getattr(b, f)), true_unit.form)


def by_kind(model: str, seed: int, n: int, eval_seed: int) -> tuple[dict, dict]:
    """(SR_neg indicators, gaps) per kind of false fact for one model and seed."""
    from capscore.probes.run import run_specificity

    enc, scenes = rep._heldout(model, seed, n, eval_seed)
    pairs: list = []
    items, units = rep._specificity_items(scenes, eval_seed + seed, pairs=pairs)
    kinds = [[kind(t, w) for t, w in zip(true[1:], wrong)] for true, wrong in pairs]
    wins, gaps = defaultdict(list), defaultdict(list)
    for row, ks in zip(run_specificity(enc, items, units=units, seed=eval_seed + seed).rows, kinds):
        ps, ws = row["prefix_scores"], row["wrong_scores"]
        for k, w in enumerate(ws):
            if w is not None:
                wins[ks[k]].append(float(ps[k] > w))
                gaps[ks[k]].append(ps[k] - w)
    return wins, gaps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="runs/replicate", help="replicate.py's --work folder")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--eval-seed", type=int, default=rep.EVAL_SEED, help="replicate.py's --eval-seed")
    args = ap.parse_args()
    total: dict = defaultdict(lambda: defaultdict(list))
    for seed in args.seeds:
        for arm, folder in ARMS.items():
            path = Path(args.work) / f"specs-s{seed}" / folder / "model.safetensors"
            if not path.exists():
                print(f"seed {seed} {arm}: no run at {path}, skipped")
                continue
            wins, gaps = by_kind(f"ckpt:{path}", seed, args.n, args.eval_seed)
            for k in wins:
                total[arm][k].append((np.mean(wins[k]), len(wins[k]), np.mean(gaps[k])))
            print(f"seed {seed} {arm}: " + ", ".join(f"{k} {np.mean(v):.3f}" for k, v in sorted(wins.items())),
                  flush=True)
    print("\nSR_neg by kind of false fact, mean over seeds [lowest, highest seed]; triplets; mean gap θ(c) − θ(c + d⁻)")
    for arm, per in total.items():
        print(f"{arm}:")
        for k, v in sorted(per.items()):
            rates = [r for r, _, _ in v]
            print(f"  {k:9s} {np.mean(rates):.3f} [{min(rates):.3f}, {max(rates):.3f}]  n={sum(c for _, c, _ in v)}"
                  f"  gap {np.mean([g for _, _, g in v]):+.4f}")


if __name__ == "__main__":
    main()
