"""``capscore demo``: the first command to run — offline, no downloads, under a minute.

It generates a small set of synthetic scenes (exact ground truth), writes their images, scores
each scene's correct captions and their controlled-error twins with CLIP-S using the bundled
``scenes-tiny`` model (through the same encoder and scorer as ``capscore score``), runs one probe
— for each error kind, the share of pairs where the correct caption scores strictly higher than
its flawed twin — and prints a short summary. Everything is written under ``--out``; re-runs with
the same options give the same numbers.
"""
from __future__ import annotations

from pathlib import Path

from capscore.commands._args import add_device, add_model, positive_int
from capscore.errors import CapscoreError


def configure(p) -> None:
    p.add_argument("--out", default="capscore-demo", metavar="DIR", help="output folder (default capscore-demo/)")
    p.add_argument("--n", type=positive_int, default=60, help="number of scenes (default 60)")
    p.add_argument("--seed", type=int, default=7, help="scene seed (default 7)")
    add_model(p, single=True, help="backbone (default: the bundled scenes-tiny)")
    add_device(p)


def run(args) -> int:
    from capscore.probes.demo import format_summary, run_demo

    out = Path(args.out)
    if args.n < 2:
        raise CapscoreError(f"--n must be >= 2; got {args.n}")
    if out.exists() and not out.is_dir():
        raise CapscoreError(f"--out {out}: is an existing file; --out names the demo's output folder")
    res = run_demo(out, n=args.n, seed=args.seed, model=args.model, device=args.device, dtype=args.dtype)
    print(format_summary(res, out))
    return 0
