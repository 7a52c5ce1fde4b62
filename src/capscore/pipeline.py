"""The one scoring pipeline and its run protocol: a typed job -> rows, a resumable output and a summary.

::

    ScoreJob(source, models, metrics, prefix, options, output, skip_bad, encoding, chunk_size)
      -> encoders            load_encoders: one make_encoder(spec, Encoding) per model, one shared cache
      -> RunConfig           what decides the numbers (models and backbone identities, metrics, prefixes,
                             dtype, formula options, source): recorded in the summary, compared on resume
      -> for each block of items, for each (model, metric):
             score_block(items, encoder, metric)   scores.functional.compute_values: checks, media, Metric.compute
      -> an output           FileOutput (one file) | ShardFolder (a file per input shard)
      -> Summary             per (model, metric): count, skipped, mean, per-system means, and the
                             metric's own aggregate when it defines one

Every face calls it: ``capscore score`` (images and videos), ``capscore.score`` /
``score_frame`` (:func:`iter_rows`), correlate's scoring (:func:`score_all`); the
torchmetrics ``CaptionScore`` scores each batch with the same core
(:mod:`capscore.scores.functional`) without a job. No metric is implemented twice.

Engines. :func:`run` takes an *executor*, which decides only where
:func:`score_block` runs: :class:`LocalExecutor` (this process; the default)
or the Ray engine's (:class:`capscore.engines.ray.RayExecutor`, whose actors
call :func:`score_block` on their blocks). The configuration, its identity
and settings check, the outputs, the summary and its printout are this
module's, for both.

Outputs (:func:`run`):

* :class:`FileOutput` — one rows file (.jsonl, .csv, .parquet, .json COCO
  results) beside ``<out>.summary.json``. Rows are written in input order,
  (model, metric) after (model, metric). ``resume`` matches the rows already
  written against the inputs (model, metric, system, id) and scores only the
  rest; the file is locked against a second writer
  (:func:`capscore.report.writers.open_writer`). The local engine only.
* :class:`ShardFolder` — sharded input (WebDataset, Parquet, HF dataset), one
  rows file per input shard, ``DIR/<stem>-<8 hex of sha1(path)>.<fmt>``
  (:func:`capscore.report.writers.shard_output_name`), each holding that
  shard's rows (model, metric) after (model, metric), in input order; a
  sidecar ``DIR/_shards/<name>.json`` (the run's settings, the input's size
  and mtime, the row count, per-(model, metric) summary states) is written
  before the file is renamed into place, and ``DIR/_summary.json`` lists the
  files in input order. ``resume`` keeps each shard whose sidecar matches
  (settings, input, file, rows), redoes the others and removes the outputs of
  shards no longer given; ``DIR/_run.lock`` holds one driver per folder. Both
  engines write this layout, and the settings compared leave the engine out,
  so either engine resumes a folder the other began (a shard the other left
  unfinished is scored again from its start). Until its commit, a shard's rows
  live under ``DIR/_shards/parts/<name>/``: the Ray engine's block files, or
  the local engine's JSONL journal, which the local engine resumes row by row.

What reaches disk when. Rows are written (and fsynced) when ``chunk_size``
rows are waiting or :data:`FLUSH_SECONDS` have passed since the last write,
whichever comes first, so an interrupted run loses at most a few seconds of
scored rows; Ctrl-C (KeyboardInterrupt) and SIGTERM write the rows already
scored before the run ends. The summary says ``running`` until the run
completes.

Extension points. A metric's own headline (corpus-level scores) is an
:class:`~capscore.scores.aggregate.Aggregate` factory on its registry row
(``Metric.aggregate``); :class:`Summary` keeps one per (model, metric) and per
system beside the mean, rebuilds it from rows on resume and merges per-shard
states. Models that metrics bring besides the backbone (learned heads,
sentence encoders) belong beside :func:`load_encoders`: loaded once per run,
keyed in :class:`RunConfig` by their identity, and handed to ``score_block``
with the encoder.
"""
from __future__ import annotations

import itertools
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from capscore.embed.factory import Encoding, make_encoder, open_cache, tower_encoder  # Encoding: also capscore.pipeline.Encoding
from capscore.errors import CapscoreError, InputError, OptionError, braced
from capscore.report.writers import (
    JOURNAL, JOURNAL_INPUT, OutputLock, RowWriter, ShardFiles, load_json, open_writer, output_format, output_names,
    read_rows, repair, write_json,
)
from capscore.scores.functional import compute_values
from capscore.scores.metric import DEFAULT_MODEL as DEFAULT_MODEL  # the default --model of every face
from capscore.scores.metric import Metric, get_metric, registry
from capscore._log import progress, warn
from capscore._table import format_table
from capscore.data.captions import BadItem
from capscore.data.records import Record
from capscore.scores.aggregate import Mean, aggregate_for
from capscore.scores.learned import weights_dir
from capscore.scores.specs import is_specs_checkpoint
from capscore.scores.video import corpus_idf

IMAGE_COLUMNS = ("id", "image", "caption", "system", "model", "metric", "score", "error")
VIDEO_BASE = ("id", "video", "caption", "system", "model", "metric", "score")
FLUSH_SECONDS = 5.0  # scored rows wait at most this long in memory before they are written
ROW_FILE_SUFFIXES = (".jsonl", ".csv", ".parquet", ".json")
SHARD_FORMATS = ("parquet", "jsonl", "csv")


# ------------------------------------------------------------------------------------ the job
@dataclass(frozen=True)
class FileOutput:
    """One rows file (.jsonl, .csv, .parquet, or .json COCO results) and how to treat an existing one.
    A format that cannot be written is refused when the output is made, before any input is read."""

    path: Path
    resume: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.resume and self.overwrite:
            raise OptionError("{resume} and {overwrite} contradict each other; choose one")
        output_format(Path(self.path))

    @property
    def summary(self) -> Path:
        return summary_path(self.path)


