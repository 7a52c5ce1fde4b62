"""Meta-evaluation runs: score a dataset with every metric on every backbone and correlate with the humans.

:class:`CorrelateJob` is the typed description of one ``capscore correlate`` run (or a Python caller's);
:func:`run_correlate` scores the dataset through the embedding cache (adding a metric or a model re-encodes
only what is new) and returns one :class:`~capscore.meta.evaluate.CorrelationResult` per metric × backbone;
:func:`run_correlate_video` does the same for the video datasets (EMScore's protocol, see docs/video.md);
:func:`correlate_file` correlates scores computed elsewhere with the human scores. :func:`format_results`
prints the table (the dataset's conventional statistics, ×100 with 95% bootstrap intervals) and
:func:`write_results` writes ``correlate.json``, ``correlate.csv`` and, for rating datasets,
``correlate_items.jsonl``. The statistics themselves are in :mod:`capscore.meta.stats`; the
significance of the differences between metrics (Williams' test, τ bootstrap) in
:mod:`capscore.meta.significance`.
"""
from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
import dataclasses

from capscore.errors import CapscoreError, param_error
from capscore.scores.classic import in_session
from capscore._log import is_quiet, log, progress
from capscore.embed.factory import Encoding, make_encoder, make_encoder as local_encoder, open_cache, tower_encoder
from capscore.pipeline import OWN_MODELS, TEXT_ONLY, check_fit
from capscore.report.outputs import output_dir
from capscore.report.tables import format_table as print_table
from capscore.scores.aggregate import aggregate_for
from capscore.scores.metric import get_metric, metric_names, registry


@dataclass(frozen=True)
class CorrelateJob:
    """What to correlate and how; every field is a keyword of :func:`run_correlate`'s computations.

    ``ref_sample`` = 0 uses every reference (Pascal-50S: all 48); ``bootstrap`` = 0 gives no intervals and
    no significance tests; ``scenes`` is the number of scenes of the in-memory scenes datasets.
    """

    dataset: str
    path: str | None = None
    images: str | None = None
    models: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ("clip-s",)
    split: str | None = None
    coco_captions: str | None = None
    tokenizer: str = "ptb"
    classic_backend: str = "native"
    alpha: float = 0.05
    prefix: str | None = None
    stats: tuple[str, ...] | None = None
    ties: str | None = None
    ref_sample: int = 5
    ref_draws: int = 5
    scenes: int = 60
    bootstrap: int = 1000
    seed: int = 0
    skip_bad: bool = False
    videos: str | None = None
    frames: str | None = None
    idf: bool = False
    n_refs: tuple[int, ...] | None = None
    device: str = "cpu"
    dtype: str = "fp32"
    batch_size: int = 64
    cache_dir: str | None = None
    no_cache: bool = False
    metric_weights: str | None = None  # the released files of polos, deneb, fleur, ... (docs/learned.md)

    def __post_init__(self):
        for name in ("models", "metrics", "stats", "n_refs"):  # lists given for them are kept as tuples
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        for name, low in (("bootstrap", 0), ("ref_sample", 0), ("batch_size", 1), ("ref_draws", 1), ("scenes", 1)):
            if getattr(self, name) < low:
                raise param_error(name, "CorrelateJob", f"an integer >= {low}", getattr(self, name))
        if not 0 < self.alpha < 1:
            raise param_error("alpha", "CorrelateJob", "in (0, 1)", self.alpha)
        from capscore.meta.video import VIDEO_DATASETS  # noqa: PLC0415  (deferred: numpy, scipy, torch)

        for name in ("videos", "frames", "idf", "n_refs"):
            if getattr(self, name) and self.dataset not in VIDEO_DATASETS:
                raise param_error(name, "CorrelateJob", f"unset for dataset {self.dataset!r} (it applies to the "
                                  f"video datasets only: {', '.join(VIDEO_DATASETS)})", getattr(self, name))


def _encoding(job: CorrelateJob):
    """The job's encoder settings as the one :class:`~capscore.embed.factory.Encoding`."""
    return Encoding(device=job.device, dtype=job.dtype, seed=job.seed, batch_size=job.batch_size,
                    cache_dir=job.cache_dir, cache=not job.no_cache)


