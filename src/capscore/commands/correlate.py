"""``capscore correlate``: how well metrics agree with human judgments (meta-evaluation).

Two modes:

* ``--dataset NAME --path P --images DIR --model M [M2 ...] --metric clip-s [refclip-s ...]`` scores the
  dataset with every metric on every backbone (through the persistent embedding cache: adding a metric
  or a model re-encodes only what is new) and prints one table, rows = metric × backbone, columns =
  the dataset's conventional statistics;
* ``--scores FILE`` with ``--human FILE`` (or ``--dataset`` + ``--path``) correlates scores computed
  elsewhere (a ``capscore score`` output, an LLM judge...) with the human scores, joined on ``id``.

``--out DIR`` writes ``correlate.json`` (every result with its provenance) and ``correlate.csv``, and for
rating datasets ``correlate_items.jsonl`` (per item: metric, backbone, id, score, human), which
``capscore report`` plots.
See docs/meta.md.
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from capscore.commands import _shards
from capscore.commands._args import add_device, add_metric, add_model, non_negative_int, output_dir, positive_int, refuse_input_as_output
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
    p.add_argument("--alpha", type=float, default=0.05,
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
    p.add_argument("--bootstrap", type=non_negative_int, default=1000, metavar="N",
                   help="bootstrap resamples for 95%% intervals (default 1000; 0 = none)")
    p.add_argument("--seed", type=int, default=0, help="seed: ties, reference draws, bootstrap, random init")
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
    _shards.add_engine_arguments(p, score=False)  # --engine ray (issue 15)


def _drawn_for(backbone, ds, redraw):
    """``ds``, or, for a dataset drawn in memory at some size (scenes-oracle, scenes-video without files:
    ``params["size"]``), the same scenes, captions and oracle scores redrawn at ``backbone``'s input size by
    ``redraw(size)``, so a 96-px model does not score 64-px drawings upsampled by its preprocessing."""
    from capscore.scenes import render_size

    drawn, wanted = ds.params.get("size"), render_size(backbone)
    return ds if drawn is None or drawn == wanted else redraw(wanted)


def _load(args, *, size: int | None = None):
    """The dataset of ``--dataset``; scenes-oracle's scenes are drawn at ``size`` px (default 64)."""
    from capscore.meta.datasets import load_dataset

    opts = {}
    if args.dataset == "scenes-oracle":
        opts["n_scenes"] = args.scenes
        if size:
            opts["size"] = size
    return load_dataset(args.dataset, args.path, args.images, seed=args.seed, split=args.split,
                        coco_captions=args.coco_captions, **opts)


def run(args) -> int:
    from capscore.meta.evaluate import correlate_scores, export_items, read_human, read_scores
    from capscore.meta.video import VIDEO_DATASETS

    if args.dataset in VIDEO_DATASETS:
        return _run_video(args)
    if args.videos or args.frames or args.idf or args.n_refs:
        raise CapscoreError("--videos, --frames, --idf and --n-refs apply to the video datasets only "
                            f"({', '.join(VIDEO_DATASETS)})")

    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise CapscoreError(f"--out {args.out}: is an existing file; --out names a folder (correlate.json, .csv)")
    if args.export_items:
        refuse_input_as_output(args.export_items, {"--path": args.path, "--coco-captions": args.coco_captions},
                               "--export-items")
    if args.bootstrap < 0 or args.batch_size < 1 or args.ref_draws < 1 or args.ref_sample < 0:
        raise CapscoreError("--bootstrap, --ref-sample must be >= 0 and --batch-size, --ref-draws >= 1")
    if args.export_items:
        if not args.dataset:
            raise CapscoreError("--export-items needs --dataset (and --path)")
        n = export_items(_load(args), args.export_items)
        print(f"wrote {n} items to {args.export_items}")
        return 0
    common = dict(n_resamples=args.bootstrap, seed=args.seed)
    if args.scores:
        if args.model:
            raise CapscoreError("--scores correlates a file of scores; --model is for scoring here (give one or the other)")
        if bool(args.human) == bool(args.dataset):
            raise CapscoreError("--scores needs exactly one of --human FILE or --dataset NAME --path P")
        human = read_human(args.human, column=args.human_column, id_column=args.id_column) if args.human \
            else _load(args)
        errors: set[str] = set()
        scores, skipped = read_scores(args.scores, column=args.score_column, id_column=args.id_column,
                                      error_ids=errors)
        result = correlate_scores(scores, human, metric_name=f"{Path(args.scores).name}:{args.score_column}",
                                  columns=args.stats, ties=args.ties, skipped=skipped, source=args.scores,
                                  **common)
        result, unmatched = reconcile_skipped(result, human, scores, errors)
        results = [result]
    else:
        if not args.dataset:
            raise CapscoreError("give --dataset NAME (see `capscore correlate -h`) or --scores FILE")
        from capscore.meta.evaluate import text_only
        from capscore.scores.metric import get_metric

        if not args.model and not all(text_only(get_metric(m)) for m in args.metric):
            raise CapscoreError("give --model M [M2 ...] (e.g. ViT-B-32/openai), or --scores FILE")
        if not 0 < args.alpha < 1:
            raise CapscoreError(f"--alpha must be in (0, 1); got {args.alpha}")
        ds = _load(args)
        results = _score_and_correlate(args, ds, common)
        significance = _significance(results, ds, args) if args.bootstrap else None
        print(format_table(results))
        if significance is not None:
            from capscore.meta.significance import format_comparison

            print(format_comparison(significance))
        if args.out:
            json_path, csv_path = write_results(results, args.out, significance=significance)
            print(f"wrote {json_path} and {csv_path}")
        return 0
    print(format_table(results))
    if args.scores and unmatched:
        print(f"also in {args.scores}: {unmatched} rows whose id has no human judgment (not used)")
    if args.out:
        json_path, csv_path = write_results(results, args.out)
        print(f"wrote {json_path} and {csv_path}")
    return 0


