"""``capscore correlate``: how well metrics agree with human judgments (meta-evaluation; docs/meta.md).

``--dataset NAME`` scores it with every ``--metric`` on every ``--model`` (:func:`capscore.meta.run.run_correlate`);
``--scores FILE`` correlates scores made elsewhere (:func:`capscore.meta.run.correlate_file`); ``--out DIR``
writes correlate.json, .csv and correlate_items.jsonl (:func:`capscore.meta.run.write_results`)."""
from __future__ import annotations

from pathlib import Path

from capscore.commands import _shards
from capscore.commands._args import (add_device, add_metric, add_model, job_of, non_negative_int, output_dir,
                                     positive_int, refuse_input_as_output, resamples_or_zero, seed,
                                     significance_level)
from capscore.errors import CapscoreError


def configure(p) -> None:
    from capscore.meta.datasets import DATASETS
    from capscore.meta.video import VIDEO_DATASETS

    p.add_argument("--dataset", metavar="NAME", help=f"one of: {', '.join([*DATASETS, *VIDEO_DATASETS])}")
    p.add_argument("--path", metavar="P", help="the dataset's file or folder (see docs/meta.md)")
    p.add_argument("--images", metavar="DIR", help="image root of the dataset")
    p.add_argument("--split", help="split of a parquet dataset folder (e.g. test, test.desc)")
    p.add_argument("--coco-captions", metavar="FILE", help="FOIL: COCO captions_val2014.json (references)")
    add_model(p, default=None)
    from capscore.scores.metric import metric_names

    add_metric(p, metric_names())  # a video metric on a video dataset, an image metric on an image dataset
    p.add_argument("--tokenizer", choices=("ptb", "simple"), default="ptb",
                   help="classic metrics (bleu1-4, meteor, rouge-l, cider, spice; no --model needed for them): "
                        "ptb = COCO's PTB tokenizer (needs Java; default), simple = a Java-free approximation")
    p.add_argument("--classic-backend", choices=("native", "pycocoevalcap"), default="native",
                   help="classic metrics: BLEU, ROUGE-L and CIDEr-D computed natively on the PTB tokens (default; "
                        "equal to pycocoevalcap's to 1e-12) or by pycocoevalcap's own code; recorded in the results")
    p.add_argument("--metric-weights", metavar="DIR", default=None,
                   help="polos, deneb, fleur, reffleur, expert: folder of their released checkpoints (default "
                        "$CAPSCORE_METRIC_WEIGHTS or ~/.cache/capscore/metric-weights; see docs/learned.md)")
    p.add_argument("--alpha", type=significance_level, default=0.05,
                   help="significance level of the cluster of metrics not different from the best (default 0.05)")
    p.add_argument("--prefix", default=None, metavar="TEXT", help="caption prefix (default: the metric's own)")
    p.add_argument("--scores", metavar="FILE", help="external scores (JSONL/CSV/Parquet with id and score)")
    p.add_argument("--human", metavar="FILE", help="human scores (JSONL/CSV with id and score) for --scores")
    p.add_argument("--score-column", default="score", help="score column of --scores (default score)")
    p.add_argument("--human-column", default=None, help="score column of --human (default: score/human/"
                                                        "human_score/rating)")
    p.add_argument("--id-column", default="id", help="id column of --scores and --human (default id)")
    p.add_argument("--stats", nargs="+", metavar="STAT",
                   help="statistics instead of the dataset's conventional ones (rating datasets): tau_b tau_c "
                        "pearson spearman one_minus_r2 (SPECS Table 2, unfitted, x1) one_minus_r2_fit sample_tau_b "
                        "sample_tau_c system:KIND by_lang:KIND")
    p.add_argument("--ties", choices=("half", "loss"), help="pairs: a metric tie counts half or as a loss "
                                                           "(default: half for Pascal-50S, loss for FOIL)")
    p.add_argument("--ref-sample", type=non_negative_int, default=5, metavar="K",
                   help="Pascal-50S: references drawn per pair for reference-based metrics (default 5; 0 = all 48)")
    p.add_argument("--ref-draws", type=positive_int, default=5, metavar="N", help="Pascal-50S: draws averaged (default 5)")
    p.add_argument("--scenes", type=positive_int, default=60, metavar="N", help="scenes-oracle: number of scenes")
    p.add_argument("--bootstrap", type=resamples_or_zero, default=1000, metavar="N",
                   help="bootstrap resamples for 95%% intervals (default 1000; 0 = none)")
    p.add_argument("--seed", type=seed, default=0, help="seed: ties, reference draws, bootstrap, random init")
    p.add_argument("--out", metavar="DIR", help="write correlate.json and correlate.csv here")
    p.add_argument("--export-items", metavar="FILE",
                   help="write the dataset's items as JSONL (id, image, caption, refs) for `capscore score`, then stop")
    p.add_argument("--skip-bad", action="store_true", help="count and skip items that cannot be scored")
    p.add_argument("--videos", metavar="DIR", help="video datasets (vatex-eval, activitynet-foil): folder of VIDEO_ID.mp4")
    p.add_argument("--frames", default=None, metavar="SAMPLING",
                   help="video datasets: uniform:N, fps:R, every:K or all (default uniform:10; see docs/video.md)")
    p.add_argument("--idf", action="store_true",
                   help="video datasets: EMScore idf weights from the dataset's training captions (its protocol)")
    p.add_argument("--n-refs", type=int, nargs="+", metavar="K",
                   help="video rating datasets, reference-based metrics: reference counts (default 1 9)")
    add_device(p)
    p.add_argument("--batch-size", type=positive_int, default=64, metavar="N", help="encoder batch size (default 64)")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cache-dir", metavar="DIR", help="embedding cache folder (default ~/.cache/capscore)")
    cache.add_argument("--no-cache", action="store_true", help="keep embeddings in memory only")
    _shards.add_engine_arguments(p, score=False)  # --engine ray


