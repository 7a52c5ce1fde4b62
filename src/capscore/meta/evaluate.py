"""Meta-evaluation: score a judgment dataset with one metric and one backbone, then compare with humans.

The thin shell between :mod:`capscore.meta.datasets` (what humans said),
:func:`capscore.pipeline.score_all` (what the metric says; every vector
goes through the :class:`~capscore.embed.Encoder` and its cache, so a second
metric or a re-run on the same backbone encodes nothing new) and
:mod:`capscore.meta.stats` (how well they agree). Results are frozen
:class:`CorrelationResult` rows recording the dataset and its source, the metric,
the backbone's spec and identity (weights hash, context, preprocessing), the
prefix, the seed, the bootstrap size and every option that changes a number.

Statistic names used in dataset ``columns`` (see :data:`~capscore.meta.datasets.DATASETS`):
``tau_b``, ``tau_c``, ``pearson``, ``spearman``, ``one_minus_r2`` (SPECS Table 2's unfitted 1 − R², ×1),
``one_minus_r2_fit`` (1 − r² of a fitted line, ×100) (item level);
``sample_tau_b`` / ``sample_tau_c`` (per group, averaged); ``system:KIND``
(per-system means); ``by_lang:KIND`` (one column per language). Pair datasets
report accuracies: Pascal-50S ``HC``, ``HI``, ``HM``, ``MM``, ``mean``; FOIL
``1-ref`` and ``4-ref``.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath

import numpy as np

from capscore._optional import require
from capscore.data.records import Record
from capscore.embed.engine import Encoder
from capscore.errors import CapscoreError, InputError
from capscore.meta import stats as S
from capscore.meta.datasets import (
    DatasetSpec, HUMAN_COLUMNS, PASCAL_ORDER, PairSet, Rated, RatingSet, _number, get_dataset, read_rows,
)
from capscore.pipeline import score_all
from capscore.scores.classic import in_session
from capscore.scores.metric import Metric, get_metric
from capscore.data.images import ImageRef


@dataclass(frozen=True)
class CorrelationResult:
    """Agreement of one metric (on one backbone) with one dataset's judgments."""

    dataset: str
    source: str
    metric: str
    backbone: str  # the --model spec ("" for an external score file)
    identity: str  # backbone identity: family, spec, weights hash, context, preprocessing
    prefix: str
    n: int  # items (or pairs) that entered the statistics
    stats: tuple[S.Stat, ...]
    skipped: Mapping[str, int] = field(default_factory=dict)
    seed: int = 0
    n_resamples: int = 0
    params: Mapping[str, object] = field(default_factory=dict)
    # rating datasets: the (id, metric score, human score) pairs behind the statistics, for plots
    # (`correlate --out` writes them to correlate_items.jsonl); not part of as_dict()
    items: tuple[tuple[str, float, float], ...] = field(default=(), repr=False, compare=False)

    def get(self, name: str) -> S.Stat | None:
        return next((s for s in self.stats if s.name == name), None)

    def value(self, name: str) -> float:
        s = self.get(name)
        if s is None:
            raise KeyError(name)
        return s.value

    def as_dict(self) -> dict:
        d = asdict(self)
        d["stats"] = [s.as_dict() for s in self.stats]
        d["skipped"] = dict(self.skipped)
        d["params"] = dict(self.params)
        d.pop("items", None)
        return d


# ------------------------------------------------------------------------------------ scoring
def text_only(metric: Metric, medium: str = "image") -> bool:
    """A metric that reads only the text (the classic reference metrics): it needs no backbone
    (:meth:`Metric.text_only`), or brings its own models (Polos, DENEB, the judges: :meth:`Metric.backbone_free`).
    Either takes ``encoder=None``."""
    return metric.backbone_free(medium)


def dataset_texts(ds: RatingSet | PairSet) -> Iterable[str]:
    """Every caption and reference of a dataset (what a text-only metric tokenises)."""
    if isinstance(ds, PairSet):
        return (t for p in ds.items for t in (p.a, p.b, *p.refs))
    return (t for it in ds.items for t in (it.record.caption, *it.record.refs))


