"""``capscore probe``: run one probe suite on one or more models; per-item rows + a summary table
(:mod:`capscore.probes.job`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from capscore.commands import _shards
from capscore.commands._args import (
    abe_options, add_abe_arguments, add_device, add_model, count_or_all, job_of, non_negative_int, positive_int,
    probability, seed,
)
from capscore.errors import CapscoreError


def configure(p) -> None:
    from capscore.probes.job import CAPTION_SUITES, DATA_SUITES, FILE_SUITES

    add_model(p)
    p.add_argument("--suite", required=True, metavar="NAME",
                   help="one of: " + ", ".join(FILE_SUITES + CAPTION_SUITES + DATA_SUITES) + ", and the scenes-* suites")
    p.add_argument("--data", metavar="PATH", help="suite file (or folder of subset files, for SugarCrepe); retrieval: "
                   "Karpathy-split JSON; zeroshot: class-folder root or path,label CSV")
    p.add_argument("--images", metavar="DIR", help="image root the suite's image fields are relative to")
    p.add_argument("--mapping", metavar="FILE", help="abc6k: JSON {caption: image}")
    p.add_argument("--scorer", default=None, metavar="NAME",
                   help="pair scorer: cosine, abe, or a reference-free metric (mcs, clip-s, pac-s); default: mcs "
                        "for the perturb suites (PR-MCS scores with MCS = 2.5*max(0, cos)), cosine otherwise")
    p.add_argument("--prefix", default=None, metavar="TEXT",
                   help="text the scorer prepends to every caption (default: the scorer's own: 'A photo depicts ' "
                        "for clip-s and pac-s, none for mcs, abe and cosine; '' for none)")
    p.add_argument("--rerank-k", type=count_or_all, default=argparse.SUPPRESS, metavar="K|all",
                   help="retrieval with --scorer abe: candidates per query the cosine picks and ABE re-ranks "
                        "(default 20), or 'all' to score every pair (exact; small sets only)")
    add_abe_arguments(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--format", default="jsonl", choices=("jsonl", "parquet"), help="per-item rows (default jsonl)")
    p.add_argument("--seed", type=seed, default=0, help="perturbation / sampling seed, and random-init seed")
    p.add_argument("--p", type=probability, default=0.4,
                   help="perturb: per-word draw rate, P(random() > threshold) in PR-MCS Alg. 1 (default 0.4)")
    p.add_argument("--removal", default="keep-drawn", choices=("keep-drawn", "drop-drawn"),
                   help="perturb: removal keeps the drawn words (PR-MCS Alg. 1, default) or deletes them (§5.2 prose)")
    p.add_argument("--ensure-change", action="store_true",
                   help="perturb: draw one word when none was drawn (not in Alg. 1)")
    p.add_argument("--sr-variant", default="capscore", choices=("capscore", "reference"),
                   help="specificity: every step (default) or the SPECS authors' evaluation (their negatives and "
                        "SR bookkeeping)")
    p.add_argument("--grammar", default="capscore", choices=("capscore", "paper", "reference"),
                   help="specificity: detail-unit chunk grammar (default capscore's; 'paper' = SPECS App. A; "
                        "'reference' = the SPECS authors' chunker)")
    p.add_argument("--lgip-average", default="pairs", choices=("pairs", "captions"),
                   help="lgip: mean over all pairs (reference code, default) or per caption first (eqs. 4-8)")
    p.add_argument("--mask", default="[MASK]", help="perturb: mask token (default [MASK])")
    p.add_argument("--kinds", default="repetition,removal,masking,jumble,substitution",
                   help="perturb: comma-separated perturbations")
    p.add_argument("--min-group-count", type=non_negative_int, default=25, help="ARO macro: smallest group kept (default 25)")
    p.add_argument("--n-scenes", type=positive_int, default=64, help="scenes-*: number of generated scenes (default 64)")
    p.add_argument("--split", default="test", help="retrieval: Karpathy split of --data (default test)")
    p.add_argument("--captions-per-image", type=count_or_all, default=5, metavar="N|all",
                   help="retrieval: first N captions of each image (default 5, the 5K/1K-test protocol) or all")
    p.add_argument("--templates", default=None, choices=("openai", "simple", "single", "scenes"),
                   help="zeroshot: prompt templates (default openai = CLIP's 80; scenes-zeroshot: scenes)")
    p.add_argument("--classnames", metavar="FILE|imagenet",
                   help="zeroshot: class names (.txt one per line in sorted-label order, .json {label: name}, "
                        "or imagenet); default: the labels")
    add_device(p)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--cache-dir", metavar="DIR", help="persistent embedding cache (default: in memory)")
    _shards.add_engine_arguments(p, score=False)  # --engine ray


def run(args) -> int:
    from capscore._log import is_quiet
    from capscore.embed.factory import Encoding
    from capscore.probes import job as J
    from capscore.probes.job import COSINE_ONLY_SUITES, RANKING_SUITES
    from capscore.probes.retrieval import RERANK_K
    from capscore.scores.pairs import get_pair_scorer

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise CapscoreError(f"--out {args.out}: is an existing file; --out names the output folder")
    suite, scorer_name = args.suite, args.scorer or J.default_scorer(args.suite)
    if suite in RANKING_SUITES and scorer_name not in ("cosine", "abe"):
        raise CapscoreError(f"--suite {suite} ranks by cosine or re-ranks with --scorer abe; got --scorer {scorer_name}")
    if suite in RANKING_SUITES + COSINE_ONLY_SUITES and args.prefix is not None:
        raise CapscoreError(f"--prefix does not apply to --suite {suite}")
    if "rerank_k" in args and not (suite in RANKING_SUITES and scorer_name == "abe"):
        raise CapscoreError("--rerank-k applies to the retrieval suites with --scorer abe only")
    job = job_of(J.ProbeJob, args, scorer=scorer_name, rerank=vars(args).get("rerank_k", RERANK_K))
    inputs = J.load_inputs(job)  # input errors surface before any model is loaded
    scorer = get_pair_scorer(scorer_name, prefix=args.prefix, **abe_options(args))  # checks the name and options
    make = _shards.encoder_factory(args)
    encoding = Encoding(device=args.device, dtype=args.dtype, seed=job.seed, batch_size=args.batch_size,
                        cache_dir=args.cache_dir, cache=bool(args.cache_dir))  # probe's default: vectors in memory
    results = J.run_probe(job, args.model, scorer=scorer, out=Path(args.out).expanduser(), fmt=args.format,
                          inputs=inputs, make_encoder=lambda spec: make(spec, encoding, progress=not is_quiet()))
    print(J.format_summary(results), flush=True)
    return 0