@dataclass(frozen=True)
class ShardFolder:
    """A folder with one rows file per input shard (``format``: parquet, jsonl or csv); see the module docstring."""

    path: Path
    format: str = "parquet"
    resume: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.resume and self.overwrite:
            raise OptionError("{resume} and {overwrite} contradict each other; choose one")
        if self.format not in SHARD_FORMATS:
            raise CapscoreError(f"The 'format' parameter of ShardFolder must be one of {list(SHARD_FORMATS)}; got "
                                f"{self.format!r} instead.")
        out = Path(self.path)
        if out.suffix.lower() in ROW_FILE_SUFFIXES and not out.is_dir():
            raise OptionError(f"a folder output holds one file per input shard (the Ray engine writes no other); "
                              f"{{out}} {braced(out)} names a {out.suffix} file — give a folder such as "
                              f"{braced(out.with_suffix(''))}/")
        if out.exists() and not out.is_dir():
            raise OptionError(f"{{out}} {braced(out)} is a file; a folder output needs a folder")

    @property
    def summary(self) -> Path:
        return Path(self.path) / "_summary.json"


Output = FileOutput | ShardFolder


def is_folder_output(path: str | Path) -> bool:
    """Whether ``--out`` names a folder of shard files: an existing folder, a path ending in a separator,
    or one without a file suffix (``results/``, ``results``); ``results.jsonl`` names one file."""
    text = str(path)
    p = Path(text)
    return p.is_dir() or text.endswith(("/", "\\")) or p.suffix == ""


@dataclass(frozen=True)
class ScoreJob:
    """What to score: ``source`` items with every model × metric.

    ``models``: ``--model`` strings, or loaded Backbones/Encoders (the API); a text-only metric
    (:meth:`Metric.text_only`: BLEU, METEOR, ROUGE-L, CIDEr-D, SPICE) is scored once, with no model, so a
    job of text-only metrics names none. ``options``: formula options — ``abe`` (dict of ABE-CLIP's
    k/p/omega/pool), ``sampling`` (video frames), ``idf`` (bool: EMScore idf from the references, else the
    captions), ``tokenizer`` and ``classic_backend`` (the classic metrics). ``metric_choice``: why the
    metric was chosen when the caller named none (:func:`choose_metric`; recorded in the summary).
    """

    source: object  # capscore.data.sources: CaptionFiles | ShardedSource | InMemory
    models: tuple
    metrics: tuple[str, ...]
    prefix: str | None = None
    options: Mapping = field(default_factory=dict)
    output: FileOutput | ShardFolder | None = None
    skip_bad: bool = False
    encoding: Encoding = Encoding()
    chunk_size: int = 2048
    progress: bool = True
    metric_choice: str = ""

    @property
    def medium(self) -> str:
        return getattr(self.source, "medium", "image")

    @property
    def encodes(self) -> bool:
        """Whether a metric of the job needs a backbone (else its models are not loaded)."""
        return not all(get_metric(n).backbone_free(self.medium) for n in self.metrics)

    def __post_init__(self) -> None:
        if not self.metrics:
            raise CapscoreError("The 'metrics' parameter must name at least one metric; got none instead.")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise CapscoreError(f"The 'chunk_size' parameter must be a positive integer; got {self.chunk_size!r} "
                                "instead.")
        for name in self.metrics:
            metric = get_metric(name)  # an unknown name: did-you-mean
            if self.medium not in metric.media:
                other = metric.media[0]
                raise OptionError(f"{{metrics:--metric}} {braced(repr(name))} scores {other}s, not {self.medium}s; "
                                  f"use it with {{{other}s}}")
        if not self.models and self.encodes:
            raise CapscoreError("The 'models' parameter must name at least one model for the metrics that encode "
                                "images; got none instead.")
        unknown = set(self.options) - {"abe", "sampling", "idf", "tokenizer", "classic_backend", *LEARNED_OPTIONS}
        if unknown:
            raise CapscoreError(f"unknown scoring option {sorted(unknown)[0]!r}; options are abe, sampling, idf, "
                                "tokenizer, classic_backend, metric_weights, explain")
        if self.medium == "video":
            _sampling(self)  # a bad frame sampling fails before any model loads
        elif self.options.get("sampling") or self.options.get("idf"):
            raise OptionError("the {sampling:--frames} and {idf} options apply to videos only")
        if self.options.get("abe"):
            if "abe" not in self.metrics:
                raise OptionError("ABE-CLIP's {options:--abe-k/--abe-p/--abe-omega/--concept-pool} apply to "
                                  "{metrics:--metric} abe only")
            from capscore.scores.abe import make_config  # noqa: PLC0415  (deferred: numpy, torch)

            make_config(**self.options["abe"])  # unknown options, bad values, a missing pool: before any model loads
        if isinstance(self.output, ShardFolder) and not hasattr(self.source, "shards"):
            raise OptionError(f"{{out}} {braced(self.output.path)} is a folder of one file per input shard, which "
                              "needs sharded input (WebDataset, Parquet or a Hugging Face dataset); name a file such "
                              "as results.jsonl")


#: The options of the metrics that bring their own models (:mod:`capscore.scores.learned`).
LEARNED_OPTIONS = ("metric_weights", "explain")


def default_metric(*, has_refs: bool, medium: str = "image", models: Sequence = ()) -> str:
    """The metric when none is named: the reference-based one when references are given (RefCLIP-S, whose
    rows also carry the CLIP-S part as image_score; on videos EMScore(X, V, X*)), else CLIP-S -- or the
    SPECS score when every model is a SPECS checkpoint (:func:`capscore.scores.specs.is_specs_checkpoint`)."""
    if not has_refs:
        if medium == "image" and models and all(is_specs_checkpoint(m) for m in models):
            return "specs"
        return "clip-s"
    return "emscore-ref" if medium == "video" else "refclip-s"


