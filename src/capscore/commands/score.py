"""``capscore score``: score caption files against images, one row per caption, resumable.

The shell around :func:`capscore.scores.scorer.score_records` (CLIP-S family)
and the ABE-CLIP pair scorer: it reads the inputs lazily
(:mod:`capscore.data.captions`), scores them chunk by chunk, appends each
chunk's rows to the output and flushes (:mod:`capscore.report.writers`), and
keeps a running :class:`~capscore.scores.scorer.Summary`. See docs/score.md.
"""
from __future__ import annotations

import itertools
import json
import math
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from capscore.errors import CapscoreError, InputError

METRIC_CHOICES = ("clip-s", "refclip-s", "pac-s", "refpac-s", "mcs", "abe")
VIDEO_METRIC_CHOICES = ("clip-s", "pac-s", "refpac-s", "emscore", "emscore-ref")  # with --videos (docs/video.md)
DEFAULT_MODEL = "scenes-tiny"


def configure(p) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="backbone, e.g. ViT-B-32/openai, ckpt:PATH.pth, hf:DIR (see `capscore models`); "
                        f"default {DEFAULT_MODEL}")
    p.add_argument("--images", metavar="DIR|MANIFEST",
                   help="folder of images (id = file stem) or a CSV/JSONL manifest with 'id' and 'path'")
    p.add_argument("--videos", metavar="DIR|MANIFEST",
                   help="instead of --images: folder of videos (.mp4/.webm/.mkv/.avi/.gif/.webp or frame folders; "
                        "id = file stem) or a CSV/JSONL manifest; see docs/video.md")
    p.add_argument("--frames", default=None, metavar="SAMPLING",
                   help="--videos: frames scored per video: uniform:N, fps:R, every:K or all (default uniform:10)")
    p.add_argument("--idf", action="store_true",
                   help="--videos, EMScore-family metrics: idf token weights from the references (else the captions)")
    p.add_argument("--captions", required=True, nargs="+", metavar="FILE",
                   help="captions: JSON {image_id: caption}, or JSONL/CSV with image, caption[, refs, id, system]; "
                        "several files = several systems (named by file stem)")
    p.add_argument("--refs", metavar="FILE", help="references: JSON {image_id: [refs]} (or JSONL/CSV image, refs)")
    p.add_argument("--metric", default="clip-s", choices=tuple(dict.fromkeys(METRIC_CHOICES + VIDEO_METRIC_CHOICES)),
                   help="default clip-s; with --videos: " + ", ".join(VIDEO_METRIC_CHOICES))
    p.add_argument("--prefix", default=None, metavar="TEXT",
                   help="text prepended to captions and references; default: the metric's own "
                        "('A photo depicts ' for the CLIP-S/PAC-S family, '' for mcs and abe)")
    p.add_argument("--out", required=True, metavar="FILE", help="results: .jsonl, .csv or .parquet")
    p.add_argument("--skip-bad", action="store_true",
                   help="write an error row for a bad item and go on (default: stop with an error)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run writing to --out")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"), help="default fp32")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="encoder batch size (default 64)")
    p.add_argument("--chunk-size", type=int, default=2048, metavar="N",
                   help="captions scored and written per chunk (default 2048)")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cache-dir", metavar="DIR", help="embedding cache folder (default ~/.cache/capscore "
                                                          "or $CAPSCORE_CACHE)")
    cache.add_argument("--no-cache", action="store_true", help="keep embeddings in memory only")
    p.add_argument("--seed", type=int, default=0, help="seed for random-init backbones (default 0)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom code of hf: models")
    p.add_argument("--rgb-order", default="first", choices=("first", "after-crop"),
                   help="when images become RGB: 'first' (default) or 'after-crop', the clipscore.py/pacscore "
                        "order (resize in the file's own mode; palette PNGs are then resized nearest-neighbour)")
    from capscore.commands.probe import add_abe_arguments

    add_abe_arguments(p)
    p.add_argument("--context-length", type=int, metavar="N",
                   help="text context: 248 stretches a 77-token CLIP tower with LongCLIP's knowledge-preserved "
                        "rule; smaller values truncate (default: the model's own)")