def _significance(results, ds, args):
    """Williams and τ-bootstrap p-values between every pair of metric rows of a rating dataset (on the items
    every row scored), and the cluster not significantly different from the best; ``None`` with < 2 rows."""
    from capscore.meta.significance import compare_metrics

    rows = [r for r in results if r.items]
    if len(rows) < 2:
        return None
    several = len({r.backbone for r in rows if r.backbone}) > 1
    names = [r.metric if not (several and r.backbone) else f"{r.metric} ({r.backbone})" for r in rows]
    common = set.intersection(*({i for i, _, _ in r.items} for r in rows))
    order = [i for i, _, _ in rows[0].items if i in common]
    if len(order) < 4:
        return None
    human = {i: h for i, _, h in rows[0].items}
    groups = {it.record.id: it.group for it in getattr(ds, "items", ()) if hasattr(it, "group")}
    scores = {n: [dict((i, s) for i, s, _ in r.items)[i] for i in order] for n, r in zip(names, rows)}
    cols = [c for c in rows[0].params.get("columns", ()) if c in ("tau_b", "tau_c")] or ["tau_c"]
    return compare_metrics(scores, [human[i] for i in order], kind=cols[0],
                           clusters=[groups.get(i, i) for i in order], n_resamples=args.bootstrap, seed=args.seed,
                           alpha=args.alpha)


def _score_and_correlate(args, ds, common):
    from capscore._log import is_quiet, log, progress
    from capscore.backbones import load_backbone
    from capscore.embed.cache import EmbeddingCache
    from capscore.embed.engine import MemoryCache
    from capscore.engines.ray import make_encoder
    from capscore.meta.evaluate import evaluate, text_only
    from capscore.pipeline import check_fit
    from capscore.scores.metric import get_metric

    metrics = [get_metric(m) for m in args.metric]  # unknown names fail before any model loads
    for m in metrics:
        if "image" not in m.media:
            raise CapscoreError(f"--metric {m.name} scores videos; {args.dataset} is an image dataset")
    results = []
    for m in [m for m in metrics if text_only(m)]:  # the classic metrics read text only: scored once
        results.append(evaluate(ds, None, m, columns=args.stats, ties=args.ties, ref_sample=args.ref_sample or None,
                                ref_draws=args.ref_draws, skip_bad=args.skip_bad,
                                options={"tokenizer": args.tokenizer}, **common))
    metrics = [m for m in metrics if not text_only(m)]
    if not metrics:
        return results
    cache = MemoryCache() if args.no_cache else EmbeddingCache(args.cache_dir)
    for spec in args.model:
        backbone = load_backbone(spec, device=args.device, dtype=args.dtype, seed=args.seed)
        ds = _drawn_for(backbone, ds, lambda size: _load(args, size=size))
        for m in metrics:
            check_fit(m, backbone)
        encoder = make_encoder(backbone, spec=spec, ray=_shards.ray_options_if(args), device=args.device,
                               dtype=args.dtype, seed=args.seed, batch_size=args.batch_size, cache=cache,
                               progress=not is_quiet())
        with progress(len(metrics), desc=f"correlate {spec}", unit="metric") as bar:
            for m in metrics:
                results.append(evaluate(ds, encoder, m, prefix=args.prefix, columns=args.stats, ties=args.ties,
                                        ref_sample=args.ref_sample or None, ref_draws=args.ref_draws,
                                        skip_bad=args.skip_bad, **common))
                bar.update(1)
        st = encoder.stats
        log.info(f"{spec}: encoded {st.images_encoded} images and {st.texts_encoded} texts; "
                 f"{st.images_cached} images and {st.texts_cached} texts came from the cache")
    return results