def choose_metric(source, medium: str = "image", *, models: Sequence = ()) -> tuple[str, str]:
    """The default metric for ``source`` and why: the same references give the same metric wherever they
    were written (a references file, a ``refs`` field of the captions, a references column)."""
    has = bool(source.has_refs())
    name = default_metric(has_refs=has, medium=medium, models=models)
    return name, f"default: the records {'carry' if has else 'carry no'} references"


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
        reached = i not in (errors or {})  # the formula ran on it: its columns are kept (a judge's answer)
        for c, column in values.parts.items():
            if c == "error":
                continue
            v = column[i] if score is not None or reached else None
            row[c] = None if isinstance(v, float) and not math.isfinite(v) else v
        reason = values.parts.get("error", [None] * len(records))[i]
        row["error"] = None if score is not None else (errors or {}).get(i) or reason or "could not be scored"
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
def load_encoders(job: ScoreJob, *, progress: bool = False, encoding: Encoding | None = None) -> dict:
    """One Encoder per model (name -> Encoder) from :func:`capscore.embed.factory.make_encoder`, sharing one
    cache; Backbones and Encoders are used as given. ``encoding``: instead of the job's (the Ray driver
    loads on the CPU what its actors run on the job's device)."""
    if not job.encodes:  # text-only metrics: no model is loaded, nothing imports torch
        return {}
    enc = encoding or job.encoding
    store = open_cache(enc)
    out = {}
    for m in job.models:
        encoder = make_encoder(m, enc, store=store, progress=progress)
        out[m if isinstance(m, str) else encoder.backbone.spec] = encoder
    return out


def check_fit(metric: Metric, backbone, medium: str = "image") -> None:
    """Refuse a backbone that lacks what the metric needs; warn (once) when the weights are not the ones
    the metric was made for (the numbers are still computed)."""
    needs = metric.needs(medium)
    if "tokens" in needs and not getattr(backbone, "has_token_features", True):
        raise CapscoreError(f"{metric.name} needs per-token text features, which {backbone.spec} does not expose; "
                            "use an open_clip/OpenAI-format model, or the metric clip-s")
    if metric.weights_check is not None:
        message = metric.weights_check(getattr(backbone, "spec", "?"), getattr(backbone, "family", ""))
        if message:
            warn(message)


# ------------------------------------------------------------------------------------ the run's configuration
def _one(values: list):
    return values[0] if len(values) == 1 else values


def _sampling(job: ScoreJob):
    """The frames a video job scores (default :data:`capscore.data.video.DEFAULT_SAMPLING`)."""
    from capscore.data.video import DEFAULT_SAMPLING, Sampling  # noqa: PLC0415  (deferred: numpy)

    return Sampling.parse(job.options.get("sampling") or DEFAULT_SAMPLING)


def _json(value):
    """``value`` as it reads back from JSON (tuples become lists), so a stored configuration compares equal."""
    return json.loads(json.dumps(value, ensure_ascii=False))


@dataclass(frozen=True)
class RunConfig:
    """What decides a run's numbers, made from a :class:`ScoreJob` and its loaded encoders (:meth:`of`).

    The summary records it (:meth:`as_dict`); ``resume`` compares it with the record of the interrupted
    run (:func:`_check_settings`): the whole of it for one file, its :meth:`settings` (everything but where
    the input files are) per shard of a folder, whose shards are matched by their own size and mtime.
    """

    models: tuple[str, ...]
    backbones: tuple[str, ...]  # each model's backbone identity (weights hash, context, preprocessing)
    metrics: tuple[str, ...]
    prefixes: tuple[str, ...]  # per metric
    dtype: str
    options: Mapping  # formula options, JSON-able: abe {k, p, omega, pool}; video: frames, idf
    source: Mapping  # the source's description (its files)
    source_settings: Mapping  # how the source is read (for sharded input: its kind and column options)

    @classmethod
    def of(cls, job: ScoreJob, encoders: Mapping) -> "RunConfig":
        metrics = tuple(job.metrics)
        options: dict = {}
        if job.medium == "video":
            options.update(frames=str(_sampling(job)), idf=bool(job.options.get("idf")))
        if "abe" in metrics:  # ABE-CLIP: its configuration decides the numbers
            from capscore.scores.abe import make_config  # noqa: PLC0415  (deferred: numpy, torch)

            cfg = make_config(**dict(job.options.get("abe") or {}))
            options["abe"] = {"k": cfg.k, "p": cfg.p, "omega": cfg.omega,
                              "pool": str(Path(cfg.pool).expanduser().resolve()) if cfg.pool else "bundled"}
        if any(get_metric(n).own_models for n in metrics):  # the released files decide their numbers
            options["metric_weights"] = str(weights_dir(job.options.get("metric_weights")).resolve())
            if job.options.get("explain"):
                options["explain"] = True
        text = [get_metric(n) for n in metrics if get_metric(n).text_only(job.medium)]
        if text:  # the classic metrics: what tokenises and scores them decides their numbers
            options.update(tokenizer=job.options.get("tokenizer", "ptb"),
                           classic_backend=job.options.get("classic_backend", "native"))
            describe = getattr(text[0].formula(job.medium), "describe", None)
            if describe is not None:
                options["text_metrics"] = describe(job.options)
        source = job.source.describe()
        settings = job.source.settings() if hasattr(job.source, "settings") else source
        return cls(models=tuple(encoders), backbones=tuple(e.backbone.identity for e in encoders.values()),
                   metrics=metrics, prefixes=tuple(get_metric(n).prefix_for(job.medium, job.prefix)
                                                   for n in metrics),
                   dtype=job.encoding.dtype, options=_json(options), source=_json(source),
                   source_settings=_json(settings))

    def prefix(self, metric: str) -> str:
        return self.prefixes[self.metrics.index(metric)]

    def _head(self) -> dict:
        return {"model": _one(list(self.models)) if self.models else None,
                "backbone": _one(list(self.backbones)) if self.backbones else None,
                "metric": _one(list(self.metrics)), "prefix": _one(list(self.prefixes)),
                "dtype": self.dtype if self.models else None}

    def as_dict(self) -> dict:
        """The configuration as the summary records it (a single model/metric/prefix as a value, several as a list)."""
        return {**self._head(), **self.source, **self.options}

    def settings(self) -> dict:
        """:meth:`as_dict` without where the input files are: what every shard of a folder must share."""
        return {**self._head(), **self.source_settings, **self.options}


def _check_settings(before: Mapping | None, now: Mapping) -> None:
    """Refuse to resume when a key of the configuration ``now`` was recorded (``before``: a summary's or a
    sidecar's) with another value; a key not recorded (an older file) is no change, an unreadable record
    (None) is not ours to judge."""
    if not isinstance(before, Mapping):
        return
    for key, value in now.items():
        if key in before and before[key] != value:
            why = f"{key} was {before[key]!r} in the interrupted run and is {value!r} now"
            raise OptionError(f"{{resume}}: {braced(why)}; use the same settings, or {{overwrite}} to start again")


