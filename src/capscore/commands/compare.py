"""``capscore compare A.jsonl B.jsonl``: is system A's mean score different from system B's, beyond noise?
(:mod:`capscore.meta.compare`: a paired bootstrap and approximate randomisation over images.)"""
from __future__ import annotations

import json

from capscore.commands._args import output_file, resamples, seed


def configure(p) -> None:
    p.add_argument("a", metavar="A", help="scores of system A (capscore score output: JSONL/CSV/JSON/Parquet)")
    p.add_argument("b", metavar="B", help="scores of system B, same metric")
    p.add_argument("--match", choices=("id", "image"), default="id",
                   help="pair rows by id (default) or by image (one caption per image in each file)")
    p.add_argument("--score-column", default="score", help="score column (default score)")
    p.add_argument("--resamples", type=resamples, default=10000, metavar="N",
                   help="bootstrap resamples and randomisation shuffles (default 10000)")
    p.add_argument("--seed", type=seed, default=0, help="seed of both tests (default 0)")
    p.add_argument("--out", metavar="FILE.json", help="also write the results as JSON")


def run(args) -> int:
    from capscore.meta.compare import compare_files, format_comparison

    out = output_file(args.out) if args.out else None
    res = compare_files(args.a, args.b, match=args.match, score_column=args.score_column,
                        n_resamples=args.resamples, seed=args.seed)
    print(format_comparison(res))
    if out:
        out.write_text(json.dumps(res.as_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    return 0
