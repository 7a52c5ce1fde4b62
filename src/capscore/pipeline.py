"""The one scoring pipeline: a typed job -> rows (and, with an output, a resumable file and its summary).

::

    ScoreJob(source, models, metrics, prefix, options, output, skip_bad, encoding, chunk_size)
      -> for each (model, metric): the source's items in chunks
         -> score_block(items, encoder, metric)   scores.functional.compute_values: checks, media, Metric.compute
         -> rows tagged with model and metric     (errors become rows with skip_bad, else stop the run)
      -> iter_rows(job)  (capscore.score)   or   run(job)  (capscore score: file + summary)

Every face calls it: ``capscore score`` (images and videos), ``capscore.score`` /
``score_frame``, correlate's scoring (:func:`score_all`), and the Ray engine, whose
actors run :func:`score_block` on their blocks; the torchmetrics ``CaptionScore``
scores each batch with the same core (:mod:`capscore.scores.functional`) without a
job. No metric is implemented twice.

The output protocol (``run`` with an :class:`Output`): rows are written in
input order, chunk by chunk, for one (model, metric) after the other; a
``<out>.summary.json`` says ``running`` and then ``complete`` with the means;
``resume`` matches the rows already written against the inputs (their model,
metric, system and id) and scores only the rest; the output file is locked
against a second writer (:func:`capscore.report.writers.open_writer`).
"""
from __future__ import annotations

import itertools
import json
import math
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from capscore.errors import CapscoreError, InputError, OptionError
from capscore.scores.functional import compute_values
from capscore.scores.metric import DEFAULT_MODEL as DEFAULT_MODEL  # the default --model of every face
from capscore.scores.metric import Metric, get_metric

IMAGE_COLUMNS = ("id", "image", "caption", "system", "model", "metric", "score", "error")
VIDEO_BASE = ("id", "video", "caption", "system", "model", "metric", "score")


# ------------------------------------------------------------------------------------ the job
@dataclass(frozen=True)
class Encoding:
    """Where and how backbones run, and where their vectors are cached."""

    device: str = "cpu"
    dtype: str = "fp32"
    seed: int = 0  # random-init backbones
    context_length: int | None = None
    trust_remote_code: bool = False
    rgb_order: str = "first"
    batch_size: int = 64
    cache_dir: str | None = None  # None: ~/.cache/capscore (or $CAPSCORE_CACHE)
    cache: bool = True  # False: vectors in memory only

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise CapscoreError(f"The 'batch_size' parameter must be a positive integer; got {self.batch_size!r} "
                                "instead.")


@dataclass(frozen=True)
class Output:
    """A rows file (.jsonl, .csv, .parquet, or .json COCO results) and how to treat an existing one."""

    path: Path
    resume: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.resume and self.overwrite:
            raise OptionError("{resume} and {overwrite} contradict each other; choose one")

    @property
    def summary(self) -> Path:
        return summary_path(self.path)


@dataclass(frozen=True)
class ScoreJob:
    """What to score: ``source`` items with every model × metric.

    ``models``: ``--model`` strings, or loaded Backbones/Encoders (the API). ``options``: formula options —
    ``abe`` (dict of ABE-CLIP's k/p/omega/pool), ``sampling`` (video frames), ``idf`` (bool: EMScore idf
    from the references, else the captions).
    """

    source: object  # capscore.data.sources: CaptionFiles | ShardedSource | InMemory
    models: tuple
    metrics: tuple[str, ...]
    prefix: str | None = None
    options: Mapping = field(default_factory=dict)
    output: Output | None = None
    skip_bad: bool = False
    encoding: Encoding = Encoding()
    chunk_size: int = 2048
    progress: bool = True

    @property
    def medium(self) -> str:
        return getattr(self.source, "medium", "image")

    def __post_init__(self) -> None:
        if not self.models:
            raise CapscoreError("The 'models' parameter must name at least one model; got none instead.")
        if not self.metrics:
            raise CapscoreError("The 'metrics' parameter must name at least one metric; got none instead.")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise CapscoreError(f"The 'chunk_size' parameter must be a positive integer; got {self.chunk_size!r} "
                                "instead.")
        for name in self.metrics:
            get_metric(name).formula(self.medium)  # unknown names, or a metric of the other medium, fail now
        unknown = set(self.options) - {"abe", "sampling", "idf"}
        if unknown:
            raise CapscoreError(f"unknown scoring option {sorted(unknown)[0]!r}; options are abe, sampling, idf")
        if self.options.get("abe") and "abe" not in self.metrics:
            raise CapscoreError("ABE-CLIP options (k, p, omega, pool) apply to the metric abe only")