# ------------------------------------------------------------------------------------ output
def _columns(results) -> list[str]:
    cols: list[str] = []
    for r in results:
        for s in r.stats:
            if s.name not in cols:
                cols.append(s.name)
    return cols


def reconcile_skipped(result, human, scores, errors: set):
    """Count every human item (or pair) once: matched + skipped = all of them.

    ``read_scores`` counts the error rows of the scores file and ``correlate_scores`` counts the
    human items without a score; an item whose score row is an error row is in both. Here such an
    item counts once, as "no score (error row)", and only the remaining ones as "no score for the
    id" (pairs: "pair with an error row" / "pair without both scores"). Returns the result with
    these counts and the number of score rows (scored or error) whose id no human item has."""
    import dataclasses

    from capscore.meta.datasets import PairSet

    skipped = dict(result.skipped)
    skipped.pop("no score (error row)", None)
    if isinstance(human, PairSet):
        ids = {f"{p.id}:{side}" for p in human.items for side in "ab"}
        missing_key = "pair without both scores"
        hit = sum(1 for p in human.items if f"{p.id}:a" not in scores or f"{p.id}:b" not in scores
                  if f"{p.id}:a" in errors or f"{p.id}:b" in errors)
        error_key = "pair with an error row"
    else:
        ids = {it.record.id for it in human.items}
        missing_key = "no score for the id"
        hit = len(errors & ids)
        error_key = "no score (error row)"
    rest = skipped.pop(missing_key, 0) - hit
    if hit:
        skipped[error_key] = hit
    if rest:
        skipped[missing_key] = rest
    unmatched = len((set(scores) | errors) - ids)
    return dataclasses.replace(result, skipped=skipped), unmatched


def format_table(results) -> str:
    """One row per metric × backbone; each cell ``value [low, high]`` (points, ×100; ×1 for
    :data:`capscore.meta.stats.UNSCALED`), printed by the one table printer."""
    from capscore.meta.stats import UNSCALED
    from capscore.report.tables import format_table as print_table

    if not results:
        return "(no results)"
    cols = _columns(results)
    rows = []
    for r in results:
        row = {"metric": r.metric, "backbone": r.backbone or "-"}
        for c in cols:
            s = r.get(c)
            # SPECS Table 2's 1 − R² is x1 and unbounded (0.73 ... 3.3e7): 4 significant digits, not .1f
            f = "{:.4g}" if c.rsplit(":", 1)[-1] in UNSCALED else "{:.1f}"
            row[c] = "" if s is None else f.format(s.value) if s.ci is None else \
                f"{f.format(s.value)} [{f.format(s.ci[0])}, {f.format(s.ci[1])}]"
        rows.append(row | {"n": r.n})
    r0 = results[0]
    boot = (f"95% bootstrap intervals over {r0.n_resamples} resamples" if r0.n_resamples else "no bootstrap")
    scale = "statistics ×100" + (" (one_minus_r2: ×1, as SPECS Table 2)" if any(
        c.rsplit(":", 1)[-1] in UNSCALED for c in cols) else "")
    lines = [f"{r0.dataset} ({r0.source}); {scale}, {boot}, seed {r0.seed}", print_table(rows, indent="")]
    skipped = {k: v for r in results[:1] for k, v in r.skipped.items()}
    if r0.identity == "external scores":  # --scores: every human item is matched or skipped, once
        unit = "pairs" if "ties" in r0.params else "human items"
        lines.append(f"matched: {r0.n} of {r0.n + sum(skipped.values())} {unit}")
    if skipped:
        lines.append("skipped: " + ", ".join(f"{v} {k}" for k, v in skipped.items()))
    return "\n".join(lines)


