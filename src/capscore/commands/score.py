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
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from capscore.commands import _shards
from capscore.commands._args import add_device, add_metric, add_model, positive_int, refuse_input_as_output
from capscore._log import warn
from capscore.errors import CapscoreError, InputError

METRIC_CHOICES = ("clip-s", "refclip-s", "pac-s", "refpac-s", "mcs", "abe")
VIDEO_METRIC_CHOICES = ("clip-s", "pac-s", "refpac-s", "emscore", "emscore-ref")  # with --videos (docs/video.md)
DEFAULT_MODEL = "scenes-tiny"


def configure(p) -> None:
    add_model(p, default=DEFAULT_MODEL)
    p.add_argument("--images", metavar="DIR|MANIFEST",
                   help="folder of images (id = file stem) or a CSV/JSONL manifest with 'id' and 'path'")
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
    p.add_argument("--refs", metavar="FILE", help="references: JSON {image_id: [refs]}, COCO captions_*.json, "
                                                  "or JSONL/CSV image, refs")
    add_metric(p, tuple(dict.fromkeys(METRIC_CHOICES + VIDEO_METRIC_CHOICES)))
    p.add_argument("--prefix", default=None, metavar="TEXT",
                   help="text prepended to captions and references; default: the metric's own "
                        "('A photo depicts ' for the CLIP-S/PAC-S family, '' for mcs and abe)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="results: .jsonl, .csv, .parquet, or .json (COCO results: [{image_id, caption, score, ...}])")
    p.add_argument("--skip-bad", action="store_true",
                   help="write an error row for a bad item and go on (default: stop with an error)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run writing to --out")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_device(p)
    p.add_argument("--batch-size", type=positive_int, default=64, metavar="N", help="encoder batch size (default 64)")
    p.add_argument("--chunk-size", type=positive_int, default=2048, metavar="N",
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
    p.add_argument("--context-length", type=positive_int, metavar="N",
                   help="text context: 248 stretches a 77-token CLIP tower with LongCLIP's knowledge-preserved "
                        "rule; smaller values truncate (default: the model's own)")
    _shards.add_arguments(p)  # --webdataset/--parquet/--hf-dataset and --engine ray (issue 15)


def summary_path(out: Path) -> Path:
    return out.with_name(out.name + ".summary.json")


def run(args) -> int:
    from capscore.backbones import load_backbone
    from capscore.data.captions import index_images, load_refs, read_captions
    from capscore.report.writers import COLUMNS, open_writer, output_format
    from capscore.scores.scorer import COMPONENTS

    # --batch-size/--chunk-size ranges are checked by argparse (positive_int)
    if args.resume and args.overwrite:
        raise CapscoreError("--resume and --overwrite contradict each other; choose one")
    if getattr(args, "videos", None):
        from capscore.commands.score_videos import run_videos

        for flag in ("model", "metric"):  # video scoring takes one of each
            if len(getattr(args, flag)) > 1:
                raise CapscoreError(f"--videos scores with one --{flag}; got {' '.join(getattr(args, flag))}")
            setattr(args, flag, getattr(args, flag)[0])
        return run_videos(args)
    if not (args.images or args.webdataset or args.parquet or args.hf_dataset):
        raise CapscoreError("give --images DIR|MANIFEST (or --videos DIR|MANIFEST, or --webdataset, --parquet, "
                            "--hf-dataset)")
    video_only = [m for m in args.metric if m not in METRIC_CHOICES]
    if video_only:
        raise CapscoreError(f"--metric {video_only[0]} scores videos; use it with --videos")
    if getattr(args, "frames", None) or getattr(args, "idf", False):
        raise CapscoreError("--frames and --idf apply to --videos only")
    out = Path(args.out)
    if args.engine != "ray":  # --engine ray writes a folder of per-shard files
        output_format(out)
    refuse_input_as_output(out, {"--captions": args.captions, "--refs": args.refs, "--images": args.images})
    metrics = {m: _metric(m, args.prefix) for m in args.metric}  # name -> (MetricSpec | None, prefix)
    from capscore.commands.probe import abe_options

    args.abe = abe_options(args)
    if args.abe and "abe" not in metrics:
        raise CapscoreError("--abe-k/--abe-p/--abe-omega/--concept-pool apply to --metric abe only")

    # inputs: whole-file problems surface here, before any model is loaded
    source = _shards.source_from_args(args)
    if source is not None and args.engine == "ray":
        from capscore.engines.ray import run_score

        for flag in ("model", "metric"):  # the Ray pipeline scores with one of each
            if len(getattr(args, flag)) > 1:
                raise CapscoreError(f"--engine ray scores with one --{flag}; got {' '.join(getattr(args, flag))}")
            setattr(args, flag, getattr(args, flag)[0])
        spec, prefix = metrics[args.metric]
        return run_score(args, source, metric=spec, prefix=prefix)
    if source is not None:
        def items() -> Iterator:  # a fresh pass over the inputs, once per (model, metric)
            return source.items()
    else:
        if not (args.images and args.captions):
            raise CapscoreError("give --images and --captions, or one of --webdataset, --parquet, --hf-dataset")
        images = index_images(args.images)
        refs = load_refs(args.refs) if args.refs else None
        stems = [Path(c).stem for c in args.captions]
        dup = next((s for s in stems if stems.count(s) > 1), None)
        if dup is not None:
            raise CapscoreError(f"two --captions files are named {dup!r}; the file stem names the system, "
                                "so rename one")

        def items() -> Iterator:  # a fresh pass over the inputs, once per (model, metric)
            # a list, not a generator: read_captions checks the whole file when called
            return itertools.chain.from_iterable([read_captions(c, images=images, refs=refs) for c in args.captions])

        items()  # whole-file checks now, not after the models load
    backbones = {m: load_backbone(m, device=args.device, dtype=args.dtype, seed=args.seed,
                                  context_length=args.context_length, trust_remote_code=args.trust_remote_code,
                                  rgb_order=getattr(args, "rgb_order", "first"))
                 for m in args.model}  # before touching --out
    for b in backbones.values():
        for name in metrics:
            warn_metric_fit(name, b)
    # every row names its model and metric (COLUMNS), so --resume can refuse a mix even without the summary
    columns = COLUMNS + (COMPONENTS if any(spec is not None and spec.needs_refs for spec, _ in metrics.values()) else ())
    writer, prior = open_writer(out, resume=args.resume, overwrite=args.overwrite, columns=columns)
    try:
        return _run(args, backbones, metrics, out, items, writer, prior, columns, source)
    finally:
        if writer is not None:
            writer.close(complete=False)  # no-op after a successful close
            if prior is None and writer.rows_written == 0 and summary_path(out).exists():
                _drop_running_summary(summary_path(out))


def _drop_running_summary(spath: Path) -> None:
    """A first run that failed before writing a row leaves neither output nor summary behind."""
    try:
        if json.loads(spath.read_text(encoding="utf-8")).get("status") == "running":
            spath.unlink()
    except (OSError, ValueError):
        pass


def warn_metric_fit(metric: str, backbone) -> None:
    """Warn (once, by name) when a metric is computed on weights it was not made for.

    MCS (PR-MCS) is CLIP-S over a *multilingual* text encoder (``mclip:``);
    PAC-S/RefPAC-S use w = 2.0, calibrated for the PAC-S fine-tuned weights
    (recognised by 'pac' in the model name). The numbers are still computed.
    """
    spec = getattr(backbone, "spec", "?")
    if metric == "mcs" and getattr(backbone, "family", "") != "mclip":
        warn(f"--metric mcs expects a multilingual backbone (mclip:DIR); {spec} is not one, so these are "
             "monolingual CLIP-S scores without the prefix")
    elif metric in ("pac-s", "refpac-s") and "pac" not in spec.lower():
        warn(f"--metric {metric} uses w=2.0, calibrated for PAC-S weights; {spec} does not look like a PAC-S "
             "checkpoint ('pac' not in its name), so the scale is not PAC-S's")


def _metric(name: str, prefix: str | None):
    """(MetricSpec, prefix); None for ABE-CLIP, which is a pair scorer, not a CLIPScore formula."""
    from capscore.scores.clipscore import get_metric, resolve_prefix

    return (None if name == "abe" else get_metric(name)), resolve_prefix(name, prefix)


def _one(values: list):
    return values[0] if len(values) == 1 else values


def _run(args, backbones, metrics, out, items, writer, prior, columns, source=None) -> int:
    from capscore._log import progress
    from capscore.embed.cache import EmbeddingCache
    from capscore.embed.engine import Encoder, MemoryCache
    from capscore.report.writers import read_rows
    from capscore.scores.scorer import Summary

    combos = [(m, name) for m in backbones for name in metrics]
    config = {
        "model": _one(list(backbones)), "backbone": _one([b.identity for b in backbones.values()]),
        "metric": _one(list(metrics)), "prefix": _one([p for _, p in metrics.values()]), "dtype": args.dtype,
    }
    if source is None:
        config.update(images=_abs(args.images), captions=[_abs(c) for c in args.captions],
                      refs=_abs(args.refs) if args.refs else None)
    else:
        config.update(source.describe())
    if "abe" in metrics:  # ABE-CLIP: its configuration decides the numbers
        from capscore.scores.abe import make_config

        cfg = make_config(**getattr(args, "abe", {}))
        config["abe"] = {"k": cfg.k, "p": cfg.p, "omega": cfg.omega,
                         "pool": _abs(cfg.pool) if cfg.pool else "bundled"}
    spath = summary_path(out)
    if prior is not None:
        _check_same_run(spath, config)
    _write_json(spath, {"status": "running", **config})
    cache = MemoryCache() if args.no_cache else EmbeddingCache(args.cache_dir)
    encoders = {m: Encoder(b, batch_size=args.batch_size, cache=cache, progress=False) for m, b in backbones.items()}
    t0 = time.perf_counter()
    prior_rows = _Peek(read_rows(prior, columns)) if prior is not None else None
    runs, resumed, scored = [], 0, 0
    per_input = _count_items(args.captions) if source is None else None
    with progress(None if per_input is None else per_input * len(combos), desc="scoring", unit="caption") as bar:
        for model, name in combos:
            spec, prefix = metrics[name]
            tag = {"model": model, "metric": name}
            score_chunk = (_abe_chunk_scorer(prefix, **getattr(args, "abe", {})) if spec is None
                           else _clip_chunk_scorer(spec, prefix))
            summary = Summary(metric=name)
            todo = items()
            if prior_rows is not None:
                _check_prior_tag(prior_rows.peek(), tag, prior, resumed + 1)  # before anything is appended
                mine = prior_rows.take_while(lambda r: all(r.get(k) == v for k, v in tag.items()))
                todo, n = _skip_done(todo, mine, summary, prior)
                resumed += n
                bar.update(n)
            for chunk in _chunks(todo, args.chunk_size):
                if writer is None:
                    raise CapscoreError(f"{out} is a finished {writer_kind(out)} file with fewer rows than the inputs "
                                        "have captions; use --overwrite to score again")
                rows, fatal = [], None
                for part in _chunks(iter(chunk), args.batch_size):  # progress per batch; writes per chunk
                    got, fatal = score_chunk(part, encoders[model], skip_bad=args.skip_bad)
                    rows += [r | tag for r in got]
                    bar.update(len(got))
                    if fatal is not None:
                        break
                writer.write(rows)  # the rows before a fatal error are kept, so --resume can continue after a fix
                for row in rows:
                    summary.add(row)
                scored += len(rows)
                if fatal is not None:
                    raise fatal
            runs.append({"model": model, "backbone": backbones[model].identity, **_summary_dict(summary)})
    if prior_rows is not None and prior_rows.peek() is not None:
        _check_prior_tag(prior_rows.peek(), None, prior, resumed + 1)
        raise CapscoreError(f"--resume: {prior} has more rows than the inputs have captions; "
                            "the inputs changed — use --overwrite to start again")
    if scored == 0 and resumed == 0:
        where = ", ".join(args.captions) if source is None else source.spec
        raise CapscoreError(f"no captions in {where}; nothing to score")
    if writer is not None:
        writer.close(complete=True)
    elapsed = time.perf_counter() - t0
    totals = {"resumed_rows": resumed, "scored_now": scored, "seconds": round(elapsed, 3),
              "truncated_captions": sum(e.stats.truncated for e in encoders.values())}
    if len(runs) == 1:
        result = {"status": "complete", **config, **{k: v for k, v in runs[0].items() if k not in config}, **totals}
    else:
        result = {"status": "complete", **config, "runs": runs, **totals}
    _write_json(spath, result)
    _print_summary(runs, out, spath)
    return 0


def writer_kind(out: Path) -> str:
    return "COCO results" if out.suffix.lower() == ".json" else "Parquet"


class _Peek:
    """An iterator with one-item lookahead, to hand each (model, metric) its share of the earlier rows."""

    _END = object()

    def __init__(self, it):
        self._it = iter(it)
        self._next = next(self._it, self._END)

    def peek(self):
        return None if self._next is self._END else self._next

    def take_while(self, pred):
        while self._next is not self._END and pred(self._next):
            item, self._next = self._next, next(self._it, self._END)
            yield item


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


def _check_prior_tag(row: dict | None, tag: dict | None, prior: Path, n: int) -> None:
    """The next earlier row (row ``n`` of ``prior``) must belong to the (model, metric) about to run:
    never mix models or metrics, even when the summary file was lost."""
    if row is None or (tag is not None and all(row.get(k) == v for k, v in tag.items())):
        return
    got = f"model {row.get('model')!r}, metric {row.get('metric')!r}"
    want = "" if tag is None else f", and this run asks for model {tag['model']!r}, metric {tag['metric']!r}"
    raise CapscoreError(f"--resume: row {n} of {prior} was scored with {got}{want}; use the same --model and "
                        "--metric, or --overwrite to start again")


def _skip_done(items: Iterator, rows: Iterable[dict], summary, prior: Path,
               run: dict | None = None) -> tuple[Iterator, int]:
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
        for key, now in (run or {}).items():  # the rows say what scored them: never mix models or metrics
            if row.get(key) != now:
                raise CapscoreError(f"--resume: row {n} of {prior} was scored with {key} {row.get(key)!r}, and this "
                                    f"run asks for {now!r}; use the same --{key}, or --overwrite to start again")
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
    from capscore.scores.scorer import score_pair_records

    def score(chunk: list, encoder, *, skip_bad: bool):
        chunk, fatal = _split_at_fatal(chunk, skip_bad)
        records = [x for x in chunk if isinstance(x, Record)]
        try:
            scored = score_pair_records(records, encoder, "abe", prefix=prefix, skip_bad=skip_bad, **abe_options)
        except InputError as e:
            return [], e  # the chunk is redone on --resume
        return _merge(chunk, scored), fatal

    return score


# ------------------------------------------------------------------------------------ output
def _count_items(captions) -> int | None:
    """How many captions the inputs hold, for the progress bar's total and ETA (None when unknown).

    JSON files are parsed (they are loaded whole anyway); JSONL/CSV lines are
    counted (approximate: blank lines, quoted newlines).
    """
    if not captions:
        return None
    total = 0
    for c in captions:
        p = Path(c)
        suffix = p.suffix.lower()
        if not p.is_file():  # stdin, a pipe: counting would consume it (the reader reads it once)
            return None
        try:
            if suffix == ".json":
                data = json.loads(p.read_text(encoding="utf-8-sig"))
                total += len(data) if isinstance(data, list) else sum(
                    len(v) if isinstance(v, list) else 1 for v in data.values())
                continue
            if suffix not in (".jsonl", ".csv"):
                return None
            with open(p, "rb") as f:
                lines = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
        except (OSError, ValueError, AttributeError, RecursionError):
            return None  # the reader reports what is wrong with the file
        total += lines - (suffix == ".csv")
    return total


def _summary_dict(summary) -> dict:
    d = summary.as_dict()
    d["mean"] = None if summary.count == 0 else d["mean"]
    d["system_counts"] = {k: n for k, (_, n) in sorted(summary.systems.items())}
    return d


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def _print_summary(runs: list[dict], out: Path, spath: Path) -> None:
    from capscore.report.tables import format_table

    several = len(runs) > 1
    table = []
    for r in runs:
        mean = "n/a" if r["mean"] is None else f"{r['mean']:.4f}"
        print(f"{r['metric']} with {r['model']}: {r['count']} scored, {r['skipped']} skipped, mean {mean}")
        head = {"model": r["model"], "metric": r["metric"]} if several else {}
        if len(r["systems"]) > 1 or any(r["systems"]):
            table += [{**head, "system": name, "mean": m, "count": r["system_counts"][name]}
                      for name, m in r["systems"].items()]
        elif several:
            table.append({**head, "system": "", "mean": r["mean"], "count": r["count"]})
    if table:
        print(format_table(table))
    print(f"rows: {out}  summary: {spath}")