def default_metric(*, has_refs: bool, medium: str = "image") -> str:
    """The metric when none is named: the reference-based one when references are given (RefCLIP-S, whose
    rows also carry the CLIP-S part as image_score; on videos EMScore(X, V, X*)), else CLIP-S."""
    if not has_refs:
        return "clip-s"
    return "emscore-ref" if medium == "video" else "refclip-s"


def summary_path(out: Path) -> Path:
    return Path(out).with_name(Path(out).name + ".summary.json")


def columns_for(medium: str, metrics: Iterable[Metric]) -> tuple[str, ...]:
    """The row columns of a run: the base columns plus every metric's extra ones."""
    extra = tuple(dict.fromkeys(c for m in metrics for c in m.columns(medium)))
    if medium == "video":
        return VIDEO_BASE + extra + ("error",)
    return IMAGE_COLUMNS + extra


# ------------------------------------------------------------------------------------ one block
def score_records(records: Sequence, encoder, metric: "str | Metric", *, medium: str = "image",
                  prefix: str | None = None, options: Mapping | None = None, skip_bad: bool = False) -> list[dict]:
    """One row per record, in order: ``id, image|video, caption, system, score, <metric's columns>, error``.

    The values come from :func:`capscore.scores.functional.compute_values`. A bad caption, image or video
    raises :class:`InputError`, or with ``skip_bad`` becomes a row with ``score=None`` and the one-line
    error. ``prefix`` defaults to the metric's own (``Metric.prefix_for``).
    """
    metric = get_metric(metric)
    errors: dict[int, str] | None = {} if skip_bad else None
    values = compute_values(encoder, metric, records, medium=medium, prefix=metric.prefix_for(medium, prefix),
                            options=options, errors=errors)
    rows = []
    for i, rec in enumerate(records):
        score = values.scores[i]
        if not math.isfinite(score):
            score = None
        row = _base_row(rec, medium)
        row["score"] = score
        for c, column in values.parts.items():
            v = None if score is None else column[i]
            row[c] = None if isinstance(v, float) and not math.isfinite(v) else v
        row["error"] = None if score is not None else (errors or {}).get(i, "could not be scored")
        rows.append(row)
    return rows


def score_all(records: Iterable, encoder, metric: "str | Metric", *, medium: str = "image",
              prefix: str | None = None, options: Mapping | None = None, skip_bad: bool = False,
              chunk_size: int = 2048) -> Iterator[dict]:
    """:func:`score_records` over any number of records, ``chunk_size`` at a time (bounded memory)."""
    it = iter(records)
    while chunk := list(itertools.islice(it, chunk_size)):
        yield from score_records(chunk, encoder, metric, medium=medium, prefix=prefix, options=options,
                                 skip_bad=skip_bad)


def _base_row(rec, medium: str) -> dict:
    media = rec.image
    path = getattr(media, "path", None)
    where = str(path) if path is not None else media.where()
    return {"id": rec.id, ("video" if medium == "video" else "image"): where,
            "caption": rec.caption if isinstance(rec.caption, str) else repr(rec.caption), "system": rec.system}


def score_block(items: list, encoder, metric: Metric, *, medium: str, prefix: str, options: Mapping,
                skip_bad: bool) -> tuple[list[dict], Exception | None]:
    """Rows for a block of loaded items (records and BadItems) and the error that stops the run, if any.

    Without ``skip_bad`` only the items before the first bad one are scored; an error inside the block
    drops the block's rows (the caller writes what it has, and ``resume`` redoes the block). The Ray
    engine's actors run this same function on their blocks.
    """
    from capscore.data.captions import BadItem
    from capscore.data.records import Record

    fatal = None
    if not skip_bad:
        k = next((i for i, x in enumerate(items) if isinstance(x, BadItem)), None)
        if k is not None:
            items, fatal = items[:k], items[k].as_error()
    records = [x for x in items if isinstance(x, Record)]
    try:
        scored = iter(score_records(records, encoder, metric, medium=medium, prefix=prefix, options=options,
                                    skip_bad=skip_bad))
    except InputError as e:
        return [], e
    return [_bad_row(x, medium, metric.columns(medium)) if isinstance(x, BadItem) else next(scored)
            for x in items], fatal