def score_many(records: Iterable[Record], encoder: Encoder | None, metric: Metric, *, prefix: str | None,
               skip_bad: bool, skipped: dict[str, int], options: Mapping | None = None, medium: str = "image",
               chunk_size: int = 2048) -> dict[str, float]:
    """id -> score for every record that could be scored, through the pipeline (:func:`score_all`);
    failures are counted in ``skipped`` (with ``skip_bad``) or raised (without).

    A :func:`text_only` metric takes ``encoder=None`` and no prefix, and scores the whole set as one
    batch (CIDEr's IDF comes from the whole evaluated set, as its reference code computes it); a record
    without references is counted as skipped for it, not raised: a dataset may mix items with and
    without references."""
    if text_only(metric, medium):
        kept = []
        for r in records:
            if metric.needs_refs and not r.refs:
                skipped["no references"] = skipped.get("no references", 0) + 1
            else:
                kept.append(r)
        records, prefix, chunk_size = kept, "", max(1, len(kept))
    out: dict[str, float] = {}
    for row in score_all(records, encoder, metric, medium=medium, prefix=prefix, options=options,
                         skip_bad=skip_bad, chunk_size=chunk_size):
        if row["score"] is None or not math.isfinite(row["score"]):
            why = (row.get("error") or "could not be scored").split(": ")[-1]
            skipped[why] = skipped.get(why, 0) + 1
            continue
        out[row["id"]] = float(row["score"])
    return out


# ------------------------------------------------------------------------------------ ratings
def rating_stats(metric, human, columns: Sequence[str], *, groups: Sequence[str] | None = None,
                 systems: Sequence[str] | None = None, langs: Sequence[str] | None = None,
                 n_resamples: int = 0, seed: int = 0, confidence: float = 0.95) -> list[S.Stat]:
    """The named statistics of metric vs human scores (see the module docstring for names)."""
    x, h = np.asarray(metric, dtype=float), np.asarray(human, dtype=float)
    kw = dict(n_resamples=n_resamples, seed=seed, confidence=confidence)
    out: list[S.Stat] = []
    for col in columns:
        if col in S.CORRELATIONS:
            out.append(S.correlation_stat(x, h, col, **kw))
        elif col in ("sample_tau_b", "sample_tau_c"):
            if groups is None:
                raise CapscoreError(f"{col} needs groups (an image or 'group' per item)")
            out.append(S.sample_tau_stat(x, h, groups, variant=col[-1], **kw))
        elif col.startswith("system:"):
            if not systems or len(set(systems)) < 2:
                raise CapscoreError(f"{col} needs a 'system' per item and at least two systems")
            value, k = S.system_level(x, h, systems, kind=col.split(":", 1)[1])
            out.append(S.Stat(col, value, None, len(x), f"{k} systems"))
        elif col.startswith("by_lang:"):
            kind = col.split(":", 1)[1]
            if not langs or not any(langs):
                raise CapscoreError(f"{col} needs a 'lang' per item")
            la = np.asarray(langs)
            for lang in sorted(set(la.tolist())):
                sel = la == lang
                s = S.correlation_stat(x[sel], h[sel], kind, **kw)
                out.append(S.Stat(f"{lang}:{kind}", s.value, s.ci, s.n))
        else:
            raise CapscoreError(f"unknown statistic {col!r}; expected one of {', '.join(S.CORRELATIONS)}, "
                                "sample_tau_b, sample_tau_c, system:KIND, by_lang:KIND")
    return out