def summary_path(out: Path) -> Path:
    return out.with_name(out.name + ".summary.json")


def run(args) -> int:
    from capscore.backbones import load_backbone
    from capscore.data.captions import index_images, load_refs, read_captions
    from capscore.report.writers import open_writer, output_format, read_rows

    if getattr(args, "videos", None):
        from capscore.commands.score_videos import run_videos

        return run_videos(args)
    if not args.images:
        raise CapscoreError("give --images DIR|MANIFEST (or --videos DIR|MANIFEST)")
    if args.metric not in METRIC_CHOICES:
        raise CapscoreError(f"--metric {args.metric} scores videos; use it with --videos")
    if getattr(args, "frames", None) or getattr(args, "idf", False):
        raise CapscoreError("--frames and --idf apply to --videos only")
    for name in ("batch_size", "chunk_size"):
        if getattr(args, name) < 1:
            raise CapscoreError(f"--{name.replace('_', '-')} must be a positive integer; got {getattr(args, name)}")
    if args.resume and args.overwrite:
        raise CapscoreError("--resume and --overwrite contradict each other; choose one")
    out = Path(args.out)
    output_format(out)
    metric, default_prefix = _metric(args.metric)
    from capscore.commands.probe import abe_options

    args.abe = abe_options(args)
    if args.abe and args.metric != "abe":
        raise CapscoreError("--abe-k/--abe-p/--abe-omega/--concept-pool apply to --metric abe only")
    prefix = default_prefix if args.prefix is None else args.prefix

    # inputs: whole-file problems surface here, before any model is loaded
    images = index_images(args.images)
    refs = load_refs(args.refs) if args.refs else None
    stems = [Path(c).stem for c in args.captions]
    dup = next((s for s in stems if stems.count(s) > 1), None)
    if dup is not None:
        raise CapscoreError(f"two --captions files are named {dup!r}; the file stem names the system, "
                            "so rename one")
    streams = [read_captions(c, images=images, refs=refs) for c in args.captions]
    items: Iterator = itertools.chain.from_iterable(streams)

    backbone = load_backbone(args.model, device=args.device, dtype=args.dtype, seed=args.seed,
                             context_length=args.context_length,
                             trust_remote_code=args.trust_remote_code,
                             rgb_order=getattr(args, "rgb_order", "first"))  # before touching --out
    writer, prior = open_writer(out, resume=args.resume, overwrite=args.overwrite)
    try:
        return _run(args, backbone, out, items, writer, prior, metric, prefix, read_rows)
    finally:
        if writer is not None:
            writer.close(complete=False)  # no-op after a successful close


def _metric(name: str):
    """(MetricSpec, default prefix); None for ABE-CLIP, which is a pair scorer, not a CLIPScore formula."""
    if name == "abe":
        return None, ""
    from capscore.scores.clipscore import get_metric

    spec = get_metric(name)
    return spec, spec.default_prefix