def load(job: CorrelateJob, *, size: int | None = None):
    """The job's (image) dataset; scenes-oracle's scenes are drawn at ``size`` px (default 64)."""
    from capscore.meta.datasets import load_dataset  # noqa: PLC0415  (deferred: numpy)

    opts = {}
    if job.dataset == "scenes-oracle":
        opts["n_scenes"] = job.scenes
        if size:
            opts["size"] = size
    return load_dataset(job.dataset, job.path, job.images, seed=job.seed, split=job.split,
                        coco_captions=job.coco_captions, **opts)


def drawn_for(backbone, ds, redraw):
    """``ds``, or, for a dataset drawn in memory at some size (scenes-oracle, scenes-video without files:
    ``params["size"]``), the same scenes, captions and oracle scores redrawn at ``backbone``'s input size by
    ``redraw(size)``, so a 96-px model does not score 64-px drawings upsampled by its preprocessing."""
    from capscore.scenes import render_size  # noqa: PLC0415  (deferred: numpy)

    drawn, wanted = ds.params.get("size"), render_size(backbone)
    return ds if drawn is None or drawn == wanted else redraw(wanted)


@in_session
def run_correlate(job: CorrelateJob, *, make_encoder: Callable | None = None, ds=None):
    """Score the image dataset ``job.dataset`` with every metric on every backbone -> (results, significance).

    ``make_encoder(spec, encoding, store=, progress=)`` builds each backbone's encoder (default:
    :func:`capscore.embed.factory.make_encoder`; :func:`capscore.engines.ray.ray_encoders` gives the Ray
    variant); every model shares one cache. ``ds`` is the loaded dataset (default :func:`load`). The classic (text-only) metrics
    are scored once, without a backbone, in one session of their Java tools (one METEOR process for every
    metric and reference draw). ``significance`` is :func:`significance`'s comparison (``None``
    without bootstrap or with fewer than two metric rows).
    """
    from capscore.meta.evaluate import dataset_texts, evaluate, text_only  # noqa: PLC0415  (deferred: numpy, scipy, torch)

    make_encoder = make_encoder or local_encoder
    metrics = [get_metric(m) for m in job.metrics]  # unknown names fail before any model loads
    for m in metrics:
        if "image" not in m.media:
            raise CapscoreError(f"metric {m.name} scores videos; {job.dataset} is an image dataset")
    if not job.models and not all(text_only(m) for m in metrics):
        raise param_error("models", "run_correlate", "at least one backbone spec (e.g. ViT-B-32/openai) for "
                          "metrics that encode", job.models)
    ds = load(job) if ds is None else ds
    common = dict(columns=job.stats, ties=job.ties, ref_sample=job.ref_sample or None, ref_draws=job.ref_draws,
                  skip_bad=job.skip_bad, n_resamples=job.bootstrap, seed=job.seed)
    classic = {"tokenizer": job.tokenizer, "classic_backend": job.classic_backend}
    own = {"metric_weights": job.metric_weights, "device": job.device, "dtype": job.dtype}  # their own models
    text = [m for m in metrics if text_only(m)]
    opts = {m.name: own if m.own_models else classic for m in text}
    for m in text:
        hook = getattr(m.image, "session", None)  # in the run's one session (in_session): tools checked, one PTB
        if hook is not None:  # pass over all texts; a metric's own models loaded (absent weights: one line)
            with hook(lambda: dataset_texts(ds), opts[m.name]):
                pass
    encoding = _encoding(job)
    store = open_cache(encoding) if any(not text_only(m) or hasattr(m.image, "tower") for m in metrics) else None

    def tower(m):  # Polos's and DENEB's CLIP through the run's cache; the other metrics without a backbone: none
        return tower_encoder(m.image.tower(opts[m.name]), (), encoding, store=store) if hasattr(m.image, "tower") \
            else None

    results = [evaluate(ds, tower(m), m, options=opts[m.name], **common) for m in text]  # no --model: scored once
    metrics = [m for m in metrics if not text_only(m)]
    for spec in job.models if metrics else ():
        encoder = make_encoder(spec, encoding, store=store, progress=not is_quiet())
        backbone = encoder.backbone
        ds = drawn_for(backbone, ds, lambda size: load(job, size=size))
        for m in metrics:
            check_fit(m, backbone)
        with progress(len(metrics), desc=f"correlate {spec}", unit="metric") as bar:
            for m in metrics:
                results.append(evaluate(ds, encoder, m, prefix=job.prefix, **common))
                bar.update(1)
        st = encoder.stats
        log.info(f"{spec}: encoded {st.images_encoded} images and {st.texts_encoded} texts; "
                 f"{st.images_cached} images and {st.texts_cached} texts came from the cache")
    return results, (significance(results, ds, n_resamples=job.bootstrap, seed=job.seed, alpha=job.alpha)
                     if job.bootstrap else None)