def evaluate_ratings(ds: RatingSet, encoder: Encoder, metric: str | Metric, *,
                     columns: Sequence[str] | None = None, prefix: str | None = None, n_resamples: int = 1000,
                     seed: int = 0, confidence: float = 0.95, skip_bad: bool = False,
                     options: Mapping | None = None) -> CorrelationResult:
    """Score every rated caption and correlate with the human scores. ``options``: the metric's formula
    options (e.g. ``{"tokenizer": "simple"}`` for the classic metrics)."""
    spec = get_metric(metric) if isinstance(metric, str) else metric
    columns = tuple(columns or _spec(ds.name).columns)
    skipped = dict(ds.skipped)
    scores = score_many((it.record for it in ds.items), encoder, spec, prefix=prefix, skip_bad=skip_bad,
                        skipped=skipped, options=options)
    kept = [it for it in ds.items if it.record.id in scores]
    x = [scores[it.record.id] for it in kept]
    try:
        stats = rating_stats(x, [it.human for it in kept], columns, groups=[it.group for it in kept],
                             systems=[it.record.system for it in kept], langs=[it.lang for it in kept],
                             n_resamples=n_resamples, seed=seed, confidence=confidence)
    except CapscoreError as e:  # which metric on which dataset: a table runs many (reproduce, correlate)
        raise CapscoreError(f"{spec.name} on {ds.name}: {e}") from None
    res = _result(ds, spec, encoder, prefix, len(kept), stats, skipped, seed, n_resamples,
                  {"columns": list(columns), "confidence": confidence, **dict(options or {})})
    return replace(res, items=tuple((it.record.id, s, it.human) for it, s in zip(kept, x)))


# ------------------------------------------------------------------------------------ pairs
def _pair_records(ds: PairSet, refs_of) -> list[Record]:
    recs = []
    for p in ds.items:
        refs = refs_of(p)
        recs.append(Record(f"{p.id}:a", p.image, p.a, refs, source=p.source))
        recs.append(Record(f"{p.id}:b", p.image, p.b, refs, source=p.source))
    return recs


def _outcomes(ds: PairSet, scores: Mapping[str, float], ties: str) -> tuple[np.ndarray, list[int]]:
    keep = [i for i, p in enumerate(ds.items) if f"{p.id}:a" in scores and f"{p.id}:b" in scores]
    a = [scores[f"{ds.items[i].id}:a"] for i in keep]
    b = [scores[f"{ds.items[i].id}:b"] for i in keep]
    return S.pair_outcomes(a, b, [ds.items[i].label for i in keep], ties=ties), keep


def evaluate_pairs(ds: PairSet, encoder: Encoder, metric: str | Metric, *, prefix: str | None = None,
                   ties: str | None = None, ref_sample: int | None = 5, ref_draws: int = 5,
                   n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95,
                   skip_bad: bool = False, options: Mapping | None = None) -> CorrelationResult:
    """Pairwise accuracy: Pascal-50S per category (+ mean) or FOIL in the 1-ref and 4-ref settings.

    Pascal-50S with a reference-based metric: ``ref_sample`` of the 48 references are drawn
    without replacement for each pair, ``ref_draws`` times (PAC-S protocol: 5 of 48, 5 draws,
    from ``numpy.random.default_rng(seed)``), and the per-pair outcomes are averaged over the
    draws (so the accuracy is the mean of the draws' accuracies); ``ref_sample=None`` uses all
    48. A reference-free metric ignores references, so it is scored once. ``ties``: how a metric
    tie counts (default: the dataset's — half for Pascal-50S, a loss for FOIL, whose protocol
    counts pairs where the original *outscores* the foil).
    """
    spec = get_metric(metric) if isinstance(metric, str) else metric
    dspec = _spec(ds.name)
    ties = ties or dspec.ties
    skipped = dict(ds.skipped)
    kw = dict(n_resamples=n_resamples, seed=seed, confidence=confidence)
    params: dict[str, object] = {"ties": ties, "confidence": confidence, **dict(options or {})}
    stats: list[S.Stat] = []
    if ds.name == "foil":
        settings = [("1-ref", lambda p: p.refs[:1]), ("4-ref", lambda p: p.refs)]
        cache: dict[str, tuple] = {}
        n = 0
        for name, refs_of in settings:
            key = name if spec.needs_refs else "any"
            if key not in cache:
                scores = score_many(_pair_records(ds, refs_of), encoder, spec, prefix=prefix,
                                    skip_bad=skip_bad, skipped=skipped if key in ("any", "1-ref") else {},
                                    options=options)
                cache[key] = _outcomes(ds, scores, ties)
            out, keep = cache[key]
            n = max(n, len(keep))
            stats += S.outcome_stats(out, name=name, **kw)
        params["refs"] = "1-ref: the first COCO caption other than the original; 4-ref: all others"
        return _result(ds, spec, encoder, prefix, n, stats, skipped, seed, n_resamples, params)

    cats_all = [p.category for p in ds.items]
    order = PASCAL_ORDER if set(cats_all) <= set(PASCAL_ORDER) else None
    if spec.needs_refs and ref_sample is not None:
        rng = np.random.default_rng(seed)
        total = np.zeros(len(ds.items))
        present = np.ones(len(ds.items), dtype=bool)
        for d in range(ref_draws):
            picks = {p.id: tuple(p.refs[k] for k in sorted(rng.choice(len(p.refs), size=min(ref_sample, len(p.refs)),
                                                                    replace=False)))
                     for p in ds.items if p.refs}
            scores = score_many(_pair_records(ds, lambda p: picks.get(p.id, ())), encoder, spec, prefix=prefix,
                                skip_bad=skip_bad, skipped=skipped if d == 0 else {}, options=options)
            out, keep = _outcomes(ds, scores, ties)
            mask = np.zeros(len(ds.items), dtype=bool)
            mask[keep] = True
            present &= mask
            total[keep] += out
        keep = np.flatnonzero(present).tolist()
        outcomes = total[keep] / ref_draws
        params.update(ref_sample=ref_sample, ref_draws=ref_draws)
    else:
        scores = score_many(_pair_records(ds, lambda p: p.refs), encoder, spec, prefix=prefix,
                            skip_bad=skip_bad, skipped=skipped, options=options)
        outcomes, keep = _outcomes(ds, scores, ties)
        params.update(ref_sample=None if spec.needs_refs else "n/a (reference-free metric)")
    stats = S.outcome_stats(outcomes, [cats_all[i] for i in keep], order=order, **kw)
    return _result(ds, spec, encoder, prefix, len(keep), stats, skipped, seed, n_resamples, params)