def run(args) -> int:
    from capscore.meta import run as M
    from capscore.meta.video import VIDEO_DATASETS

    video = args.dataset in VIDEO_DATASETS
    if video and (args.scores or args.export_items):
        raise CapscoreError(f"--scores/--export-items are not available for the video dataset {args.dataset}")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise CapscoreError(f"--out {args.out}: is an existing file; --out names a folder (correlate.json, .csv)")
    if args.export_items:
        refuse_input_as_output(args.export_items, {"--path": args.path, "--coco-captions": args.coco_captions},
                               name="--export-items")
    job = job_of(M.CorrelateJob, args, dataset=args.dataset or "", models=tuple(args.model or ()),
                 metrics=tuple(args.metric))
    if video:
        results, significance = M.run_correlate_video(job), None
    elif args.export_items:
        if not args.dataset:
            raise CapscoreError("--export-items needs --dataset (and --path)")
        from capscore.meta.evaluate import export_items

        print(f"wrote {export_items(M.load(job), args.export_items)} items to {args.export_items}")
        return 0
    elif args.scores:
        if args.model:
            raise CapscoreError("--scores correlates a file of scores; --model is for scoring here (give one or the other)")
        if bool(args.human) == bool(args.dataset):
            raise CapscoreError("--scores needs exactly one of --human FILE or --dataset NAME --path P")
        results, significance = [M.correlate_file(args.scores, job, human=args.human, score_column=args.score_column,
                                                  human_column=args.human_column, id_column=args.id_column)], None
    elif not args.dataset:
        raise CapscoreError("give --dataset NAME (see `capscore correlate -h`) or --scores FILE")
    else:
        results, significance = M.run_correlate(job, make_encoder=_shards.encoder_factory(args))
    print(M.format_results(results, significance=significance))
    if args.out:
        print("wrote {} and {}".format(*M.write_results(results, output_dir(args.out), significance=significance)))
    return 0
