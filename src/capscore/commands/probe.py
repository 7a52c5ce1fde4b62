"""``capscore probe``: run one probe suite on one or more models; per-item rows + a summary table."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from capscore.commands import _shards
from capscore.commands._args import (
    abe_options, add_abe_arguments, add_device, add_model, non_negative_int, output_dir, positive_int, probability,
)
from capscore.errors import CapscoreError, unknown_name

FILE_SUITES = ("sugarcrepe", "sugarcrepe++", "aro-vg-relation", "aro-vg-attribution", "aro-coco-order",
               "aro-flickr-order", "abc6k", "winoground")
CAPTION_SUITES = ("perturb", "lgip", "specificity")
DATA_SUITES = ("retrieval", "zeroshot")  # SPECS Table 4 / ABE-CLIP Table 2 evaluations
RANKING_SUITES = ("retrieval", "scenes-retrieval")  # cosine, or a pair scorer re-ranking cosine's top k (abe)
COSINE_ONLY_SUITES = ("zeroshot", "scenes-zeroshot")
MCS_SUITES = ("perturb", "scenes-perturb")  # scored with MCS by default: PR-MCS's tables are on MCS


def _scene_suites() -> dict:
    try:
        from capscore.probes.scenes import SCENE_SUITES
    except ImportError:
        return {}
    return SCENE_SUITES


def configure(p) -> None:
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
    p.add_argument("--rerank-k", default=None, metavar="K|all",
                   help="retrieval with --scorer abe: candidates per query the cosine picks and ABE re-ranks "
                        "(default 20), or 'all' to score every pair (exact; small sets only)")
    add_abe_arguments(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--format", default="jsonl", choices=("jsonl", "parquet"), help="per-item rows (default jsonl)")
    p.add_argument("--seed", type=int, default=0, help="perturbation / sampling seed, and random-init seed")
    p.add_argument("--p", type=probability, default=0.4,
                   help="perturb: per-word draw rate, P(random() > threshold) in PR-MCS Alg. 1 (default 0.4)")
    p.add_argument("--removal", default="keep-drawn", choices=("keep-drawn", "drop-drawn"),
                   help="perturb: removal keeps the drawn words (PR-MCS Alg. 1, default) or deletes them (§5.2 prose)")
    p.add_argument("--ensure-change", action="store_true",
                   help="perturb: draw one word when none was drawn (not in Alg. 1)")
    p.add_argument("--sr-variant", default="capscore", choices=("capscore", "reference"),
                   help="specificity: every step (default) or the SPECS reference evaluation's chains")
    p.add_argument("--grammar", default="capscore", choices=("capscore", "paper"),
                   help="specificity: detail-unit chunk grammar (default capscore's; 'paper' = SPECS App. A)")
    p.add_argument("--lgip-average", default="pairs", choices=("pairs", "captions"),
                   help="lgip: mean over all pairs (reference code, default) or per caption first (eqs. 4-8)")
    p.add_argument("--mask", default="[MASK]", help="perturb: mask token (default [MASK])")
    p.add_argument("--kinds", default="repetition,removal,masking,jumble,substitution",
                   help="perturb: comma-separated perturbations")
    p.add_argument("--min-group-count", type=non_negative_int, default=25, help="ARO macro: smallest group kept (default 25)")
    p.add_argument("--n-scenes", type=positive_int, default=64, help="scenes-*: number of generated scenes (default 64)")
    p.add_argument("--split", default="test", help="retrieval: Karpathy split of --data (default test)")
    p.add_argument("--captions-per-image", default="5", metavar="N|all",
                   help="retrieval: first N captions of each image (default 5, the 5K/1K-test protocol) or all")
    p.add_argument("--templates", default=None, choices=("openai", "simple", "single", "scenes"),
                   help="zeroshot: prompt templates (default openai = CLIP's 80; scenes-zeroshot: scenes)")
    p.add_argument("--classnames", metavar="FILE|imagenet",
                   help="zeroshot: class names (.txt one per line in sorted-label order, .json {label: name}, "
                        "or imagenet); default: the labels")
    add_device(p)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--cache-dir", metavar="DIR", help="persistent embedding cache (default: in memory)")
    _shards.add_engine_arguments(p, score=False)  # --engine ray (issue 15)


def _per_image(value: str) -> int | None:
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise CapscoreError(f"--captions-per-image must be a positive integer or 'all'; got {value!r}")
    return int(value)


def _rerank_k(value: str | None) -> int | None:
    if value is None:
        from capscore.probes.retrieval import RERANK_K

        return RERANK_K
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise CapscoreError(f"--rerank-k must be a positive integer or 'all'; got {value!r}")
    return int(value)


def _scorer_name(args) -> str:
    """--scorer as given, else the suite's default (mcs for the perturb suites, cosine otherwise)."""
    if args.scorer is not None:
        return args.scorer
    return "mcs" if args.suite in MCS_SUITES else "cosine"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def _load_inputs(args):
    from capscore.probes.formats import load_probe_items, load_suite

    suite = args.suite
    scenes = _scene_suites()
    if suite in scenes:
        return "scenes", scenes[suite]
    if suite not in FILE_SUITES + CAPTION_SUITES + DATA_SUITES:
        raise unknown_name("suite", suite, FILE_SUITES + CAPTION_SUITES + DATA_SUITES + tuple(scenes))
    if not args.data:
        raise CapscoreError(f"--suite {suite} needs --data (and --images for image fields)")
    if suite == "retrieval":
        from capscore.probes.retrieval import load_karpathy

        return "retrieval", load_karpathy(args.data, args.images, split=args.split,
                                          captions_per_image=_per_image(args.captions_per_image))
    if suite == "zeroshot":
        from capscore.probes.zeroshot import load_classification

        return "zeroshot", load_classification(args.data, args.images, classnames=args.classnames)
    if suite in CAPTION_SUITES:
        return "captions", load_probe_items(args.data, args.images)
    opts = {"mapping": args.mapping} if suite == "abc6k" else {}
    return "suite", load_suite(suite, args.data, args.images, **opts)