@in_session  # a classic metric's reference draws share one METEOR process
def evaluate(ds: RatingSet | PairSet, encoder: Encoder | None, metric: str | Metric, **options) -> CorrelationResult:
    """Dispatch on the dataset kind (see :func:`evaluate_ratings` and :func:`evaluate_pairs`). A
    :func:`text_only` metric (the classic ones: BLEU, METEOR, ROUGE-L, CIDEr, SPICE) takes ``encoder=None``."""
    if isinstance(ds, PairSet):
        options.pop("columns", None)
        return evaluate_pairs(ds, encoder, metric, **options)
    for k in ("ties", "ref_sample", "ref_draws"):
        options.pop(k, None)
    return evaluate_ratings(ds, encoder, metric, **options)


def _spec(name: str) -> DatasetSpec:
    try:
        return get_dataset(name)
    except CapscoreError:
        return get_dataset("generic")


def _result(ds, spec, encoder, prefix, n, stats, skipped, seed, n_resamples, params) -> CorrelationResult:
    if text_only(spec):
        describe = getattr(spec.image, "describe", None)
        return CorrelationResult(
            dataset=ds.name, source=ds.source, metric=spec.name, backbone="",
            identity=describe(params) if describe else "text only", prefix="", n=n, stats=tuple(stats),
            skipped=skipped, seed=seed, n_resamples=n_resamples, params={**dict(ds.params), **params})
    bb = encoder.backbone
    return CorrelationResult(
        dataset=ds.name, source=ds.source, metric=spec.name, backbone=bb.spec, identity=bb.identity,
        prefix=spec.prefix_for("image", prefix), n=n, stats=tuple(stats),
        skipped=skipped, seed=seed, n_resamples=n_resamples, params={**dict(ds.params), **params})