def _run(args, backbone, out, items, writer, prior, metric, prefix, read_rows) -> int:
    from capscore.embed.cache import EmbeddingCache
    from capscore.embed.engine import Encoder, MemoryCache
    from capscore.scores.scorer import Summary

    quiet = getattr(args, "quiet", False)
    config = {
        "model": args.model, "backbone": backbone.identity, "metric": args.metric, "prefix": prefix,
        "images": _abs(args.images), "captions": [_abs(c) for c in args.captions],
        "refs": _abs(args.refs) if args.refs else None, "dtype": args.dtype,
    }
    if metric is None:  # ABE-CLIP: its configuration decides the numbers
        from capscore.scores.abe import make_config

        cfg = make_config(**getattr(args, "abe", {}))
        config["abe"] = {"k": cfg.k, "p": cfg.p, "omega": cfg.omega,
                         "pool": _abs(cfg.pool) if cfg.pool else "bundled"}
    spath = summary_path(out)
    if prior is not None:
        _check_same_run(spath, config)
    _write_json(spath, {"status": "running", **config})
    cache = MemoryCache() if args.no_cache else EmbeddingCache(args.cache_dir)
    encoder = Encoder(backbone, batch_size=args.batch_size, cache=cache, progress=False)
    score_chunk = (_abe_chunk_scorer(prefix, **getattr(args, "abe", {})) if metric is None
                   else _clip_chunk_scorer(metric, prefix))

    summary = Summary(metric=args.metric)
    t0 = time.perf_counter()
    bar = None if quiet else _progress(args.captions)
    resumed = 0
    if prior is not None:
        items, resumed = _skip_done(items, read_rows(prior), summary, prior)
        if bar is not None:
            bar.update(resumed)
    scored = 0
    for chunk in _chunks(items, args.chunk_size):
        if writer is None:
            raise CapscoreError(f"{out} is a finished Parquet file with fewer rows than the inputs have captions; "
                                "use --overwrite to score again")
        rows, fatal = score_chunk(chunk, encoder, skip_bad=args.skip_bad)
        writer.write(rows)  # the rows before a fatal error are kept, so --resume can continue after a fix
        for row in rows:
            summary.add(row)
        scored += len(rows)
        if bar is not None:
            bar.update(len(rows))
        if fatal is not None:
            raise fatal
    if bar is not None:
        bar.close()
    if writer is not None:
        writer.close(complete=True)
    elapsed = time.perf_counter() - t0
    result = {"status": "complete", **config, **_summary_dict(summary), "resumed_rows": resumed,
              "scored_now": scored, "seconds": round(elapsed, 3),
              "truncated_captions": encoder.stats.truncated}
    _write_json(spath, result)
    _print_summary(result, out, spath)
    return 0


# ------------------------------------------------------------------------------------ resume
def _abs(path) -> str:
    return str(Path(path).expanduser().resolve())