def _bad_row(bad, medium: str, columns: tuple) -> dict:
    row = {"id": bad.id, ("video" if medium == "video" else "image"): bad.image, "caption": bad.caption,
           "system": bad.system, "score": None}
    row.update(dict.fromkeys(columns))
    row["error"] = bad.error
    return row


# ------------------------------------------------------------------------------------ models
def load_encoders(job: ScoreJob, *, progress: bool = False) -> dict:
    """One Encoder per model (name -> Encoder), sharing one cache; Backbones and Encoders are used as given."""
    from capscore.backbones import Backbone, load_backbone
    from capscore.embed.cache import EmbeddingCache
    from capscore.embed.engine import Encoder, MemoryCache

    enc = job.encoding
    cache = EmbeddingCache(enc.cache_dir) if enc.cache else MemoryCache()
    out = {}
    for m in job.models:
        if isinstance(m, Encoder):
            out[m.backbone.spec] = m
            continue
        bb = m if isinstance(m, Backbone) else load_backbone(
            m, device=enc.device, dtype=enc.dtype, seed=enc.seed, context_length=enc.context_length,
            trust_remote_code=enc.trust_remote_code, rgb_order=enc.rgb_order,
            lazy=enc.cache)  # a run served from the persistent cache never builds the model
        out[m if isinstance(m, str) else bb.spec] = Encoder(bb, batch_size=enc.batch_size, cache=cache,
                                                            progress=progress)
    return out


def check_fit(metric: Metric, backbone, medium: str = "image") -> None:
    """Refuse a backbone that lacks what the metric needs; warn (once) when the weights are not the ones
    the metric was made for (the numbers are still computed)."""
    from capscore._log import warn

    needs = metric.needs(medium)
    if "tokens" in needs and not getattr(backbone, "has_token_features", True):
        raise CapscoreError(f"{metric.name} needs per-token text features, which {backbone.spec} does not expose; "
                            "use an open_clip/OpenAI-format model, or the metric clip-s")
    if metric.weights_check is not None:
        message = metric.weights_check(getattr(backbone, "spec", "?"), getattr(backbone, "family", ""))
        if message:
            warn(message)