def run(args) -> int:
    from capscore._log import is_quiet, progress
    from capscore.backbones import load_backbone
    from capscore.engines.ray import make_encoder
    from capscore.probes import run as R
    from capscore.scores.pairs import get_pair_scorer

    if args.batch_size < 1:
        raise CapscoreError(f"--batch-size must be a positive integer; got {args.batch_size}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise CapscoreError(f"--out {args.out}: is an existing file; --out names the output folder")
    args.scorer = _scorer_name(args)
    if args.suite in COSINE_ONLY_SUITES and args.scorer != "cosine":
        raise CapscoreError(f"--suite {args.suite} ranks by the embeddings' cosine only; got --scorer {args.scorer}")
    if args.suite in RANKING_SUITES and args.scorer not in ("cosine", "abe"):
        raise CapscoreError(f"--suite {args.suite} ranks by cosine or re-ranks with --scorer abe; "
                            f"got --scorer {args.scorer}")
    if args.suite in RANKING_SUITES + COSINE_ONLY_SUITES and args.prefix is not None:
        raise CapscoreError(f"--prefix does not apply to --suite {args.suite}")
    if args.rerank_k is not None and not (args.suite in RANKING_SUITES and args.scorer == "abe"):
        raise CapscoreError("--rerank-k applies to the retrieval suites with --scorer abe only")
    args.rerank = _rerank_k(args.rerank_k)
    if args.suite != "retrieval" and (args.split != "test" or args.captions_per_image != "5"):
        raise CapscoreError(f"--split and --captions-per-image apply to --suite retrieval only; got --suite {args.suite}")
    if args.suite not in ("zeroshot", "scenes-zeroshot") and (args.templates or args.classnames):
        raise CapscoreError(f"--templates and --classnames apply to the zeroshot suites only; got --suite {args.suite}")
    kind, inputs = _load_inputs(args)  # input errors surface before any model is loaded
    if kind not in ("scenes", "retrieval", "zeroshot") and not inputs:
        raise CapscoreError(f"{args.data}: no items")
    abe = abe_options(args)
    if abe and args.scorer != "abe":
        raise CapscoreError("--abe-k/--abe-p/--abe-omega/--concept-pool apply to --scorer abe only")
    scorer = get_pair_scorer(args.scorer, prefix=args.prefix, **abe)  # an unknown name: one line, did-you-mean
    results = []
    with progress(len(args.model), desc=f"probe {args.suite}", unit="model", leave=False) as bar:
        for spec in args.model:
            res = _probe_one(args, spec, kind, inputs, scorer, R, load_backbone, make_encoder, is_quiet())
            out = output_dir(args.out)  # after the first model loaded: a bad --model or --device leaves no folder
            _write_rows(out / f"{_safe(args.suite)}__{_safe(spec)}.{args.format}", res)
            results.append(res)
            bar.update(1)
    prefix = getattr(scorer, "prefix", "")
    summary = [{"suite": r.suite, "model": r.model, "identity": r.identity, "scorer": r.scorer, "prefix": prefix,
                "seed": r.seed, "params": r.params, "source": r.source, "summary": list(r.summary)} for r in results]
    (out / f"{_safe(args.suite)}.summary.json").write_text(json.dumps(summary, indent=2, default=str))
    _print(results)
    return 0


def _probe_one(args, spec, kind, inputs, scorer, R, load_backbone, make_encoder, quiet):
    """One model: encode (with progress bars over the encoding work; on Ray with --engine ray) and run the suite."""
    backbone = load_backbone(spec, device=args.device, dtype=args.dtype, seed=args.seed)
    encoder = make_encoder(backbone, spec=spec, ray=_shards.ray_options_if(args), device=args.device,
                           dtype=args.dtype, seed=args.seed, batch_size=args.batch_size, progress=not quiet,
                           cache=args.cache_dir and Path(args.cache_dir) / "embeddings.sqlite")
    common = dict(scorer=scorer, scorer_name=args.scorer, source=str(args.data or ""))
    if kind == "scenes":
        res = inputs(encoder, args=args, **common)
    elif kind == "retrieval":
        from capscore.probes.retrieval import run_retrieval

        res = run_retrieval(encoder, inputs, source=str(args.data), seed=args.seed,
                            **_ranking(args, scorer))
    elif kind == "zeroshot":
        from capscore.probes.zeroshot import run_zeroshot

        res = run_zeroshot(encoder, inputs, templates=args.templates or "openai", source=str(args.data),
                           seed=args.seed)
    elif args.suite == "perturb":
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        res = R.run_perturb(encoder, inputs, kinds=kinds, p=args.p, seed=args.seed, mask=args.mask,
                            removal=args.removal, ensure_change=args.ensure_change, **common)
    elif args.suite == "lgip":
        res = R.run_lgip(encoder, inputs, seed=args.seed, average=args.lgip_average, **common)
    elif args.suite == "specificity":
        res = R.run_specificity(encoder, inputs, seed=args.seed, variant=args.sr_variant, grammar=args.grammar,
                                **common)
    else:
        res = R.run_suite(encoder, inputs, suite=args.suite, min_group_count=args.min_group_count,
                          text_only=args.suite == "sugarcrepe++", **common)
    return res


def _ranking(args, scorer) -> dict:
    """run_retrieval's scorer options: none for cosine; the pair scorer and its re-ranking depth for abe."""
    if args.scorer == "cosine":
        return {}
    return {"scorer": scorer, "scorer_name": args.scorer, "rerank_k": args.rerank}


def _write_rows(path: Path, res) -> None:
    meta = {"suite": res.suite, "model": res.model, "scorer": res.scorer, "seed": res.seed}
    rows = [{**meta, **r} for r in res.rows]
    if path.suffix == ".parquet":
        import pandas as pd

        pd.DataFrame([{k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()}
                      for r in rows]).to_parquet(path, index=False)
        return
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")


def _print(results) -> None:
    from capscore.report.tables import format_table

    rows = [{"model": r.model, **{k: v for k, v in s.items() if not isinstance(v, (dict, list))}}
            for r in results for s in r.summary]
    r0 = results[0]
    print(f"== {r0.suite} | scorer={r0.scorer} | seed={r0.seed}")
    print(format_table(rows))
    sys.stdout.flush()