def _check_same_run(spath: Path, config: dict) -> None:
    if not spath.exists():
        return
    try:
        before = json.loads(spath.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return  # written atomically; an unreadable one is not ours to judge
    for key, now in config.items():
        if key in before and before[key] != now:
            raise CapscoreError(f"--resume: {key} was {before[key]!r} in the interrupted run and is {now!r} now; "
                                "use the same settings, or --overwrite to start again")


def _skip_done(items: Iterator, rows: Iterable[dict], summary, prior: Path) -> tuple[Iterator, int]:
    """Match the rows already written, in order, against the inputs; returns (remaining items, count).

    Rows are written in input order, so the first N items are done exactly when
    the N rows carry their (system, id): nothing is scored twice or left out.
    """
    n = 0
    for n, row in enumerate(rows, 1):
        item = next(items, None)
        if item is None:
            raise CapscoreError(f"--resume: {prior} has more rows than the inputs have captions (row {n}); "
                                "the inputs changed — use --overwrite to start again")
        if (str(row["system"]), str(row["id"])) != (item.system, item.id):
            raise CapscoreError(f"--resume: row {n} of {prior} is {row['system']}/{row['id']} but input item {n} "
                                f"is {item.system}/{item.id}; the inputs changed — use --overwrite to start again")
        summary.add(row)
    return items, n


# ------------------------------------------------------------------------------------ scoring a chunk
def _chunks(items: Iterator, size: int) -> Iterator[list]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk


def _bad_row(bad) -> dict:
    return {"id": bad.id, "image": bad.image, "caption": bad.caption, "system": bad.system, "score": None,
            "error": bad.error}


def _split_at_fatal(chunk: list, skip_bad: bool):
    """Without --skip-bad, only the items before the first load-time bad item are scored."""
    from capscore.data.captions import BadItem

    if skip_bad:
        return chunk, None
    k = next((i for i, x in enumerate(chunk) if isinstance(x, BadItem)), None)
    return (chunk, None) if k is None else (chunk[:k], chunk[k].as_error())


def _merge(chunk: list, scored: Iterable[dict]) -> list[dict]:
    from capscore.data.captions import BadItem

    it = iter(scored)
    return [_bad_row(x) if isinstance(x, BadItem) else next(it) for x in chunk]


def _clip_chunk_scorer(spec, prefix: str):
    from capscore.data.records import Record
    from capscore.scores.scorer import score_records

    def score(chunk: list, encoder, *, skip_bad: bool):
        chunk, fatal = _split_at_fatal(chunk, skip_bad)
        records = [x for x in chunk if isinstance(x, Record)]
        try:
            scored = list(score_records(records, encoder, spec, prefix=prefix, chunk_size=max(1, len(records)),
                                        skip_bad=skip_bad))
        except InputError as e:
            return [], e  # the chunk is redone on --resume
        return _merge(chunk, scored), fatal

    return score


def _abe_chunk_scorer(prefix: str, **abe_options):
    from capscore.data.records import Record
    from capscore.scores.pairs import get_pair_scorer

    scorer = get_pair_scorer("abe", **abe_options)  # imports capscore.scores.abe lazily

    def score(chunk: list, encoder, *, skip_bad: bool):
        chunk, fatal = _split_at_fatal(chunk, skip_bad)
        records = [x for x in chunk if isinstance(x, Record)]
        errors: dict[int, str] = {}
        for i, rec in enumerate(records):
            where = rec.source or f"item {rec.id}"
            if not isinstance(rec.caption, str):
                errors[i] = str(InputError(where, "caption is not a string", got=rec.caption))
            elif not rec.caption.strip():
                errors[i] = str(InputError(where, "empty caption"))
        if errors and not skip_bad:
            return [], CapscoreError(errors[min(errors)])
        good = [i for i in range(len(records)) if i not in errors]
        img_err: dict[int, str] | None = {} if skip_bad else None
        try:  # checks (and caches) every image, so one bad file becomes one error row
            encoder.encode_images([records[i].image for i in good], errors=img_err)
        except InputError as e:
            return [], e
        for j, msg in (img_err or {}).items():
            errors[good[j]] = msg
        good = [i for i in good if i not in errors]
        values = scorer(encoder, [records[i].image for i in good], [prefix + records[i].caption for i in good])
        by_index = dict(zip(good, values.tolist() if hasattr(values, "tolist") else list(values)))
        scored = []
        for i, rec in enumerate(records):
            s = by_index.get(i)
            ok = s is not None and math.isfinite(s)
            scored.append({"id": rec.id, "image": str(rec.image.path) if rec.image.path else rec.image.where(),
                           "caption": rec.caption if isinstance(rec.caption, str) else repr(rec.caption),
                           "system": rec.system, "score": float(s) if ok else None,
                           "error": None if ok else errors.get(i, "could not be scored")})
        return _merge(chunk, scored), fatal

    return score


# ------------------------------------------------------------------------------------ output
def _progress(captions):
    from tqdm.auto import tqdm

    total = 0
    for c in captions:
        p = Path(c)
        if p.suffix.lower() not in (".jsonl", ".csv"):
            total = None
            break
        with open(p, "rb") as f:
            lines = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
        total += lines - (p.suffix.lower() == ".csv")  # approximate: blank lines, quoted newlines
    return tqdm(total=total, desc="scoring", unit="caption", file=sys.stderr, dynamic_ncols=True)


def _summary_dict(summary) -> dict:
    d = summary.as_dict()
    d["mean"] = None if summary.count == 0 else d["mean"]
    d["system_counts"] = {k: n for k, (_, n) in sorted(summary.systems.items())}
    return d


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def _print_summary(result: dict, out: Path, spath: Path) -> None:
    mean = "n/a" if result["mean"] is None else f"{result['mean']:.4f}"
    print(f"{result['metric']} with {result['model']}: {result['count']} scored, {result['skipped']} skipped, "
          f"mean {mean}")
    if len(result["systems"]) > 1 or any(result["systems"]):
        width = max(len(s) for s in result["systems"]) if result["systems"] else 6
        print(f"  {'system':{width}s}  {'mean':>8s}  {'count':>7s}")
        for name, m in result["systems"].items():
            print(f"  {name:{width}s}  {m:8.4f}  {result['system_counts'][name]:7d}")
    print(f"rows: {out}  summary: {spath}")