def correlate_file(scores: str, job: CorrelateJob, *, human: str | None = None, score_column: str = "score",
                   human_column: str | None = None, id_column: str = "id"):
    """Scores computed elsewhere (``scores``: JSONL/CSV/Parquet with ``id_column`` and ``score_column``)
    correlated with the human scores of the file ``human``, else of ``job``'s dataset; ``job`` also gives
    the statistics, ties, bootstrap and seed. Rows join items by id, and by image where both name one;
    a file whose ids are line numbers is refused unless every row's image confirms its item
    (:func:`capscore.meta.evaluate.check_join`)."""
    from capscore.meta.evaluate import check_join, correlate_scores, read_human, read_scores  # noqa: PLC0415  (deferred: numpy, scipy, torch)

    if human is None and not job.dataset:
        raise param_error("human", "correlate_file", "a file of human scores when job names no dataset", human)
    truth = read_human(human, column=human_column, id_column=id_column) if human is not None else load(job)
    errors: set[str] = set()
    rows: list[tuple[str, str]] = []
    values, skipped = read_scores(scores, column=score_column, id_column=id_column, error_ids=errors, rows=rows)
    check_join(scores, rows, truth)  # by (id, image); line-number ids only where images confirm them
    result = correlate_scores(values, truth, metric_name=f"{Path(scores).name}:{score_column}", columns=job.stats,
                              ties=job.ties, skipped=skipped, source=scores, n_resamples=job.bootstrap,
                              seed=job.seed)
    result, unmatched = reconcile_skipped(result, truth, values, errors)
    if unmatched:
        result = dataclasses.replace(result, params={**result.params, "unmatched_rows": unmatched,
                                                     "scores_file": str(scores)})
    return result


def reconcile_skipped(result, human, scores, errors: set):
    """Count every human item (or pair) once: matched + skipped = all of them.

    ``read_scores`` counts the error rows of the scores file and ``correlate_scores`` counts the
    human items without a score; an item whose score row is an error row is in both. Here such an
    item counts once, as "no score (error row)", and only the remaining ones as "no score for the
    id" (pairs: "pair with an error row" / "pair without both scores"). Returns the result with
    these counts and the number of score rows (scored or error) whose id no human item has."""
    from capscore.meta.datasets import PairSet  # noqa: PLC0415  (deferred: numpy)

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


def significance(results, ds, *, n_resamples: int, seed: int, alpha: float = 0.05):
    """Williams and τ-bootstrap p-values between every pair of metric rows of a rating dataset (on the items
    every row scored), and the cluster not significantly different from the best; ``None`` with < 2 rows."""
    from capscore.meta.significance import compare_metrics  # noqa: PLC0415  (deferred: numpy, scipy)

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
                           clusters=[groups.get(i, i) for i in order], n_resamples=n_resamples, seed=seed,
                           alpha=alpha)