# ------------------------------------------------------------------------------------ summaries
class _Tally:
    """Count, mean and the metric's own aggregate (when it has one) of some scored rows."""

    def __init__(self, metric: Metric):
        self.mean = Mean()
        self.own = aggregate_for(metric)

    def add(self, row: Mapping) -> None:
        self.mean.add(row)
        if self.own is not None:
            self.own.add(row)

    def state(self) -> dict:
        return {"mean": self.mean.state(), "own": None if self.own is None else self.own.state()}

    def merge(self, state: Mapping) -> None:
        self.mean.merge(state["mean"])
        if self.own is not None and state.get("own") is not None:
            self.own.merge(state["own"])


class Summary:
    """One (model, metric) of a run: count, skipped, the mean of the scores, per system (caption set), and
    the metric's own aggregate when its registry row defines one (:mod:`capscore.scores.aggregate`).

    Built row by row (:meth:`add`) or from the JSON-able states of parts scored apart (:meth:`merge`:
    shards, Ray blocks, the rows of an interrupted run), which give the one-pass numbers exactly.
    """

    def __init__(self, metric: str | Metric, *, model: str | None = "", backbone: str | None = ""):
        self.metric = get_metric(metric)
        self.model, self.backbone = model, backbone
        self.skipped = 0
        self.total = _Tally(self.metric)
        self.systems: dict[str, _Tally] = {}

    @property
    def count(self) -> int:
        return self.total.mean.n

    @property
    def mean(self) -> float:
        value = self.total.mean.value()
        return float("nan") if value is None else value

    def _system(self, name: str) -> _Tally:
        if name not in self.systems:
            self.systems[name] = _Tally(self.metric)
        return self.systems[name]

    def add(self, row: Mapping) -> None:
        if row.get("score") is None:
            self.skipped += 1
            return
        self.total.add(row)
        self._system(str(row.get("system") or "")).add(row)

    def state(self) -> dict:
        return {"skipped": self.skipped, "total": self.total.state(),
                "systems": {k: t.state() for k, t in self.systems.items()}}

    def merge(self, state: Mapping) -> "Summary":
        self.skipped += int(state["skipped"])
        self.total.merge(state["total"])
        for name, st in state["systems"].items():
            self._system(name).merge(st)
        return self

    def system_means(self) -> dict[str, float]:
        return {k: t.mean.value() for k, t in sorted(self.systems.items()) if t.mean.n}

    def as_dict(self) -> dict:
        out = {"model": self.model, "backbone": self.backbone, "metric": self.metric.name, "count": self.count,
               "mean": self.total.mean.value(), "skipped": self.skipped, "systems": self.system_means(),
               "system_counts": {k: t.mean.n for k, t in sorted(self.systems.items())}}
        if self.metric.own_models:  # no model, by design: the metric's own released files made the scores
            out["own_models"] = True
        own = self.total.own
        if own is not None:
            out["aggregate"] = {"name": own.name, "value": own.value(),
                                "systems": {k: t.own.value() for k, t in sorted(self.systems.items())}}
            if getattr(own, "per_caption", None):  # what the rows' score (and so the mean) is
                out["aggregate"]["per_caption"] = own.per_caption
        return out


# ------------------------------------------------------------------------------------ running
@dataclass(frozen=True)
class Plan:
    """What scoring a block needs besides its items and the encoder; picklable (the Ray actors hold one)."""

    medium: str
    metrics: tuple[str, ...]
    prefixes: Mapping  # metric -> prefix
    options: Mapping  # metric -> formula options
    skip_bad: bool
    columns: tuple[str, ...]

    def score(self, items: list, encoder, model: str, metric: str, *, extra: Mapping | None = None):
        """:func:`score_block` for one (model, metric): (rows tagged with both, the error that stops the run)."""
        options = {**self.options[metric], **(extra or {})}
        rows, fatal = score_block(items, encoder, get_metric(metric), medium=self.medium,
                                  prefix=self.prefixes[metric], options=options, skip_bad=self.skip_bad)
        return [r | {"model": model, "metric": metric} for r in rows], fatal


