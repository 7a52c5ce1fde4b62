"""``capscore score``: score caption files against images or videos, one row per caption, resumable.

Flags become a :class:`capscore.pipeline.ScoreJob`; :func:`capscore.pipeline.run`
does the rest (chunked scoring, error rows, resume, summary), in this process or,
with ``--engine ray``, with the Ray engine's executor. See docs/score.md,
docs/video.md and docs/scale.md.
"""
from __future__ import annotations

from pathlib import Path

from capscore.commands import _shards
from capscore.commands._args import (
    abe_options, add_abe_arguments, add_device, add_metric, add_model, positive_int, refuse_input_as_output, seed,
)
from capscore.errors import CapscoreError
from capscore.pipeline import DEFAULT_MODEL
from capscore.scores.metric import get_metric


def configure(p) -> None:
    from capscore.scores.metric import metric_names

    add_model(p, default=DEFAULT_MODEL, help="backbone(s) of the metrics that encode images, e.g. ViT-B-32/openai, "
              "ckpt:PATH.pth, hf:DIR (see `capscore models`); several: --model A B; default "
              f"{DEFAULT_MODEL}; the text-only metrics (bleu1-4, meteor, rouge-l, cider, spice) load none")
    p.add_argument("--images", metavar="DIR|MANIFEST",
                   help="folder of images (id = file stem) or a CSV/JSONL manifest with 'id' and 'path'; not needed "
                        "when every --metric reads text only (bleu1-4, meteor, rouge-l, cider, spice)")
    p.add_argument("--videos", metavar="DIR|MANIFEST",
                   help="instead of --images: folder of videos (.mp4/.webm/.mkv/.avi/.gif/.webp or frame folders; "
                        "id = file stem) or a CSV/JSONL manifest; see docs/video.md")
    p.add_argument("--frames", default=None, metavar="SAMPLING",
                   help="--videos: frames scored per video: uniform:N, fps:R, every:K or all (default uniform:10)")
    p.add_argument("--idf", action="store_true",
                   help="--videos, EMScore-family metrics: idf token weights from the references (else the captions)")
    p.add_argument("--captions", nargs="+", metavar="FILE",
                   help="captions: JSON {image_id: caption | [captions]}, COCO results [{image_id, caption}], or "
                        "JSONL/CSV with image, caption[, refs, id, system]; several files = several systems "
                        "(named by file stem)")
    p.add_argument("--refs", metavar="FILE", help="references: JSON {image_id: [refs]}, COCO annotations "
                                                  "(captions_val2014.json: {images, annotations}), or JSONL/CSV "
                                                  "image, refs")
    add_metric(p, metric_names(), default=None,
               default_help="refclip-s when the captions carry references (--refs, a refs field or "
                            "--refs-column; emscore-ref for videos), else clip-s, or specs when every "
                            "--model is a SPECS checkpoint")
    classic = p.add_argument_group("classic metrics (bleu1-4, meteor, rouge-l, cider, spice; see docs/classic.md)")
    classic.add_argument("--classic-backend", choices=("native", "pycocoevalcap"), default="native",
                         help="BLEU, ROUGE-L and CIDEr-D computed natively on the PTB tokens (default; equal to "
                              "pycocoevalcap's to 1e-12) or by pycocoevalcap's own code")
    classic.add_argument("--tokenizer", choices=("ptb", "simple"), default="ptb",
                         help="ptb = COCO's PTB tokenizer (needs Java; default), simple = a Java-free approximation")
    learned = p.add_argument_group("metrics with their own models (polos, deneb, fleur, reffleur, expert; see "
                                   "docs/learned.md)")
    learned.add_argument("--metric-weights", metavar="DIR", default=None,
                         help="folder of the released checkpoints (default $CAPSCORE_METRIC_WEIGHTS or "
                              "~/.cache/capscore/metric-weights; `capscore doctor` lists what it holds)")
    learned.add_argument("--explain", action="store_true",
                         help="fleur, reffleur, expert: also ask the judge why, kept in the rows' explanation")
    p.add_argument("--prefix", default=None, metavar="TEXT",
                   help="text prepended to captions and references; default: the metric's own "
                        "('A photo depicts ' for the CLIP-S/PAC-S family on images, '' otherwise)")
    p.add_argument("--out", required=True, metavar="FILE|DIR",
                   help="results: .jsonl, .csv, .parquet, or .json (COCO results: [{image_id, caption, score, ...}]); "
                        "with sharded input also a folder (DIR/ or a name without suffix): one file per input "
                        "shard, --out-format")
    p.add_argument("--skip-bad", action="store_true",
                   help="write an error row for a bad item and go on (default: stop with an error)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run writing to --out")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_device(p)
    p.add_argument("--batch-size", type=positive_int, default=64, metavar="N", help="encoder batch size (default 64)")
    p.add_argument("--chunk-size", type=positive_int, default=2048, metavar="N",
                   help="rows written at once (default 2048; rows also reach the file every few seconds)")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cache-dir", metavar="DIR", help="embedding cache folder (default ~/.cache/capscore "
                                                          "or $CAPSCORE_CACHE)")
    cache.add_argument("--no-cache", action="store_true", help="keep embeddings in memory only")
    p.add_argument("--seed", type=seed, default=0, help="seed for random-init backbones (default 0)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom code of hf: models")
    p.add_argument("--rgb-order", default="first", choices=("first", "after-crop"),
                   help="when images become RGB: 'first' (default) or 'after-crop', the clipscore.py/pacscore "
                        "order (resize in the file's own mode; palette PNGs are then resized nearest-neighbour)")
    add_abe_arguments(p)
    p.add_argument("--context-length", type=positive_int, metavar="N",
                   help="text context: 248 stretches a 77-token CLIP tower with LongCLIP's knowledge-preserved "
                        "rule; smaller values truncate (default: the model's own)")
    _shards.add_arguments(p)  # --webdataset/--parquet/--hf-dataset and --engine ray