# ------------------------------------------------------------------------------------ running
class _Runner:
    """The per-(model, metric) loop both :func:`iter_rows` and :func:`run` drive."""

    def __init__(self, job: ScoreJob, encoders: Mapping):
        self.job = job
        self.encoders = dict(encoders)
        self.metrics = {n: get_metric(n) for n in job.metrics}
        self.prefixes = {n: m.prefix_for(job.medium, job.prefix) for n, m in self.metrics.items()}
        self.options = {name: self._options(name) for name in self.metrics}
        self._warned: set[str] = set()
        for enc in self.encoders.values():
            for m in self.metrics.values():
                check_fit(m, enc.backbone, job.medium)

    def _options(self, name: str) -> dict:
        opts = {k: v for k, v in self.job.options.items() if k != "idf"}
        if self.job.medium == "video":
            from capscore.data.video import Sampling

            opts["sampling"] = Sampling.parse(opts.get("sampling") or "uniform:10")
        if name != "abe":
            opts.pop("abe", None)
        return opts

    @property
    def combos(self) -> list[tuple[str, str]]:
        return [(m, n) for m in self.encoders for n in self.metrics]

    def idf(self, model: str, name: str):
        """EMScore's idf for a (model, metric) when asked: over the references, else the captions."""
        if not self.job.options.get("idf") or self.job.medium != "video":
            return None
        from capscore.data.records import Record
        from capscore.scores.video import corpus_idf

        prefix = self.prefixes[name]
        recs = [x for x in self.job.source.items() if isinstance(x, Record)]
        corpus = [prefix + r for x in recs for r in x.refs] or [prefix + x.caption for x in recs
                                                               if isinstance(x.caption, str)]
        return corpus_idf(self.encoders[model], corpus)

    def blocks(self, model: str, name: str, items: Iterator, on_rows=None) -> Iterator[list[dict]]:
        """Scored rows of ``items`` in chunks (tagged with model and metric); raises the first fatal error
        after yielding the rows before it."""
        metric, enc = self.metrics[name], self.encoders[model]
        options = dict(self.options[name])
        idf = self.idf(model, name)
        if idf is not None:
            options["idf"] = idf
        tag = {"model": model, "metric": name}
        corpus = "corpus" in metric.needs(self.job.medium)  # CIDEr: its IDF comes from the whole evaluated set
        for chunk in _chunks(items, sys.maxsize if corpus else self.job.chunk_size):
            self._warn_ignored_refs(metric, chunk)
            rows, fatal = [], None
            for part in _chunks(iter(chunk), len(chunk) if corpus else enc.batch_size):  # progress per batch
                got, fatal = score_block(part, enc, metric, medium=self.job.medium, prefix=self.prefixes[name],
                                         options=options, skip_bad=self.job.skip_bad)
                rows += [r | tag for r in got]
                if on_rows is not None:
                    on_rows(len(got))
                if fatal is not None:
                    break
            yield rows
            if fatal is not None:
                raise fatal

    def _warn_ignored_refs(self, metric: Metric, chunk: list) -> None:
        if metric.needs_refs or metric.name in self._warned:
            return
        if any(getattr(x, "refs", ()) for x in chunk):
            from capscore._log import warn

            self._warned.add(metric.name)
            warn(f"metric {metric.name} ignores the references given; a reference-based metric uses them "
                 f"(refclip-s, refpac-s{', emscore-ref' if self.job.medium == 'video' else ''})")


def iter_rows(job: ScoreJob, *, encoders: Mapping | None = None) -> Iterator[dict]:
    """Every row of the job, (model, metric) after (model, metric), each in input order (no output file)."""
    runner = _Runner(job, encoders if encoders is not None else load_encoders(job))
    for model, name in runner.combos:
        for rows in runner.blocks(model, name, job.source.items()):
            yield from rows


@dataclass
class Summary:
    """Running count/mean/skipped, overall and per system (caption set)."""

    metric: str
    count: int = 0
    skipped: int = 0
    total: float = 0.0
    systems: dict[str, list[float]] = field(default_factory=dict)  # name -> [sum, count]

    def add(self, row: dict) -> None:
        if row.get("score") is None:
            self.skipped += 1
            return
        self.count += 1
        self.total += row["score"]
        acc = self.systems.setdefault(row.get("system") or "", [0.0, 0])
        acc[0] += row["score"]
        acc[1] += 1

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def system_means(self) -> dict[str, float]:
        return {k: s / n for k, (s, n) in sorted(self.systems.items()) if n}

    def as_dict(self) -> dict:
        return {"metric": self.metric, "count": self.count, "mean": None if self.count == 0 else self.mean,
                "skipped": self.skipped, "systems": self.system_means(),
                "system_counts": {k: n for k, (_, n) in sorted(self.systems.items())}}


def run(job: ScoreJob, *, encoders: Mapping | None = None) -> dict:
    """Score the job into ``job.output`` (resumable) and write its summary; returns the summary.

    The summary holds ``runs`` (one per model × metric: count, mean, skipped, per-system means) and the
    run's configuration; with one model and one metric its fields are also at the top level.
    """
    from capscore.report.writers import open_writer

    if job.output is None:
        raise CapscoreError("The 'output' parameter of pipeline.run must be an Output; got None instead.")
    out = Path(job.output.path)
    from capscore.report.writers import output_format

    output_format(out)  # a format we can write, before any model loads
    encoders = encoders if encoders is not None else load_encoders(job, progress=False)
    runner = _Runner(job, encoders)
    columns = columns_for(job.medium, runner.metrics.values())
    writer, prior = open_writer(out, resume=job.output.resume, overwrite=job.output.overwrite, columns=columns)
    try:
        return _run(job, runner, out, writer, prior, columns)
    finally:
        if writer is not None:
            writer.close(complete=False)  # no-op after a successful close
            if prior is None and writer.rows_written == 0 and summary_path(out).exists():
                _drop_running_summary(summary_path(out))