class _Runner:
    """A job with its encoders: the configuration and the per-(model, metric) loop every engine and output use.

    A text-only metric runs once, as the (model ``None``, metric) pair, before the pairs of the metrics that
    encode (model × metric, model-major); its rows and summary record no model."""

    def __init__(self, job: ScoreJob, encoders: Mapping):
        self.job = job
        self.encoders = dict(encoders)
        self.metrics = {n: get_metric(n) for n in job.metrics}
        self.text = [n for n, m in self.metrics.items() if m.backbone_free(job.medium)]  # scored once, no model
        self.config = RunConfig.of(job, self.encoders)
        self.plan = Plan(job.medium, tuple(self.metrics), {n: self.config.prefix(n) for n in self.metrics},
                         {n: self._options(n) for n in self.metrics}, job.skip_bad,
                         columns_for(job.medium, self.metrics.values()))
        self._warned: set[str] = set()
        self._towers: dict[str, object] = {}
        for enc in self.encoders.values():
            for n, m in self.metrics.items():
                if n not in self.text:
                    check_fit(m, enc.backbone, job.medium)

    def _options(self, name: str) -> dict:
        opts = {k: v for k, v in self.job.options.items() if k != "idf"}
        if self.job.medium == "video":
            opts["sampling"] = _sampling(self.job)
        if name != "abe":
            opts.pop("abe", None)
        if self.metrics[name].own_models:  # where their own models run
            opts.update(device=self.job.encoding.device, dtype=self.job.encoding.dtype)
        else:
            for k in LEARNED_OPTIONS:
                opts.pop(k, None)
        return opts

    @property
    def combos(self) -> list[tuple[str | None, str]]:
        return [(None, n) for n in self.text] + [(m, n) for m in self.encoders for n in self.metrics
                                                 if n not in self.text]

    def summaries(self) -> dict[tuple[str | None, str], Summary]:
        return {(m, n): Summary(self.metrics[n], model=m, backbone=None if m is None else
                                self.encoders[m].backbone.identity) for m, n in self.combos}

    @contextmanager
    def sessions(self, *, load_own_models: bool = True):
        """The run-level contexts of the job's formulas, open for the whole run (a formula's ``session(texts,
        options)``: the classic metrics' one ClassicSession, one PTB pass over every text of the run and
        their tool checks, before anything is scored). ``texts`` is None for a source of unknown size
        (sharded input): each block then tokenises its own texts. ``load_own_models=False`` (a driver whose
        workers load them: the Ray engine): the metrics that bring their own models get the option
        ``check_only`` and only check that their files are there."""
        with ExitStack() as stack:
            for name, metric in self.metrics.items():
                hook = getattr(metric.formula(self.job.medium), "session", None)
                if hook is not None:
                    texts = (lambda p=self.plan.prefixes[name]: self._texts(p)) \
                        if self.job.source.count() is not None else None
                    check = {"check_only": True} if metric.own_models and not load_own_models else {}
                    stack.enter_context(hook(texts, {**self.plan.options[name], **check}))
            yield

    def _texts(self, prefix: str) -> Iterator[str]:
        for x in self.job.source.items():
            if isinstance(x, Record) and isinstance(x.caption, str):
                yield prefix + x.caption
                yield from (prefix + r for r in x.refs if isinstance(r, str))

    def idf(self, model: str, name: str):
        """EMScore's idf for a (model, metric) when asked: over the references, else the captions."""
        if not self.job.options.get("idf") or self.job.medium != "video":
            return None

        prefix = self.plan.prefixes[name]
        recs = [x for x in self.job.source.items() if isinstance(x, Record)]
        corpus = [prefix + r for x in recs for r in x.refs] or [prefix + x.caption for x in recs
                                                               if isinstance(x.caption, str)]
        return corpus_idf(self.encoders[model], corpus)

    def tower(self, name: str):
        """The encoder of metric ``name``'s own image tower (Polos's and DENEB's CLIP: a formula's
        ``tower(options)``), None for the others: the run's encoder of a backbone giving the same vectors,
        else one of the tower on the run's cache (:func:`capscore.embed.factory.tower_encoder`). Made at
        the metric's first block, once per run."""
        if name not in self._towers:
            formula, enc = self.metrics[name].formula(self.job.medium), None
            if hasattr(formula, "tower"):
                store = next((e.cache for e in self.encoders.values()), None)
                enc = tower_encoder(formula.tower(self.plan.options[name]), self.encoders.values(),
                                    self.job.encoding, store=store if store is not None else open_cache(self.job.encoding))
            self._towers[name] = enc
        return self._towers[name]

    def all_encoders(self) -> list:
        """The run's encoders and its metrics' tower encoders, each once (for the summary's totals)."""
        out = list(self.encoders.values())
        return out + [e for e in dict.fromkeys(self._towers.values()) if e is not None and all(e is not o for o in out)]

    def blocks(self, model: str, name: str, items: Iterator) -> Iterator[list[dict]]:
        """Scored rows of ``items`` block by block (an encoder batch, or ``chunk_size`` items when smaller;
        a corpus metric such as CIDEr takes all at once; a metric with its own models, ``chunk_size``
        items), tagged with model and metric; raises the first fatal error after yielding the rows before it."""
        metric = self.metrics[name]
        enc = self.tower(name) if model is None else self.encoders[model]
        idf = self.idf(model, name)
        extra = {"idf": idf} if idf is not None else None
        corpus = "corpus" in metric.needs(self.job.medium)  # CIDEr: its IDF comes from the whole evaluated set
        size = sys.maxsize if corpus else self.job.chunk_size if model is None else min(enc.batch_size,
                                                                                          self.job.chunk_size)
        for part in _chunks(items, size):
            self._warn_ignored_refs(metric, part)
            rows, fatal = self.plan.score(part, enc, model, name, extra=extra)
            yield rows
            if fatal is not None:
                raise fatal

    def _warn_ignored_refs(self, metric: Metric, chunk: list) -> None:
        if metric.needs_refs or metric.name in self._warned:
            return
        if any(getattr(x, "refs", ()) for x in chunk):
            self._warned.add(metric.name)
            warn(f"metric {metric.name} ignores the references given; a reference-based metric uses them "
                 f"(refclip-s, refpac-s{', emscore-ref' if self.job.medium == 'video' else ''})")


def iter_rows(job: ScoreJob, *, encoders: Mapping | None = None) -> Iterator[dict]:
    """Every row of the job, (model, metric) after (model, metric), each in input order (no output file)."""
    runner = _Runner(job, encoders if encoders is not None else load_encoders(job))
    with runner.sessions():
        for model, name in runner.combos:
            for rows in runner.blocks(model, name, job.source.items()):
                yield from rows


class _Buffered:
    """Rows on their way to a writer: written (and fsynced) when ``max_rows`` wait or ``seconds`` passed since
    the last write; :meth:`flush` writes the rest (also when the run is interrupted)."""

    def __init__(self, writer, *, max_rows: int, seconds: float = FLUSH_SECONDS):
        self.writer, self.max_rows, self.seconds = writer, max_rows, seconds
        self._rows: list[dict] = []
        self._since = time.monotonic()

    def write(self, rows: list[dict]) -> None:
        self._rows += rows
        if len(self._rows) >= self.max_rows or time.monotonic() - self._since >= self.seconds:
            self.flush()

    def flush(self) -> None:
        rows, self._rows = self._rows, []  # taken first: an interrupted write is never written twice
        self._since = time.monotonic()
        if rows:
            self.writer.write(rows)


