"""``capscore probe``: run one probe suite on one or more models; per-item rows + a summary table."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from capscore._optional import require
from capscore.commands import _shards
from capscore.commands._args import add_device, add_model, non_negative_int, output_dir, positive_int, probability
from capscore.errors import CapscoreError, unknown_name

FILE_SUITES = ("sugarcrepe", "sugarcrepe++", "aro-vg-relation", "aro-vg-attribution", "aro-coco-order",
               "aro-flickr-order", "abc6k", "winoground")
CAPTION_SUITES = ("perturb", "lgip", "specificity")
DATA_SUITES = ("retrieval", "zeroshot")  # SPECS Table 4 / ABE-CLIP Table 2 evaluations (cosine only)


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
    p.add_argument("--scorer", default="cosine", choices=("cosine", "abe"), help="pair scorer (default cosine)")
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


def add_abe_arguments(p) -> None:
    """ABE-CLIP's knobs (abe-clip.txt: K = 5 and ω = 0.3 as in section 4.2.1; P is not stated)."""
    g = p.add_argument_group("ABE-CLIP (--scorer abe / --metric abe)")
    g.add_argument("--abe-k", type=int, default=None, metavar="K",
                   help="patches averaged per token, top-K (paper default 5; Table 3 sweeps 1,3,5,8,10)")
    g.add_argument("--abe-p", type=int, default=None, metavar="P",
                   help="concept-pool neighbours per object (the paper does not state P; capscore default 5)")
    g.add_argument("--abe-omega", type=float, default=None, metavar="W",
                   help="weight of the global score, in [0, 1] (paper default 0.3)")
    g.add_argument("--concept-pool", default=None, metavar="FILE",
                   help="concept pool, one word per line, e.g. SPLiCE's data/vocab/laion.txt (the paper's; "
                        "not bundled, see docs/abe.md); default: capscore's bundled 304 nouns")


def abe_options(args) -> dict:
    """The ABE options the user set (unset ones keep AbeConfig's defaults); errors name the flag."""
    opts = {}
    for flag, key in (("abe_k", "k"), ("abe_p", "p"), ("abe_omega", "omega"), ("concept_pool", "pool")):
        value = getattr(args, flag, None)
        if value is not None:
            opts[key] = value
    for flag, key in (("--abe-k", "k"), ("--abe-p", "p")):
        if key in opts and opts[key] < 1:
            raise CapscoreError(f"{flag} must be an integer >= 1; got {opts[key]}")
    if "omega" in opts and not 0 <= opts["omega"] <= 1:
        raise CapscoreError(f"--abe-omega must be in [0, 1]; got {opts['omega']}")
    if "pool" in opts:
        from capscore.scores.concepts import load_concept_pool

        load_concept_pool(opts["pool"])  # a missing or empty file fails now, before any model is loaded
    return opts


def _per_image(value: str) -> int | None:
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise CapscoreError(f"--captions-per-image must be a positive integer or 'all'; got {value!r}")
    return int(value)


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
    if args.suite in DATA_SUITES + ("scenes-retrieval", "scenes-zeroshot") and args.scorer != "cosine":
        raise CapscoreError(f"--suite {args.suite} ranks by the embeddings' cosine only; got --scorer {args.scorer}")
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
    scorer = get_pair_scorer(args.scorer, **abe)
    results = []
    with progress(len(args.model), desc=f"probe {args.suite}", unit="model", leave=False) as bar:
        for spec in args.model:
            res = _probe_one(args, spec, kind, inputs, scorer, R, load_backbone, make_encoder, is_quiet())
            out = output_dir(args.out)  # after the first model loaded: a bad --model or --device leaves no folder
            _write_rows(out / f"{_safe(args.suite)}__{_safe(spec)}.{args.format}", res)
            results.append(res)
            bar.update(1)
    summary = [{"suite": r.suite, "model": r.model, "identity": r.identity, "scorer": r.scorer, "seed": r.seed,
                "params": r.params, "source": r.source, "summary": list(r.summary)} for r in results]
    (out / f"{_safe(args.suite)}.summary.json").write_text(json.dumps(summary, indent=2, default=str))
    _print(results)
    return 0


def _probe_one(args, spec, kind, inputs, scorer, R, load_backbone, make_encoder, quiet):
    """One model: encode (with progress bars over the encoding work; on Ray with --engine ray) and run the suite."""
    backbone = load_backbone(spec, device=args.device, dtype=args.dtype, seed=args.seed)
    encoder = make_encoder(args, backbone, spec=spec, batch_size=args.batch_size, progress=not quiet,
                           cache=args.cache_dir and Path(args.cache_dir) / "embeddings.sqlite")
    common = dict(scorer=scorer, scorer_name=args.scorer, source=str(args.data or ""))
    if kind == "scenes":
        res = inputs(encoder, args=args, **common)
    elif kind == "retrieval":
        from capscore.probes.retrieval import run_retrieval

        res = run_retrieval(encoder, inputs, source=str(args.data), seed=args.seed)
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


def _write_rows(path: Path, res) -> None:
    meta = {"suite": res.suite, "model": res.model, "scorer": res.scorer, "seed": res.seed}
    rows = [{**meta, **r} for r in res.rows]
    if path.suffix == ".parquet":
        pd = require("pandas", purpose="a .parquet output")
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