def _config(job: ScoreJob, runner: _Runner) -> dict:
    encs = runner.encoders
    config = {
        "model": _one(list(encs)), "backbone": _one([e.backbone.identity for e in encs.values()]),
        "metric": _one(list(runner.metrics)), "prefix": _one(list(runner.prefixes.values())),
        "dtype": job.encoding.dtype, **job.source.describe(),
    }
    if job.medium == "video":
        config.update(frames=str(next(iter(runner.options.values()))["sampling"]), idf=bool(job.options.get("idf")))
    if "abe" in runner.metrics:  # ABE-CLIP: its configuration decides the numbers
        from capscore.scores.abe import make_config

        cfg = make_config(**dict(job.options.get("abe") or {}))
        config["abe"] = {"k": cfg.k, "p": cfg.p, "omega": cfg.omega,
                         "pool": str(Path(cfg.pool).expanduser().resolve()) if cfg.pool else "bundled"}
    return config


def _run(job: ScoreJob, runner: _Runner, out: Path, writer, prior, columns) -> dict:
    from capscore._log import progress
    from capscore.report.writers import read_rows

    config = _config(job, runner)
    spath = summary_path(out)
    if prior is not None:
        _check_same_run(spath, config)
    write_json(spath, {"status": "running", **config})
    t0 = time.perf_counter()
    prior_rows = _Peek(read_rows(prior, columns)) if prior is not None else None
    runs, resumed, scored = [], 0, 0
    per_input = job.source.count()
    total = None if per_input is None else per_input * len(runner.combos)
    with progress(total, desc="scoring", unit="caption", disable=None if job.progress else True) as bar:
        for model, name in runner.combos:
            tag = {"model": model, "metric": name}
            summary = Summary(metric=name)
            todo = job.source.items()
            if prior_rows is not None:
                _check_prior_tag(prior_rows.peek(), tag, prior, resumed + 1)  # before anything is appended
                mine = prior_rows.take_while(lambda r: all(r.get(k) == v for k, v in tag.items()))
                todo, n = _skip_done(todo, mine, summary, prior)
                resumed += n
                bar.update(n)
            for rows in runner.blocks(model, name, todo, on_rows=bar.update):
                if writer is None:
                    raise OptionError(f"{_braced(out)} is a finished {_writer_kind(out)} file with fewer rows than the "
                                      "inputs have captions; use {overwrite} to score again")
                writer.write(rows)  # the rows before a fatal error are kept, so resume can continue after a fix
                for row in rows:
                    summary.add(row)
                scored += len(rows)
            runs.append({"model": model, "backbone": runner.encoders[model].backbone.identity, **summary.as_dict()})
    if prior_rows is not None and prior_rows.peek() is not None:
        _check_prior_tag(prior_rows.peek(), None, prior, resumed + 1)
        raise OptionError(f"{{resume}}: {_braced(prior)} has more rows than the inputs have captions; "
                          "the inputs changed — use {overwrite} to start again")
    if scored == 0 and resumed == 0:
        raise CapscoreError(f"no captions in {job.source.spec}; nothing to score")
    if writer is not None:
        writer.close(complete=True)
    totals = {"resumed_rows": resumed, "scored_now": scored, "seconds": round(time.perf_counter() - t0, 3),
              "truncated_captions": sum(e.stats.truncated for e in runner.encoders.values())}
    if job.medium == "video":
        st = [e.stats for e in runner.encoders.values()]
        totals.update(videos_encoded=sum(s.videos_encoded for s in st), videos_cached=sum(s.videos_cached for s in st),
                      frames_encoded=sum(s.frames_encoded for s in st),
                      decode_seconds=round(sum(s.decode_seconds for s in st), 3),
                      encode_seconds=round(sum(s.encode_seconds for s in st), 3))
    if len(runs) == 1:
        result = {"status": "complete", **config, **{k: v for k, v in runs[0].items() if k not in config}, **totals}
    else:
        result = {"status": "complete", **config, "runs": runs, **totals}
    write_json(spath, result)
    result["runs"] = runs  # for the caller's printout (the single-run file keeps its flat form)
    return result