@contextmanager
def _sigterm_interrupts():
    """SIGTERM ends the run as Ctrl-C does (KeyboardInterrupt), so the rows already scored are written first.
    Only the main thread can set a handler; elsewhere the default stays."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Executor(Protocol):
    """Where a folder run's blocks are scored: this process (:class:`LocalExecutor`) or a Ray cluster.

    ``encoders(job)`` loads the driver's encoders, whose backbones name the run (:class:`RunConfig`);
    ``score_shards`` scores the shards of ``todo`` ((name, Shard) pairs) into ``folder`` and returns each
    shard's sidecar (:meth:`_Folder.meta`), committed with its file
    (:meth:`capscore.report.writers.ShardFiles.commit`). An executor whose workers load the models of the
    metrics that bring their own sets ``loads_own_models = False``: the driver then only checks their files."""

    def encoders(self, job: ScoreJob) -> Mapping: ...

    def score_shards(self, runner: _Runner, todo: list, folder: "_Folder", bar) -> dict[str, dict]: ...


def run(job: ScoreJob, *, encoders: Mapping | None = None, executor: Executor | None = None) -> dict:
    """Score the job into ``job.output`` (resumable) and write its summary; returns the summary.

    The summary holds ``runs`` (one per model × metric: count, mean, skipped, per-system means) and the
    run's configuration; with one model and one metric its fields are also at the top level. ``executor``:
    where the blocks of a :class:`ShardFolder` run are scored (default :class:`LocalExecutor`).
    """
    output = job.output
    if not isinstance(output, (FileOutput, ShardFolder)):
        raise CapscoreError("The 'output' parameter of pipeline.run must be a FileOutput or a ShardFolder; got "
                            f"{output!r} instead.")
    text = [n for n in job.metrics if get_metric(n).text_only(job.medium)]
    if text and executor is not None and not isinstance(executor, LocalExecutor):
        raise OptionError(f"the text-only metrics ({', '.join(text)}) run in this process, with one session of "
                          "their Java tools; score them without {engine} ray")
    corpus = [n for n in job.metrics if "corpus" in get_metric(n).needs(job.medium)]
    if corpus and isinstance(output, ShardFolder):
        raise OptionError(f"{corpus[0]} scores the whole evaluated set at once (CIDEr's IDF), but a folder output "
                          "scores each input shard apart; write one file ({out} results.jsonl)")
    with _sigterm_interrupts():
        if isinstance(output, ShardFolder):
            executor = executor or LocalExecutor()
            runner = _Runner(job, encoders if encoders is not None else executor.encoders(job))
            with runner.sessions(load_own_models=getattr(executor, "loads_own_models", True)):
                return _run_folder(job, runner, executor)
        if executor is not None and not isinstance(executor, LocalExecutor):
            raise OptionError(f"the {type(executor).__name__} writes one file per input shard, so its {{out}} is a "
                              f"folder; {braced(output.path)} names a file — give a folder such as "
                              f"{braced(Path(output.path).with_suffix(''))}/")
        runner = _Runner(job, encoders if encoders is not None else load_encoders(job))
        with runner.sessions():
            return _run_file(job, runner)


def _progress(job: ScoreJob, runner: _Runner):
    per_input = job.source.count()
    total = None if per_input is None else per_input * len(runner.combos)
    return progress(total, desc="scoring", unit="caption", disable=None if job.progress else True)


def _score_into(runner: _Runner, items, writer, prior, summaries: dict, bar, *, where: Path) -> tuple[int, int]:
    """Every (model, metric) of ``runner`` over ``items()`` into ``writer`` (None: a finished file), after the
    rows of ``prior`` (a :class:`_Peek` over the rows already written to ``where``, or None) that match the
    inputs. Returns (rows resumed, rows scored now)."""
    resumed = scored = 0
    for model, name in runner.combos:
        tag = {"model": model, "metric": name}
        summary = summaries[(model, name)]
        todo = items()
        if prior is not None:
            _check_prior_tag(prior.peek(), tag, where, resumed + 1)  # before anything is appended
            mine = prior.take_while(lambda r: all(r.get(k) == v for k, v in tag.items()))
            todo, n = _skip_done(todo, mine, summary, where)
            resumed += n
            bar.update(n)
        for rows in runner.blocks(model, name, todo):
            if writer is None:
                raise OptionError(f"{braced(where)} is a finished {_writer_kind(where)} file with fewer rows than "
                                  "the inputs have captions; use {overwrite} to score again")
            writer.write(rows)  # the rows before a fatal error are kept, so resume can continue after a fix
            for row in rows:
                summary.add(row)
            scored += len(rows)
            bar.update(len(rows))
    if prior is not None and prior.peek() is not None:
        _check_prior_tag(prior.peek(), None, where, resumed + 1)
        raise OptionError(f"{{resume}}: {braced(where)} has more rows than the inputs have captions; "
                          "the inputs changed — use {overwrite} to start again")
    return resumed, scored


def _totals(job: ScoreJob, runner: _Runner, t0: float) -> dict:
    encoders = runner.all_encoders()
    totals = {"seconds": round(time.perf_counter() - t0, 3),
              "truncated_captions": sum(getattr(e.stats, "truncated", 0) for e in encoders)}
    if job.medium == "video":
        st = [e.stats for e in encoders]
        totals.update(videos_encoded=sum(s.videos_encoded for s in st), videos_cached=sum(s.videos_cached for s in st),
                      frames_encoded=sum(s.frames_encoded for s in st),
                      decode_seconds=round(sum(s.decode_seconds for s in st), 3),
                      encode_seconds=round(sum(s.encode_seconds for s in st), 3))
    return totals


def _record(config: dict, summaries: Iterable[Summary], totals: dict, job: ScoreJob) -> tuple[dict, list[dict]]:
    """The complete summary file's content, and the runs (for the printout)."""
    runs = [s.as_dict() for s in summaries]
    head = {"status": "complete", **config, **({"metric_choice": job.metric_choice} if job.metric_choice else {})}
    if len(runs) == 1:
        return {**head, **{k: v for k, v in runs[0].items() if k not in config}, **totals}, runs
    return {**head, "runs": runs, **totals}, runs


def _run_file(job: ScoreJob, runner: _Runner) -> dict:
    out = Path(job.output.path)
    columns = runner.plan.columns
    writer, prior = open_writer(out, resume=job.output.resume, overwrite=job.output.overwrite, columns=columns)
    buffered = _Buffered(writer, max_rows=job.chunk_size) if writer is not None else None
    spath = summary_path(out)
    config = runner.config.as_dict()
    try:
        if prior is not None:
            _check_settings(load_json(spath), config)
        write_json(spath, {"status": "running", **config})
        t0 = time.perf_counter()
        summaries = runner.summaries()
        prior_rows = _Peek(read_rows(prior, columns)) if prior is not None else None
        with _progress(job, runner) as bar:
            try:
                resumed, scored = _score_into(runner, job.source.items, buffered, prior_rows, summaries, bar,
                                              where=prior or out)
            finally:
                if buffered is not None:
                    buffered.flush()  # what was scored reaches the file, however the loop ended
        if scored == 0 and resumed == 0:
            raise CapscoreError(f"no captions in {job.source.spec}; nothing to score")
        if writer is not None:
            writer.close(complete=True)
        totals = {"resumed_rows": resumed, "scored_now": scored, **_totals(job, runner, t0)}
        result, runs = _record(config, summaries.values(), totals, job)
        write_json(spath, result)
        result["runs"] = runs  # for the caller's printout (the single-run file keeps its flat form)
        return result
    finally:
        if writer is not None:
            writer.close(complete=False)  # no-op after a successful close
            if prior is None and writer.rows_written == 0 and spath.exists():
                _drop_running_summary(spath)