# ------------------------------------------------------------------------------------ external scores
def read_scores(path, *, column: str = "score", id_column: str = "id", error_ids: set | None = None,
                rows: list | None = None) -> tuple[dict[str, float], dict[str, int]]:
    """A ``capscore score`` output (JSONL/CSV/Parquet with ``id`` and ``score``; rows with an empty
    score — an ``error`` row — are counted, not used) -> (id -> score, skipped counts).
    ``error_ids``, when given, receives the ids of those error rows; ``rows`` each row's (id, image) in
    file order (image "" where the row names none), error rows too."""
    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(str(path), "scores file not found")
    if path.suffix.lower() == ".parquet":
        pq = require("pyarrow.parquet", purpose="reading Parquet")
        try:
            table = ((f"{path}: row {i}", r) for i, r in enumerate(pq.read_table(str(path)).to_pylist()))
        except Exception as e:  # pyarrow raises several types for a non-parquet file
            raise InputError(str(path), f"cannot read parquet ({e})") from None
    else:
        table = read_rows(path)
    out: dict[str, float] = {}
    skipped: dict[str, int] = {}
    for where, row in table:
        if id_column not in row or column not in row:
            raise InputError(where, f"missing column {(id_column if id_column not in row else column)!r}",
                             expected=f"'{id_column}' and '{column}' (use --score-column / --id-column)")
        ident = str(row[id_column])
        if rows is not None:
            rows.append((ident, "" if row.get("image") in (None, "") else str(row["image"])))
        if row[column] in (None, ""):
            skipped["no score (error row)"] = skipped.get("no score (error row)", 0) + 1
            if error_ids is not None:
                error_ids.add(ident)
            continue
        value = _number(row[column], where, repr(column))
        if not math.isfinite(value):
            raise InputError(where, f"{column!r} is not finite", got=row[column])
        if ident in out:
            raise InputError(where, f"duplicate id {ident!r}")
        out[ident] = value
    return out, skipped


def same_image(a: str, b: str) -> bool:
    """Whether two names of an image name the same file, as two files write them: equal paths, or one path
    ending in the other's components (``imgs/a.png``, ``/data/imgs/a.png``); a last component without a
    suffix is a file stem, as image ids are (``a`` names ``a.png``)."""
    pa, pb = (PurePosixPath(x.strip().replace("\\", "/")).parts for x in (a, b))
    n = min(len(pa), len(pb))
    if n == 0 or pa[-n:-1] != pb[-n:-1]:
        return False
    x, y = PurePosixPath(pa[-1]), PurePosixPath(pb[-1])
    return x == y or ((not x.suffix or not y.suffix) and x.stem == y.stem)


def _image_name(ref) -> str:
    return str(ref.path) if ref.path is not None else ref.name


def check_join(path, rows: Sequence[tuple[str, str]], human: RatingSet | PairSet) -> None:
    """Refuse a scores file (``path``; ``rows``: each row's (id, image), error rows too, in file order) whose
    rows would be joined with the wrong judgments: where a row and the item of its id both name an image,
    they must name the same one; ids that are line numbers (1, 2, ..., N in file order: what a file without
    an id column gets) say nothing about the item, so each must be confirmed that way, or the file is
    refused."""
    items = ({f"{p.id}:{side}": _image_name(p.image) for p in human.items for side in "ab"}
             if isinstance(human, PairSet) else {it.record.id: _image_name(it.record.image) for it in human.items})
    positional = [i for i, _ in rows] == [str(n) for n in range(1, len(rows) + 1)]
    fix = "an id column naming the same items as the judgments' ids (capscore correlate --export-items writes them)"
    for ident, mine in rows:
        if ident not in items:
            continue
        theirs = items[ident]
        if mine and theirs and not same_image(mine, theirs):
            how = ("; its ids are line numbers (no id column), and the two files list their items in different "
                   "orders" if positional else "")
            raise InputError(f"{path}: id {ident!r}", f"names image {mine}, but the judged item {ident!r} is image "
                             f"{theirs}{how}", expected=fix)
        if positional and not (mine and theirs):
            side = "the scores file" if not mine else "the judgments"
            raise InputError(str(path), f"its ids are line numbers (1..{len(rows)}: a file without an id column), "
                             f"and {side} name no image to check them against, so its rows cannot be matched with "
                             "the judgments safely", expected=f"{fix}, or an image column in both files")