def write_results(results, out, *, significance=None) -> tuple[Path, Path]:
    out = output_dir(out)
    json_path, csv_path = out / "correlate.json", out / "correlate.csv"
    with open(json_path, "w", encoding="utf-8") as f:
        doc = {"results": [r.as_dict() for r in results]}
        if significance is not None:
            doc["significance"] = significance.as_dict()
        json.dump(doc, f, indent=2, default=str)
    cols = _columns(results)
    with open(csv_path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "metric", "backbone", "identity", "prefix", "n", "seed", "n_resamples"]
                   + [x for c in cols for x in (c, f"{c}_ci_low", f"{c}_ci_high")])
        for r in results:
            row = [r.dataset, r.metric, r.backbone, r.identity, r.prefix, r.n, r.seed, r.n_resamples]
            for c in cols:
                s = r.get(c)
                row += ["", "", ""] if s is None else [s.value, *(s.ci if s.ci else ("", ""))]
            w.writerow(row)
    items = [(r, it) for r in results for it in r.items]
    if items:
        with open(out / "correlate_items.jsonl", "w", encoding="utf-8") as f:
            for r, (ident, score, human) in items:
                f.write(json.dumps({"dataset": r.dataset, "metric": r.metric, "backbone": r.backbone, "id": ident,
                                    "score": score, "human": human}, ensure_ascii=False) + "\n")
    return json_path, csv_path


def _run_video(args) -> int:
    """``--dataset vatex-eval|activitynet-foil|scenes-video``: video metrics (see docs/video.md)."""
    from capscore.backbones import load_backbone
    from capscore.data.video import Sampling
    from capscore.embed.cache import EmbeddingCache
    from capscore.embed.engine import Encoder, MemoryCache
    from capscore.meta.video import evaluate_video, load_video_dataset
    from capscore.scores.video import VIDEO_METRICS, get_video_metric

    if args.scores or args.export_items:
        raise CapscoreError(f"--scores/--export-items are not available for the video dataset {args.dataset}")
    if not args.model:
        raise CapscoreError("give --model M [M2 ...] (e.g. scenes-tiny, ViT-B-32/openai)")
    if args.bootstrap < 0 or args.batch_size < 1:
        raise CapscoreError("--bootstrap must be >= 0 and --batch-size >= 1")
    if args.dataset != "scenes-video" and not args.videos:
        raise CapscoreError(f"--videos DIR is required for {args.dataset} (its video files, VIDEO_ID.mp4)")
    for m in args.metric:
        if m not in VIDEO_METRICS:
            raise CapscoreError(f"--metric {m} scores images; {args.dataset} is a video dataset")
    metrics = [get_video_metric(m) for m in args.metric]
    sampling = Sampling.parse(args.frames or "uniform:10")
    ds = load_video_dataset(args.dataset, args.path, args.videos, seed=args.seed, n_scenes=args.scenes)
    cache = MemoryCache() if args.no_cache else EmbeddingCache(args.cache_dir)
    results = []
    for spec in args.model:
        backbone = load_backbone(spec, device=args.device, dtype=args.dtype, seed=args.seed)
        ds = _drawn_for(backbone, ds, lambda size: load_video_dataset(args.dataset, seed=args.seed,
                                                                      n_scenes=args.scenes, size=size))
        encoder = Encoder(backbone, batch_size=args.batch_size, cache=cache,
                          progress=not getattr(args, "quiet", False))
        for m in metrics:
            results.append(evaluate_video(ds, encoder, m, n_refs=args.n_refs, sampling=sampling,
                                          prefix=args.prefix or "", idf=args.idf, n_resamples=args.bootstrap,
                                          seed=args.seed, skip_bad=args.skip_bad))
        st = encoder.stats
        print(f"{spec}: decoded and encoded {st.videos_encoded} videos ({st.frames_encoded} frames); "
              f"{st.videos_cached} came from the cache", file=sys.stderr)
    print(format_table(results))
    if args.out:
        json_path, csv_path = write_results(results, args.out)
        print(f"wrote {json_path} and {csv_path}")
    return 0