def run_correlate_video(job: CorrelateJob):
    """``job.dataset`` one of the video datasets (vatex-eval, activitynet-foil, scenes-video): every video
    metric on every backbone, over frames sampled by ``job.frames`` (default uniform:10; docs/video.md)."""
    from capscore.data.video import DEFAULT_SAMPLING, Sampling  # noqa: PLC0415  (deferred: numpy)
    from capscore.meta.video import evaluate_video, load_video_dataset  # noqa: PLC0415  (deferred: numpy, scipy, torch)

    if not job.models:
        raise param_error("models", "run_correlate_video", "at least one backbone spec", job.models)
    if job.dataset != "scenes-video" and not job.videos:
        raise param_error("videos", "run_correlate_video", f"the folder of {job.dataset}'s VIDEO_ID.mp4 files",
                          job.videos)
    for m in job.metrics:
        if m not in metric_names("video"):
            raise CapscoreError(f"metric {m} scores images; {job.dataset} is a video dataset")
    metrics = list(job.metrics)
    sampling = Sampling.parse(job.frames or DEFAULT_SAMPLING)
    ds = load_video_dataset(job.dataset, job.path, job.videos, seed=job.seed, n_scenes=job.scenes)
    encoding = _encoding(job)
    store, results = open_cache(encoding), []
    for spec in job.models:
        encoder = make_encoder(spec, encoding, store=store, progress=not is_quiet())
        ds = drawn_for(encoder.backbone, ds, lambda size: load_video_dataset(job.dataset, seed=job.seed,
                                                                             n_scenes=job.scenes, size=size))
        for m in metrics:
            results.append(evaluate_video(ds, encoder, m, n_refs=job.n_refs, sampling=sampling,
                                          prefix=job.prefix or "", idf=job.idf, n_resamples=job.bootstrap,
                                          seed=job.seed, skip_bad=job.skip_bad))
        st = encoder.stats
        print(f"{spec}: decoded and encoded {st.videos_encoded} videos ({st.frames_encoded} frames); "
              f"{st.videos_cached} came from the cache", file=sys.stderr)
    return results


# ------------------------------------------------------------------------------------ output
def _columns(results) -> list[str]:
    cols: list[str] = []
    for r in results:
        for s in r.stats:
            if s.name not in cols:
                cols.append(s.name)
    return cols


def _no_backbone(metric: str) -> str:
    """The backbone cell of a metric scored without ``--model``: as ``capscore score`` prints it."""
    row = registry().get(metric)
    return "-" if row is None else OWN_MODELS if row.own_models else TEXT_ONLY


def format_results(results: Sequence, *, significance=None) -> str:
    """One row per metric × backbone; each cell ``value [low, high]`` (points, ×100; ×1 for
    :data:`capscore.meta.stats.UNSCALED`), printed by the one table printer; then ``significance``
    (:func:`capscore.meta.significance.format_comparison`) when given."""
    from capscore.meta.stats import UNSCALED  # noqa: PLC0415  (deferred: numpy, scipy)

    if not results:
        return "(no results)"
    cols = _columns(results)
    rows = []
    for r in results:
        row = {"metric": r.metric, "backbone": r.backbone or _no_backbone(r.metric)}
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
    lines = [f"{r0.dataset} ({r0.source}); {scale}, {boot}, seed {r0.seed}"]
    classic = [r.metric for r in results if _per_caption(r.metric)]
    if classic:  # their headline is a corpus score; a segment-level correlation needs one value per caption
        lines.append(f"{', '.join(dict.fromkeys(classic))}: per-caption values ("
                     + ", ".join(dict.fromkeys(_per_caption(m) for m in classic))
                     + ") correlated caption by caption, as the papers do; not their corpus headlines")
    lines.append(print_table(rows, indent=""))
    skipped = {k: v for r in results[:1] for k, v in r.skipped.items()}
    if r0.identity == "external scores":  # --scores: every human item is matched or skipped, once
        unit = "pairs" if "ties" in r0.params else "human items"
        lines.append(f"matched: {r0.n} of {r0.n + sum(skipped.values())} {unit}")
    if skipped:
        lines.append("skipped: " + ", ".join(f"{v} {k}" for k, v in skipped.items()))
    if r0.params.get("unmatched_rows"):
        lines.append(f"also in {r0.params.get('scores_file', r0.source)}: {r0.params['unmatched_rows']} rows whose "
                     "id has no human judgment (not used)")
    if significance is not None:
        from capscore.meta.significance import format_comparison  # noqa: PLC0415  (deferred: numpy, scipy)

        lines.append(format_comparison(significance))
    return "\n".join(lines)


def _per_caption(metric: str) -> str:
    """What a text-only registered metric's per-caption value is ("sentence-level BLEU-4", "ROUGE-L"...), or ""."""
    row = registry().get(metric)
    if row is None or not row.text_only():
        return ""
    return getattr(aggregate_for(row), "per_caption", None) or metric


def write_results(results: Sequence, out: str | Path, *, significance=None) -> tuple[Path, Path]:
    """``out/correlate.json`` (every result with its provenance, and ``significance``), ``out/correlate.csv``
    and, when the results carry items, ``out/correlate_items.jsonl`` -> (json path, csv path)."""
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