def job_from_args(args):
    """The typed job the flags describe: the flags are translated here, the job checks itself (its errors
    name parameters, which the command line spells as flags). The output is checked before the caption
    files are read; the inputs are indexed and checked before any model loads."""
    from capscore.data.sources import CaptionFiles
    from capscore.pipeline import Encoding, FileOutput, ScoreJob, ShardFolder, choose_metric, is_folder_output

    medium = "video" if args.videos else "image"
    if args.videos and (args.images or _shards.source_given(args)):
        raise CapscoreError("give --images or --videos, not both")
    text_only = bool(args.metric) and all(get_metric(m).text_only() for m in args.metric)
    source = _shards.source_from_args(args)  # which input flags (sharded shards are listed, not read)
    if args.engine == "ray" or is_folder_output(args.out):
        output = ShardFolder(Path(args.out), format=args.out_format, resume=args.resume, overwrite=args.overwrite)
    else:
        output = FileOutput(Path(args.out), resume=args.resume, overwrite=args.overwrite)  # a format we can write
    if source is None:
        if not ((args.images or args.videos or text_only) and args.captions):
            raise CapscoreError("give --images (or --videos) and --captions, or one of --webdataset, --parquet, "
                                "--hf-dataset" + ("" if args.captions else "; the text-only metrics (bleu1-4, meteor, "
                                                  "rouge-l, cider, spice) need --captions and --refs only"))
        refuse_input_as_output(args.out, {"--captions": args.captions, "--refs": args.refs,
                                          "--images": args.images or args.videos})
        source = CaptionFiles(args.images or args.videos, args.captions, args.refs, medium=medium).open()
    metric_choice = ""
    if args.metric:
        metrics = tuple(args.metric)
    else:
        name, metric_choice = choose_metric(source, medium, models=args.model)
        metrics = (name,)
    _check_refs(metrics, source)
    models = tuple(args.model)
    if all(get_metric(m).backbone_free() for m in metrics):
        if getattr(args, "_model_given", False):
            from capscore._log import warn

            why = "read text only" if all(get_metric(m).text_only() for m in metrics) else \
                "need no --model (their models come from --metric-weights)"
            warn(f"--model {' '.join(args.model)} is not loaded: {', '.join(metrics)} {why}")
        models = ()
    abe = abe_options(args)
    options = {"abe": abe} if abe else {}
    if any(get_metric(m).text_only() for m in metrics):
        options.update(tokenizer=args.tokenizer, classic_backend=args.classic_backend)
    if any(get_metric(m).own_models for m in metrics):
        if args.metric_weights:
            options["metric_weights"] = args.metric_weights
        if args.explain:
            options["explain"] = True
    elif args.metric_weights or args.explain:
        raise CapscoreError("--metric-weights and --explain apply to the metrics with their own models "
                            "(polos, deneb, fleur, reffleur, expert)")
    if args.frames:
        options["sampling"] = args.frames
    if args.idf:
        options["idf"] = True
    encoding = Encoding(device=args.device, dtype=args.dtype, seed=args.seed, context_length=args.context_length,
                        trust_remote_code=args.trust_remote_code, rgb_order=args.rgb_order,
                        batch_size=args.batch_size, cache_dir=args.cache_dir, cache=not args.no_cache)
    return ScoreJob(source=source, models=models, metrics=metrics, prefix=args.prefix, options=options,
                    output=output, skip_bad=args.skip_bad, encoding=encoding, chunk_size=args.chunk_size,
                    progress=not getattr(args, "quiet", False), metric_choice=metric_choice)


def _check_refs(metrics, source) -> None:
    """A text-only metric (BLEU, ..., all reference-based) or a reference-based one with its own models (polos,
    deneb, reffleur) over inputs that carry no reference at all: one line
    naming --refs, before anything is scored (the metrics that encode give each item's error row instead)."""
    need = [m for m in metrics if get_metric(m).needs_refs and get_metric(m).backbone_free()]
    if need and not source.has_refs():
        how = ("--refs-column NAME (the references of each sample)" if hasattr(source, "shards") else
               "--refs FILE (JSON {image_id: [refs]}, COCO annotations such as captions_val2014.json, or JSONL/CSV "
               "image, refs) or a 'refs' field in the captions")
        raise CapscoreError(f"{', '.join(need)} compare{'s' if len(need) == 1 else ''} each caption with its "
                            f"references, and the inputs carry none: give {how}")


def run(args) -> int:
    from capscore import pipeline

    job = job_from_args(args)
    executor = None
    if args.engine == "ray":  # source_from_args refuses --engine ray without a sharded source
        from capscore.engines.ray import RayExecutor

        executor = RayExecutor(_shards.ray_options(args))
    result = pipeline.run(job, executor=executor)
    print(pipeline.format_summary(result, job.output, quiet=getattr(args, "quiet", False)))
    if isinstance(job.output, pipeline.FileOutput):
        from capscore.meta.compare import score_system_tests  # several systems: paired tests between them

        if tests := score_system_tests(job, result):
            print(tests)
    return 0