def _writer_kind(out: Path) -> str:
    return "COCO results" if out.suffix.lower() == ".json" else "Parquet"


def _one(values: list):
    return values[0] if len(values) == 1 else values


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk


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
def _check_same_run(spath: Path, config: dict) -> None:
    if not spath.exists():
        return
    try:
        before = json.loads(spath.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return  # written atomically; an unreadable one is not ours to judge
    for key, now in config.items():
        if key in before and before[key] != now:
            raise OptionError(f"{{resume}}: {key} was {_braced(repr(before[key]))} in the interrupted run and is "
                              f"{_braced(repr(now))} now; use the same settings, or {{overwrite}} to start again")


def _check_prior_tag(row: dict | None, tag: dict | None, prior: Path, n: int) -> None:
    """The next earlier row (row ``n`` of ``prior``) must belong to the (model, metric) about to run:
    never mix models or metrics, even when the summary file was lost."""
    if row is None or (tag is not None and all(row.get(k) == v for k, v in tag.items())):
        return
    got = f"model {row.get('model')!r}, metric {row.get('metric')!r}"
    want = "" if tag is None else f", and this run asks for model {tag['model']!r}, metric {tag['metric']!r}"
    raise OptionError(f"{{resume}}: row {n} of {_braced(prior)} was scored with {_braced(got + want)}; use the same "
                      "{model} and {metric}, or {overwrite} to start again")


def _skip_done(items: Iterator, rows: Iterable[dict], summary: Summary, prior: Path) -> tuple[Iterator, int]:
    """Match the rows already written, in order, against the inputs; returns (remaining items, count).

    Rows are written in input order, so the first N items are done exactly when
    the N rows carry their (system, id): nothing is scored twice or left out.
    """
    n = 0
    for n, row in enumerate(rows, 1):
        item = next(items, None)
        if item is None:
            raise OptionError(f"{{resume}}: {_braced(prior)} has more rows than the inputs have captions (row {n}); "
                              "the inputs changed — use {overwrite} to start again")
        if (str(row["system"]), str(row["id"])) != (item.system, item.id):
            raise OptionError(f"{{resume}}: row {n} of {_braced(prior)} is {_braced(row['system'])}/"
                              f"{_braced(row['id'])} but input item {n} is {_braced(item.system)}/{_braced(item.id)}; "
                              "the inputs changed — use {overwrite} to start again")
        summary.add(row)
    return items, n


def _drop_running_summary(spath: Path) -> None:
    """A first run that failed before writing a row leaves neither output nor summary behind."""
    try:
        if json.loads(spath.read_text(encoding="utf-8")).get("status") == "running":
            spath.unlink()
    except (OSError, ValueError):
        pass


def _braced(value) -> str:
    """``value`` as text safe inside an OptionError template (its braces doubled)."""
    return (repr(value) if not isinstance(value, (str, Path)) else str(value)).replace("{", "{{").replace("}", "}}")


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` as JSON atomically (a temporary file renamed over ``path``)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def format_summary(result: dict, out: Path, *, quiet: bool = False) -> str:
    """What ``capscore score`` prints after a run: a line per (model, metric), the per-system means, the files."""
    from capscore._table import format_table

    runs, lines, table = result["runs"], [], []
    several = len(runs) > 1
    for r in runs:
        mean = "n/a" if r["mean"] is None else f"{r['mean']:.4f}"
        lines.append(f"{r['metric']} with {r['model']}: {r['count']} scored, {r['skipped']} skipped, mean {mean}")
        head = {"model": r["model"], "metric": r["metric"]} if several else {}
        if len(r["systems"]) > 1 or any(r["systems"]):
            table += [{**head, "system": name, "mean": m, "count": r["system_counts"][name]}
                      for name, m in r["systems"].items()]
        elif several:
            table.append({**head, "system": "", "mean": r["mean"], "count": r["count"]})
    if table:
        lines.append(format_table(table))
    if "videos_encoded" in result and not quiet:
        lines.append(f"videos: {result['videos_encoded']} decoded and encoded ({result['frames_encoded']} frames, "
                     f"{result['frames']}), {result['videos_cached']} from the cache")
    lines.append(f"rows: {out}  summary: {summary_path(out)}")
    return "\n".join(lines)