def _writer_kind(out: Path) -> str:
    return "COCO results" if out.suffix.lower() == ".json" else "Parquet"


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    items = iter(items)
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


# ------------------------------------------------------------------------------------ a folder of shard files
class _Folder:
    """A :class:`ShardFolder` opened for one run: locked, checked against the run's settings, with the
    shards already done and those to do (see the module docstring)."""

    def __init__(self, job: ScoreJob, runner: _Runner, *, keep_journals: bool):
        output: ShardFolder = job.output
        self.out = Path(output.path).expanduser()
        self.created = not self.out.exists()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CapscoreError(f"{self.out}: cannot create the output folder ({e.strerror or e})") from None
        try:
            self.lock = OutputLock(self.out / "_run")  # DIR/_run.lock, held until the summary is written
        except CapscoreError as e:
            self._drop_created()
            if "another capscore process" not in str(e):
                raise
            raise CapscoreError(f"{self.out} is being written by another capscore process (it holds "
                                f"{self.out / '_run.lock'}); wait for it to finish, then resume if needed") from None
        try:
            self.out = self.out.resolve()
            self.files = ShardFiles(self.out, output.format)
            self.columns = runner.plan.columns
            self.settings = _json({**runner.config.settings(), "format": output.format})
            self.shards = list(job.source.shards)
            self.names = output_names(s.path for s in self.shards)
            existing = self.files.existing()
            if existing and not (output.resume or output.overwrite):
                raise OptionError(f"{braced(self.out)} already holds shard outputs; use {{resume}} to continue "
                                  "that run or {overwrite} to replace it")
            if not output.resume:  # --overwrite (or a new folder)
                self.files.clear()
                self.files.summary.unlink(missing_ok=True)
                existing = {}
            else:
                before = load_json(self.files.summary)
                _check_settings(before if isinstance(before, Mapping) else None, self.settings)
            current = set(self.names)
            for name in existing:
                meta = load_json(self.files.sidecar(name))
                if name in current and isinstance(meta, Mapping):
                    _check_settings(meta.get("config"), self.settings)
            self.orphans = [n for n in existing if n not in current]
            for name in self.orphans:  # shards no longer in the input: their rows leave the folder
                self.files.remove(name)
            self.finished: dict[str, dict] = {}
            for name, shard in zip(self.names, self.shards):
                meta = load_json(self.files.sidecar(name)) if name in existing else None
                if (isinstance(meta, dict) and meta.get("config") == self.settings
                        and meta.get("input") == shard.fingerprint() and self.files.complete(name, meta)):
                    self.finished[name] = meta
            self.todo = [(n, s) for n, s in zip(self.names, self.shards) if n not in self.finished]
            for name, _ in self.todo:  # a stale or partial output never stays beside the new one
                self.files.path(name).unlink(missing_ok=True)
                self.files.sidecar(name).unlink(missing_ok=True)
            self.files.clear_leftovers(keep_journals=keep_journals)
        except BaseException:
            self.release()
            raise

    def meta(self, name: str, fingerprint: dict, summaries: Mapping[tuple, Summary], items: int) -> dict:
        """Shard ``name``'s sidecar: the run's settings, the input as it was before reading, its file and
        counts, and each (model, metric)'s summary state."""
        return {"config": self.settings, "input": fingerprint, "file": self.files.path(name).name, "items": items,
                "rows": items * len(summaries),
                "runs": [{"model": m, "metric": k, "state": s.state()} for (m, k), s in summaries.items()]}

    def _drop_created(self) -> None:
        if self.created:
            try:
                self.out.rmdir()  # a first run that failed before writing anything leaves no empty folder
            except OSError:
                pass

    def release(self) -> None:
        self.lock.release()
        self._drop_created()


def _run_folder(job: ScoreJob, runner: _Runner, executor: Executor) -> dict:
    folder = _Folder(job, runner, keep_journals=isinstance(executor, LocalExecutor))
    try:
        engine = getattr(executor, "name", "local")
        config = runner.config.as_dict()
        write_json(folder.files.summary, {"status": "running", "engine": engine, **config})
        t0 = time.perf_counter()
        metas = dict(folder.finished)
        with _progress(job, runner) as bar:
            if folder.todo:
                metas.update(executor.score_shards(runner, folder.todo, folder, bar))
        summaries = runner.summaries()
        for meta in (metas[n] for n in folder.names):
            for r in meta["runs"]:
                if (r["model"], r["metric"]) in summaries:
                    summaries[(r["model"], r["metric"])].merge(r["state"])
        totals = {"engine": engine, "format": folder.files.fmt, "shards": len(folder.shards),
                  "shards_resumed": len(folder.finished), "orphans_removed": len(folder.orphans),
                  "files": [folder.files.path(n).name for n in folder.names], **_totals(job, runner, t0)}
        result, runs = _record(config, summaries.values(), totals, job)
        write_json(folder.files.summary, result)
        result["runs"] = runs
        return result
    finally:
        folder.release()


