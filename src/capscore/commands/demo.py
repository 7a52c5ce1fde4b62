"""``capscore demo``: the first command to run — offline, no downloads, under a minute
(:mod:`capscore.probes.demo`); everything is written under ``--out``."""
from __future__ import annotations

from pathlib import Path

from capscore.commands._args import add_device, add_model, positive_int, seed


def configure(p) -> None:
    p.add_argument("--out", default="capscore-demo", metavar="DIR", help="output folder (default capscore-demo/)")
    p.add_argument("--n", type=positive_int, default=60, help="number of scenes (default 60)")
    p.add_argument("--seed", type=seed, default=7, help="scene seed (default 7)")
    add_model(p, single=True, help="backbone (default: the bundled scenes-tiny)")
    add_device(p)


def run(args) -> int:
    from capscore.probes.demo import format_summary, run_demo

    out = Path(args.out)
    res = run_demo(out, n=args.n, seed=args.seed, model=args.model, device=args.device, dtype=args.dtype)
    print(format_summary(res, out))
    return 0
