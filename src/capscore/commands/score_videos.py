"""``capscore score --videos``: score captions against videos, one row per caption, resumable.

The video branch of ``capscore score`` (see :mod:`capscore.commands.score`, which dispatches here
when ``--videos`` is given). Same inputs (captions JSON/JSONL/CSV, ``--refs``, several systems),
same outputs (.jsonl/.csv/.parquet written chunk by chunk, ``--resume``, ``--skip-bad``, progress,
summary), with the columns of :data:`capscore.report.writers.VIDEO_COLUMNS`: the final score and
its parts (coarse, fine P/R/F, and for reference-based metrics the chosen reference's coarse and
fine F). Metrics: :data:`capscore.scores.video.VIDEO_METRICS`. See docs/video.md.
"""
from __future__ import annotations

import time
from pathlib import Path

from capscore.errors import CapscoreError

DEFAULT_VIDEO_PREFIX = ""  # EMScore and the PAC-S video evaluation prepend nothing


def run_videos(args) -> int:
    import itertools

    from capscore.backbones import load_backbone
    from capscore.commands.score import DEFAULT_MODEL
    from capscore.data.captions import load_refs, read_captions
    from capscore.data.video import Sampling, index_videos
    from capscore.report.writers import VIDEO_COLUMNS, open_writer, output_format
    from capscore.scores.video import get_video_metric

    if getattr(args, "images", None):
        raise CapscoreError("give --images or --videos, not both")
    out = Path(args.out)
    output_format(out)
    metric = get_video_metric(args.metric)
    sampling = Sampling.parse(getattr(args, "frames", None) or "uniform:10")
    prefix = DEFAULT_VIDEO_PREFIX if args.prefix is None else args.prefix

    videos = index_videos(args.videos)
    refs = load_refs(args.refs) if args.refs else None
    stems = [Path(c).stem for c in args.captions]
    dup = next((s for s in stems if stems.count(s) > 1), None)
    if dup is not None:
        raise CapscoreError(f"two --captions files are named {dup!r}; the file stem names the system, so rename one")
    streams = [read_captions(c, images=videos, refs=refs) for c in args.captions]
    items = itertools.chain.from_iterable(streams)
    if getattr(args, "idf", False):
        items = list(items)  # the idf corpus is the whole input: read it before scoring

    backbone = load_backbone(args.model or DEFAULT_MODEL, device=args.device, dtype=args.dtype, seed=args.seed,
                             context_length=args.context_length, trust_remote_code=args.trust_remote_code)
    if metric.final != "clip-s" and not backbone.has_token_features:
        raise CapscoreError(f"{metric.name} needs per-token text features, which {args.model} does not expose; "
                            "use an open_clip/OpenAI-format model, or --metric clip-s")
    writer, prior = open_writer(out, resume=args.resume, overwrite=args.overwrite, columns=VIDEO_COLUMNS)
    try:
        return _run(args, backbone, out, items, writer, prior, metric, sampling, prefix)
    finally:
        if writer is not None:
            writer.close(complete=False)


def _run(args, backbone, out, items, writer, prior, metric, sampling, prefix) -> int:
    from capscore.commands.score import (
        _abs, _check_same_run, _chunks, _count_items, _print_summary, _skip_done, _summary_dict, _write_json,
        summary_path,
    )
    from capscore.data.captions import BadItem
    from capscore.data.records import Record
    from capscore.embed.cache import EmbeddingCache
    from capscore.embed.engine import Encoder, MemoryCache
    from capscore.report.writers import VIDEO_COLUMNS, read_rows
    from capscore.scores.scorer import Summary
    from capscore.scores.video import corpus_idf, score_video_records

    quiet = getattr(args, "quiet", False)
    config = {"model": args.model, "backbone": backbone.identity, "metric": metric.name, "prefix": prefix,
              "videos": _abs(args.videos), "frames": str(sampling), "idf": bool(getattr(args, "idf", False)),
              "captions": [_abs(c) for c in args.captions], "refs": _abs(args.refs) if args.refs else None,
              "dtype": args.dtype}
    spath = summary_path(out)
    if prior is not None:
        _check_same_run(spath, config)
    _write_json(spath, {"status": "running", **config})
    cache = MemoryCache() if args.no_cache else EmbeddingCache(args.cache_dir)
    encoder = Encoder(backbone, batch_size=args.batch_size, cache=cache, progress=False)
    idf = None
    if config["idf"]:
        recs = [x for x in items if isinstance(x, Record)]
        corpus = [prefix + r for x in recs for r in x.refs] or [prefix + x.caption for x in recs
                                                               if isinstance(x.caption, str)]
        idf = corpus_idf(encoder, corpus)  # EMScore's default: the references, else the candidates
        items = iter(items)

    summary = Summary(metric=metric.name)
    t0 = time.perf_counter()
    from capscore._log import open_bar

    bar = None if quiet else open_bar(_count_items(args.captions), desc="scoring", unit="caption")
    resumed = 0
    if prior is not None:
        items, resumed = _skip_done(items, read_rows(prior, VIDEO_COLUMNS), summary, prior)
        if bar is not None:
            bar.update(resumed)
    scored = 0
    for chunk in _chunks(items, args.chunk_size):
        if writer is None:
            raise CapscoreError(f"{out} is a finished Parquet file with fewer rows than the inputs have captions; "
                                "use --overwrite to score again")
        fatal = None
        if not args.skip_bad:
            k = next((i for i, x in enumerate(chunk) if isinstance(x, BadItem)), None)
            if k is not None:
                chunk, fatal = chunk[:k], chunk[k].as_error()
        records = [x for x in chunk if isinstance(x, Record)]
        # an InputError here (without --skip-bad) leaves this chunk unwritten; --resume redoes it
        scored_rows = iter(list(score_video_records(records, encoder, metric, sampling=sampling, prefix=prefix,
                                                    idf=idf, chunk_size=max(1, len(records)),
                                                    skip_bad=args.skip_bad)))
        rows = [_bad_row(x) if isinstance(x, BadItem) else next(scored_rows) for x in chunk]
        writer.write(rows)
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
    st = encoder.stats
    result = {"status": "complete", **config, **_summary_dict(summary), "resumed_rows": resumed,
              "scored_now": scored, "seconds": round(time.perf_counter() - t0, 3),
              "videos_encoded": st.videos_encoded, "videos_cached": st.videos_cached,
              "frames_encoded": st.frames_encoded, "decode_seconds": round(st.decode_seconds, 3),
              "encode_seconds": round(st.encode_seconds, 3), "truncated_captions": st.truncated}
    _write_json(summary_path(out), result)
    _print_summary([result], out, summary_path(out))
    if not quiet:
        print(f"videos: {st.videos_encoded} decoded and encoded ({st.frames_encoded} frames, {sampling}), "
              f"{st.videos_cached} from the cache")
    return 0


def _bad_row(bad) -> dict:
    from capscore.report.writers import VIDEO_COLUMNS

    row = dict.fromkeys(VIDEO_COLUMNS)
    row.update(id=bad.id, video=bad.image, caption=bad.caption, system=bad.system, error=bad.error)
    return row