class LocalExecutor:
    """This process: each shard to do, (model, metric) after (model, metric), through a JSONL journal in its
    parts folder (written as :class:`FileOutput` rows are: by count and by time), then committed. An
    interrupted shard's journal is resumed row by row when its input is unchanged."""

    name = "local"

    def encoders(self, job: ScoreJob) -> Mapping:
        return load_encoders(job)

    def score_shards(self, runner: _Runner, todo: list, folder: _Folder, bar) -> dict[str, dict]:
        metas = {}
        for name, shard in todo:
            fingerprint = shard.fingerprint()  # before reading: a change meanwhile redoes the shard next time
            parts = folder.files.parts(name)
            journal, stamp = parts / JOURNAL, parts / JOURNAL_INPUT
            if journal.exists() and load_json(stamp) != fingerprint:
                journal.unlink()
            parts.mkdir(parents=True, exist_ok=True)
            stamp.write_text(json.dumps(fingerprint) + "\n", encoding="utf-8")
            prior = journal.exists() and journal.stat().st_size > 0
            if prior:
                repair(journal, folder.columns)
            prior_rows = _Peek(read_rows(journal, folder.columns)) if prior else None
            writer = RowWriter(journal, "jsonl", existing=prior, columns=folder.columns)
            buffered = _Buffered(writer, max_rows=runner.job.chunk_size)
            summaries = runner.summaries()
            try:
                _score_into(runner, lambda s=shard: runner.job.source.read(s), buffered, prior_rows, summaries, bar,
                            where=journal)
                buffered.flush()
                writer.close(complete=True)  # kept even when empty: an empty shard commits an empty file
            finally:
                buffered.flush()  # the rows scored before an error or an interrupt reach the journal
                writer.close(complete=False)
            first = next(iter(summaries.values()))
            meta = folder.meta(name, fingerprint, summaries, first.count + first.skipped)
            metas[name] = folder.files.commit(name, meta, folder.columns, journal=journal)
        return metas


# ------------------------------------------------------------------------------------ resume
def _check_prior_tag(row: dict | None, tag: dict | None, prior: Path, n: int) -> None:
    """The next earlier row (row ``n`` of ``prior``) must belong to the (model, metric) about to run:
    never mix models or metrics, even when the summary file was lost."""
    if row is None or (tag is not None and all(row.get(k) == v for k, v in tag.items())):
        return
    got = f"model {row.get('model')!r}, metric {row.get('metric')!r}"
    want = "" if tag is None else f", and this run asks for model {tag['model']!r}, metric {tag['metric']!r}"
    raise OptionError(f"{{resume}}: row {n} of {braced(prior)} was scored with {braced(got + want)}; use the same "
                      "{model} and {metric}, or {overwrite} to start again")


def _skip_done(items: Iterator, rows: Iterable[dict], summary: Summary, prior: Path) -> tuple[Iterator, int]:
    """Match the rows already written, in order, against the inputs; returns (remaining items, count).

    Rows are written in input order, so the first N items are done exactly when
    the N rows carry their (system, id): nothing is scored twice or left out.
    """
    items = iter(items)
    n = 0
    for n, row in enumerate(rows, 1):
        item = next(items, None)
        if item is None:
            raise OptionError(f"{{resume}}: {braced(prior)} has more rows than the inputs have captions (row {n}); "
                              "the inputs changed — use {overwrite} to start again")
        if (str(row["system"]), str(row["id"])) != (item.system, item.id):
            raise OptionError(f"{{resume}}: row {n} of {braced(prior)} is {braced(row['system'])}/"
                              f"{braced(row['id'])} but input item {n} is {braced(item.system)}/{braced(item.id)}; "
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


TEXT_ONLY = "(text only)"  # what the printout and the report show in place of the model of a text-only metric
OWN_MODELS = "(own models)"  # ... and of a metric that brings its own models (Polos, DENEB, the judges)


def _no_model(metric: str) -> str:
    row = registry().get(metric)
    return OWN_MODELS if row is not None and row.own_models else TEXT_ONLY


def _number(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def format_summary(result: dict, output: FileOutput | ShardFolder, *, quiet: bool = False) -> str:
    """What ``capscore score`` prints after a run: a line per (model, metric) — the headline first when the
    metric defines one (:mod:`capscore.scores.aggregate`: corpus BLEU, METEOR's aggregate), then the mean of
    the per-caption scores, named for what they are —, a table per system, the files."""
    runs, lines, table = result["runs"], [], []
    several = len(runs) > 1
    headlines = any(r.get("aggregate") for r in runs)
    if result.get("metric_choice") and any(get_metric(r["metric"]).needs_refs for r in runs):
        lines.append(f"metric {runs[0]['metric']} ({result['metric_choice']}; --metric names another)")
    for r in runs:
        own = r.get("aggregate")
        if own is None:
            numbers = f"mean {_number(r['mean'])}"
        elif own["name"] == "mean":
            numbers = f"headline mean {own.get('per_caption') or 'score'} {_number(own['value'])}"
        else:
            numbers = (f"headline {own['name']} {_number(own['value'])}, mean "
                       f"{own.get('per_caption') or 'per-caption score'} {_number(r['mean'])}")
        who = _no_model(r["metric"]) if r["model"] is None else f"with {r['model']}"
        lines.append(f"{r['metric']} {who}: {r['count']} scored, {r['skipped']} skipped, {numbers}")
        cols = {"model": r["model"] or _no_model(r["metric"]), "metric": r["metric"]} if several else {}
        heads = own["systems"] if own else {}
        if len(r["systems"]) > 1 or any(r["systems"]):
            table += [{**cols, "system": name, **({"headline": heads.get(name)} if headlines else {}), "mean": m,
                       "count": r["system_counts"][name]} for name, m in r["systems"].items()]
        elif several:
            table.append({**cols, "system": "", **({"headline": own and own["value"]} if headlines else {}),
                          "mean": r["mean"], "count": r["count"]})
    if table:
        lines.append(format_table(table))
    if "videos_encoded" in result and not quiet:
        lines.append(f"videos: {result['videos_encoded']} decoded and encoded ({result['frames_encoded']} frames, "
                     f"{result['frames']}), {result['videos_cached']} from the cache")
    if isinstance(output, ShardFolder):
        out = Path(output.path)
        lines.append(f"{result['shards']} shards, {result['shards_resumed']} already done"
                     + (f", {result['orphans_removed']} outputs of shards no longer given removed"
                        if result["orphans_removed"] else "")
                     + f"; rows: {out}/<shard>-<hash>.{output.format}  summary: {output.summary}")
    else:
        lines.append(f"rows: {output.path}  summary: {summary_path(output.path)}")
    return "\n".join(lines)