def read_human(path, *, column: str | None = None, id_column: str = "id") -> RatingSet:
    """Human scores keyed by id (JSONL/CSV): ``id``, a score column (``column`` or one of
    score/human/human_score/rating) and optionally ``group``, ``system``, ``lang``."""
    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(str(path), "human-score file not found")
    items, skipped, seen = [], {}, set()
    for where, row in read_rows(path):
        if id_column not in row:
            raise InputError(where, f"missing column {id_column!r}")
        names = (column,) if column else HUMAN_COLUMNS
        col = next((c for c in names if c in row and row[c] not in (None, "")), None)
        if col is None:
            raise InputError(where, "no human score", expected=f"one of {', '.join(names)}")
        value = _number(row[col], where, repr(col))
        if math.isnan(value):
            skipped[f"NaN {col}"] = skipped.get(f"NaN {col}", 0) + 1
            continue
        ident = str(row[id_column])
        if ident in seen:
            raise InputError(where, f"duplicate id {ident!r}")
        seen.add(ident)
        rec = Record(ident, ImageRef(name=str(row.get("image", ""))), str(row.get("caption", "")),
                     system=str(row.get("system") or ""), source=where)
        items.append(Rated(rec, value, group=str(row.get("group") or row.get("image") or ident),
                           lang=str(row.get("lang") or "")))
    return RatingSet("human-file", str(path), tuple(items), skipped)


def correlate_scores(scores: Mapping[str, float], human: RatingSet | PairSet, *, metric_name: str,
                     columns: Sequence[str] | None = None, ties: str | None = None, n_resamples: int = 1000,
                     seed: int = 0, confidence: float = 0.95, skipped: Mapping[str, int] | None = None,
                     source: str = "") -> CorrelationResult:
    """Correlate externally computed scores (id -> score) with a dataset's judgments, joined on id.

    For a pair dataset the ids are ``PAIRID:a`` and ``PAIRID:b`` (as ``--export-items`` writes
    them). Human items without a score are counted as skipped.
    """
    skipped = {**dict(human.skipped), **dict(skipped or {})}
    kw = dict(n_resamples=n_resamples, seed=seed, confidence=confidence)
    params: dict[str, object] = {"confidence": confidence, "scores": source}
    items: tuple = ()
    if isinstance(human, PairSet):
        ties = ties or _spec(human.name).ties
        out, keep = _outcomes(human, scores, ties)
        missing = len(human.items) - len(keep)
        if missing:
            skipped["pair without both scores"] = missing
        if not keep:
            raise CapscoreError("no pair of the dataset has scores for both captions (ids PAIRID:a / PAIRID:b)")
        if human.name == "foil":
            stats = S.outcome_stats(out, name="accuracy", **kw)
        else:
            cats = [human.items[i].category for i in keep]
            stats = S.outcome_stats(out, cats, order=PASCAL_ORDER if set(cats) <= set(PASCAL_ORDER) else None, **kw)
        params["ties"] = ties
        n = len(keep)
    else:
        kept = [it for it in human.items if it.record.id in scores]
        missing = len(human.items) - len(kept)
        if missing:
            skipped["no score for the id"] = missing
        if not kept:
            raise CapscoreError("no id of the human judgments has a score; check the id columns of both files")
        columns = tuple(columns or _spec(human.name).columns)
        stats = rating_stats([scores[it.record.id] for it in kept], [it.human for it in kept], columns,
                             groups=[it.group for it in kept], systems=[it.record.system for it in kept],
                             langs=[it.lang for it in kept], **kw)
        params["columns"] = list(columns)
        n = len(kept)
        items = tuple((it.record.id, float(scores[it.record.id]), it.human) for it in kept)
    return CorrelationResult(dataset=human.name, source=human.source, metric=metric_name, backbone="",
                             identity="external scores", prefix="", n=n, stats=tuple(stats), skipped=skipped,
                             seed=seed, n_resamples=n_resamples, params={**dict(human.params), **params},
                             items=items)


def export_items(ds: RatingSet | PairSet, path) -> int:
    """Write the dataset's items as JSONL (id, image, caption, refs, system) for ``capscore score``,
    so any scorer's output can come back through ``--scores``. Returns the number of rows."""
    path = Path(path)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        def put(ident, image, caption, refs, system=""):
            nonlocal n
            f.write(json.dumps({"id": ident, "image": str(Path(image.path).resolve()) if image.path else image.where(),
                                "caption": caption, "refs": list(refs), "system": system}) + "\n")
            n += 1
        if isinstance(ds, PairSet):
            for p in ds.items:
                put(f"{p.id}:a", p.image, p.a, p.refs)
                put(f"{p.id}:b", p.image, p.b, p.refs)
        else:
            for it in ds.items:
                r = it.record
                put(r.id, r.image, r.caption, r.refs, r.system)
    return n
