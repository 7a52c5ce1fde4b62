"""The runs `capscore report` reads, recognised from the files present (see docs/report.md).

=======================================  ========================================================
``OUT.summary.json`` (+ ``OUT``)         ``capscore score``: a summary and its rows beside it: a file
                                         (.jsonl/.csv/.parquet/.json, or a Parquet/COCO journal) or a
                                         folder of shard files
``DIR/_summary.json`` (+ ``DIR/*.ext``)  ``capscore score --engine ray`` (or any sharded ``--out DIR/``):
                                         every row file in DIR is one run
a row file alone                         score rows without a summary (recognised by their columns)
``SUITE.summary.json`` (+ row files)     ``capscore probe``: one entry per model; rows
                                         ``SUITE__MODEL.jsonl|parquet`` beside it
``correlate.json``                       ``capscore correlate --out``; ``correlate_items.jsonl``
                                         beside it (per-item metric and human scores) gives the scatter
``log.jsonl`` (+ ``card.json``)          ``capscore train``: loss and evaluations per step
``*.png`` with a capscore-explain        ``capscore explain`` heat maps
text chunk
=======================================  ========================================================

A score row belongs to the distribution of its (model, metric, system): ``model`` and ``metric`` are
taken from the row when it carries them, else from the summary beside the rows when that names a
single one (video rows and the rows of older Ray runs do not carry them); one left unknown is shown
as "not recorded", never guessed. Rows are streamed: only per-distribution score arrays (8 bytes a
row), the means of the score's parts and the three lowest/highest captions are kept. Reading is
bounded and type-strict (:mod:`capscore.report.rows`).
"""
from __future__ import annotations

import heapq
import json
import math
import os
import re
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from capscore._optional import require
from capscore.errors import InputError
from capscore.report.rows import (
    DEFAULT_LIMITS,
    NUMERIC_COLUMNS,
    Limits,
    check_regular,
    is_row_columns,
    iter_jsonl_objects,
    iter_score_rows,
    read_json,
    row_file_columns,
)
from capscore.report.writers import journal_path

EXPLAIN_PNG_KEY = "capscore-explain"  # the PNG text chunk report/explain.py writes
SKIP_DIRS = {"checkpoints", "tensorboard", "__pycache__", "_shards"}
PARTS = tuple(c for c in NUMERIC_COLUMNS if c != "score")  # a score's parts, shown as per-system means
NOT_RECORDED = {"model": "model not recorded", "metric": "metric not recorded"}


def _run_entry(summary: dict, model: str | None, metric: str | None) -> dict | None:
    """The entry a score summary records for (model, metric) (its ``runs`` item, or the summary of one run)."""
    runs = summary.get("runs") if isinstance(summary.get("runs"), list) else [summary]
    return next((r for r in runs if isinstance(r, dict) and "model" in r and r.get("model") == model
                 and r.get("metric") == metric), None)


def headline(summary: dict, model: str | None, metric: str | None) -> dict | None:
    """The headline a score summary records for (model, metric) — ``{"name", "value", "systems", ...}``, the
    metric's own aggregate (corpus BLEU, METEOR's aggregate, a mean) — or None when it records none."""
    own = (_run_entry(summary, model, metric) or {}).get("aggregate")
    return own if isinstance(own, dict) and isinstance(own.get("systems"), dict) else None


def finite(x) -> float | None:
    """A real number (int or float, not a boolean or a string) that is finite, else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    v = float(x)
    return v if math.isfinite(v) else None


# ====================================================================================== parsed runs
@dataclass
class Dist:
    """The scores of one (model, metric, system) and the running sums of the score's parts."""

    scores: array = field(default_factory=lambda: array("d"))
    parts: dict = field(default_factory=dict)  # column -> [sum, count]


@dataclass
class ScoreBlock:
    """One (model, metric) of a score run: a distribution per system, its extremes, its unscored rows."""

    model: str | None
    metric: str | None
    systems: dict[str, Dist] = field(default_factory=dict)
    lowest: list[tuple] = field(default_factory=list)  # (score, system, id, caption), lowest first
    highest: list[tuple] = field(default_factory=list)  # highest first
    n_unscored: int = 0
    _low: list = field(default_factory=list, repr=False)
    _high: list = field(default_factory=list, repr=False)

    text_only: bool = False  # a text-only metric (BLEU, ...): its summary records no model, by design
    own_models: bool = False  # ... or one that brings its own models (Polos, DENEB, the judges)

    @property
    def title(self) -> str:
        if self.text_only:
            return f"{self.metric} ({'own models' if self.own_models else 'text only'})"
        return f"{self.metric or NOT_RECORDED['metric']} with {self.model or NOT_RECORDED['model']}"

    @property
    def n_scored(self) -> int:
        return sum(len(d.scores) for d in self.systems.values())

    @property
    def parts(self) -> list[str]:
        return [c for c in PARTS if any(c in d.parts for d in self.systems.values())]


@dataclass
class ScoreRun:
    summary_path: Path | None
    summary: dict
    rows_paths: list[Path]
    kind: str = "images"  # or "videos" (rows with a ``video`` column)
    blocks: dict[tuple, ScoreBlock] = field(default_factory=dict)  # (model, metric) -> block
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # (file:row, id, error), first few
    n_errors: int = 0
    n_rows: int = 0

    @property
    def name(self) -> str:
        if len(self.rows_paths) == 1:
            return self.rows_paths[0].name
        if self.rows_paths:
            return f"{self.rows_paths[0].parent.name}/ ({len(self.rows_paths)} row files)"
        return self.summary_path.name if self.summary_path else "?"

    @property
    def scores(self) -> dict[str, list[float]]:
        """system -> scores over every (model, metric) (kept for callers of the one-block layout)."""
        out: dict[str, list[float]] = {}
        for b in self.blocks.values():
            for s, d in b.systems.items():
                out.setdefault(s, []).extend(d.scores)
        return out


@dataclass
class ProbeRun:
    summary_path: Path
    entry: dict  # one element of SUITE.summary.json (one model)
    rows_path: Path | None
    rows: list[dict]

    @property
    def suite(self) -> str:
        return str(self.entry.get("suite", ""))

    @property
    def model(self) -> str:
        return str(self.entry.get("model", ""))

    @property
    def summary(self) -> list[dict]:
        return [s for s in self.entry.get("summary") or [] if isinstance(s, dict)]


@dataclass
class CorrelateRun:
    path: Path
    results: list[dict]
    items_path: Path | None
    items: list[dict]
    significance: dict | None = None  # correlate.json's "significance": p-value matrices and the best cluster


@dataclass
class TrainRun:
    log_path: Path
    card: dict
    steps: list[dict]  # training entries (step, lr, loss, ...)
    evals: list[dict]  # {"step": n, metric: value, ...}


@dataclass
class ExplainImage:
    path: Path
    about: dict
    png: bytes


@dataclass
class Runs:
    inputs: list[Path]
    scores: list[ScoreRun] = field(default_factory=list)
    probes: list[ProbeRun] = field(default_factory=list)
    correlations: list[CorrelateRun] = field(default_factory=list)
    trainings: list[TrainRun] = field(default_factory=list)
    explains: list[ExplainImage] = field(default_factory=list)

    def __len__(self) -> int:
        return (len(self.scores) + len(self.probes) + len(self.correlations) + len(self.trainings)
                + len(self.explains))


# ====================================================================================== discovery
class _Reader:
    """One discovery: the limits, the files already read (so nothing is read twice) and the row budget."""

    def __init__(self, runs: Runs, limits: Limits):
        self.runs, self.limits = runs, limits
        self.seen: set[Path] = set()
        self.rows_left = limits.max_rows
        self.dists_left = limits.max_distributions

    def one_more(self, where: str) -> None:
        """Count a new (model, metric) or (model, metric, system); refuse past ``max_distributions``."""
        self.dists_left -= 1
        if self.dists_left < 0:
            raise InputError(where, f"more than {self.limits.max_distributions:,} distinct (model, metric, system) "
                                    "in this report; not a score run capscore report can draw")

    def cut(self, text: object) -> str:
        """User text kept for the page (a caption, an error), at most ``max_text_chars`` long."""
        text = str(text)
        n = self.limits.max_text_chars
        return text if len(text) <= n else text[: n - 1] + "…"

    def claim(self, f: Path) -> bool:
        """True the first time a file is met."""
        key = f.resolve()
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def discover(paths: Sequence[str | Path], *, limits: Limits = DEFAULT_LIMITS) -> Runs:
    """Find and read every capscore output under ``paths`` (folders, searched recursively, or files)."""
    runs = Runs([Path(p) for p in paths])
    reader = _Reader(runs, limits)
    for given in runs.inputs:
        if not os.path.lexists(given):
            raise InputError(str(given), "not found")
        before = len(runs)
        if given.is_dir():
            files = sorted(p for p in given.rglob("*") if _listed(p, given))
            for f in files:  # summaries and named outputs first: they claim their row files
                if _primary(f) and reader.claim(f):
                    _classify(f, reader, explicit=False)
            for f in files:  # then row files no summary claimed
                if f.name.lower().endswith(".png") or not reader.claim(f):
                    continue
                cols = row_file_columns(f, limits)
                if cols is not None and is_row_columns(cols) and not _final_exists(f):
                    runs.scores.append(_read_score_run(reader, None, {}, [f]))
        else:
            check_regular(given)  # a FIFO or a device given by name: refused, never opened
            if reader.claim(given):
                _classify_explicit(given, reader)
        if len(runs) == before:
            raise InputError(str(given), "no capscore outputs found",
                             expected="OUT.summary.json or a rows file (score), SUITE.summary.json (probe), "
                                      "correlate.json, log.jsonl (train) or an explain PNG")
    return runs


def _listed(p: Path, root: Path) -> bool:
    """A regular file under ``root``, not in a skipped or hidden folder, not a temporary, lock or hidden file."""
    rel = p.relative_to(root).parts
    if (SKIP_DIRS & set(rel[:-1]) or any(part.startswith(".") for part in rel)
            or p.name.endswith((".tmp", ".lock"))):
        return False
    try:
        return p.is_file()  # follows symlinks: a FIFO, a device (/dev/zero) or a socket is left out
    except OSError:
        return False


def _primary(f: Path) -> bool:
    name = f.name
    return (name.endswith(".summary.json") or name in ("_summary.json", "correlate.json", "log.jsonl")
            or name.lower().endswith(".png"))


def _final_exists(f: Path) -> bool:
    """A journal ``OUT.partial.jsonl`` whose finished ``OUT`` is there too (the journal is stale)."""
    return f.name.endswith(".partial.jsonl") and f.with_name(f.name[: -len(".partial.jsonl")]).is_file()


def _classify(f: Path, reader: _Reader, *, explicit: bool) -> None:
    runs = reader.runs
    name = f.name
    if name.endswith(".summary.json") or name == "_summary.json":
        data = read_json(f, reader.limits)
        if isinstance(data, dict) and "metric" in data and "status" in data:
            runs.scores.append(_read_score_run(reader, f, data, _summary_rows(f, reader)))
        elif isinstance(data, list) and data and all(isinstance(e, dict) and "suite" in e for e in data):
            runs.probes += _read_probe_runs(f, data, reader)
        elif explicit:
            raise InputError(str(f), "not a summary written by `capscore score` or `capscore probe`")
    elif name == "correlate.json":
        runs.correlations.append(_read_correlate(f, reader))
    elif name == "log.jsonl":
        runs.trainings.append(_read_train_log(f, reader))
    elif f.suffix.lower() == ".png":
        img = _read_explain_png(f, reader.limits, explicit=explicit)
        if img is not None:
            runs.explains.append(img)
    elif explicit:
        raise InputError(str(f), "not a file `capscore report` reads",
                         expected="a run folder, OUT.summary.json, a score rows file, SUITE.summary.json, "
                                  "correlate.json, log.jsonl or an explain PNG")


def _classify_explicit(f: Path, reader: _Reader) -> None:
    """A file named on the command line: itself, or the output it belongs to (its summary, its folder)."""
    name = f.name
    if _primary(f):
        return _classify(f, reader, explicit=True)
    companion = {"correlate_items.jsonl": "correlate.json", "correlate.csv": "correlate.json",
                 "card.json": "log.jsonl", "MODEL_CARD.md": "log.jsonl"}.get(name)
    if companion is not None:
        main = f.with_name(companion)
        if not main.is_file():
            raise InputError(str(f), f"no {companion} beside it; give the run folder or {companion}")
        if reader.claim(main):
            _classify(main, reader, explicit=True)
        return
    for summary in (f.with_name(name + ".summary.json"), f.parent / "_summary.json",
                    f.with_name(name[: -len(".partial.jsonl")] + ".summary.json") if name.endswith(".partial.jsonl")
                    else None):
        if summary is not None and summary.is_file():  # a score rows file with its summary beside it
            data = read_json(summary, reader.limits)
            mine = isinstance(data, dict) and "metric" in data and "status" in data and any(
                p.resolve() == f.resolve() for p in _summary_rows(summary, reader))
            if mine:
                if reader.claim(summary):
                    reader.runs.scores.append(_read_score_run(reader, summary, data, [f]))
                return
    if "__" in f.stem:  # SUITE__MODEL.jsonl of a probe
        summary = f.with_name(f.stem.split("__", 1)[0] + ".summary.json")
        if summary.is_file():
            data = read_json(summary, reader.limits)
            if isinstance(data, list) and all(isinstance(e, dict) and "suite" in e for e in data):
                mine = [p for p in _read_probe_runs(summary, data, reader, only=f) if p.rows_path == f]
                if mine:
                    reader.runs.probes += mine
                    return
    cols = row_file_columns(f, reader.limits)
    if cols is not None and is_row_columns(cols):
        reader.runs.scores.append(_read_score_run(reader, None, {}, [f]))
        return
    _classify(f, reader, explicit=True)


def _row_files_in(folder: Path) -> list[Path]:
    out = []
    for p in sorted(folder.iterdir()):
        if not _listed(p, folder) or p.name.endswith((".summary.json", "_summary.json")) or _final_exists(p):
            continue
        cols = row_file_columns(p)
        if cols is not None and is_row_columns(cols):
            out.append(p)
    return out


def _summary_rows(f: Path, reader: _Reader) -> list[Path]:
    """The row files a score summary describes (claimed, so a folder scan does not read them again)."""
    if f.name == "_summary.json":
        found = _row_files_in(f.parent)
    else:
        base = f.with_name(f.name[: -len(".summary.json")])
        if base.is_dir():  # score writes its rows to the file the summary is named after; shards: DIR/_summary.json
            raise InputError(str(base), f"is a folder, but {f.name} is the summary of a rows file of that name; "
                                        "give the rows file (or a sharded run's folder, which holds _summary.json)")
        if base.is_file():
            found = [base]
        elif journal_path(base).is_file():
            found = [journal_path(base)]  # an unfinished Parquet / COCO run
        elif os.path.lexists(base):
            check_regular(base)  # a FIFO or a device named like the rows: one line, never opened
            found = []
        else:
            found = []
    for p in found:
        reader.claim(p)
    return found


def _single(summary: dict, key: str) -> str | None:
    """The summary's model/metric when it names exactly one (a string, or the same in every ``runs`` entry)."""
    v = summary.get(key)
    if isinstance(v, str):
        return v
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return v[0]
    rs = summary.get("runs")
    if isinstance(rs, list):
        vals = {r.get(key) for r in rs if isinstance(r, dict)}
        if len(vals) == 1 and isinstance(next(iter(vals)), str):
            return next(iter(vals))
    return None


def _read_score_run(reader: _Reader, summary_path: Path | None, summary: dict, paths: list[Path]) -> ScoreRun:
    run = ScoreRun(summary_path, summary, paths)
    default = {k: _single(summary, k) for k in ("model", "metric")}
    for path in paths:
        for where, row in iter_score_rows(path, reader.limits):
            _add_row(run, row, where, default, reader)
    for b in run.blocks.values():
        entry = _run_entry(summary, None, b.metric) if b.model is None else None
        b.text_only = entry is not None
        b.own_models = bool(entry and entry.get("own_models"))
        b.lowest = [(-s, *item) for s, _, item in sorted(b._low, reverse=True)]
        b.highest = [(s, *item) for s, _, item in sorted(b._high, reverse=True)]
        b._low = b._high = []
    return run


def _add_row(run: ScoreRun, row: dict, where: str, default: dict, reader: _Reader) -> None:
    run.n_rows += 1
    if "video" in row:
        run.kind = "videos"
    key = (row.get("model") or default["model"], row.get("metric") or default["metric"])
    block = run.blocks.get(key)
    if block is None:
        reader.one_more(where)
        block = run.blocks[key] = ScoreBlock(*key)
    score = row.get("score")
    if score is None:
        block.n_unscored += 1
        run.n_errors += 1
        if len(run.errors) < 5:
            run.errors.append((where, reader.cut(row.get("id")), reader.cut(row.get("error") or "no score")))
        return
    reader.rows_left -= 1
    if reader.rows_left < 0:
        raise InputError(where, f"more than {reader.limits.max_rows:,} score rows in this report; "
                                "report fewer runs at a time or raise the max_rows limit (--max-rows)")
    system = row.get("system") or ""
    dist = block.systems.get(system)
    if dist is None:
        reader.one_more(where)
        dist = block.systems[system] = Dist()
    dist.scores.append(score)
    for c in PARTS:
        v = row.get(c)
        if v is not None:
            acc = dist.parts.setdefault(c, [0.0, 0])
            acc[0] += v
            acc[1] += 1
    item = (system, reader.cut(row.get("id")), reader.cut(row.get("caption")))
    n = run.n_rows
    heapq.heappush(block._low, (-score, n, item))  # max-heap of the 3 lowest (negated), min-heap of the 3 highest
    heapq.heappush(block._high, (score, n, item))
    if len(block._low) > 3:
        heapq.heappop(block._low)
    if len(block._high) > 3:
        heapq.heappop(block._high)


# ====================================================================================== probe
_LIST_FIELDS = ("prefix_scores", "wrong_scores", "units", "wrong", "paraphrases", "flips", "captions", "scores")


def _read_probe_rows(path: Path, reader: _Reader) -> list[dict]:
    if path.suffix == ".parquet":
        pq = require("pyarrow.parquet", purpose="reading Parquet")

        check_regular(path)
        try:
            f = pq.ParquetFile(path)
            if f.metadata.num_rows > reader.limits.max_rows:
                raise InputError(str(path), f"{f.metadata.num_rows:,} rows, over the {reader.limits.max_rows:,} "
                                            "row limit")
            rows = f.read().to_pylist()
        except InputError:
            raise
        except Exception as e:
            if isinstance(e, (OSError, ValueError)) or type(e).__module__.startswith("pyarrow"):
                raise InputError(str(path), f"unreadable Parquet ({' '.join(str(e).split())[:200]})") from None
            raise
        for n, r in enumerate(rows, 1):  # probe writes lists/dicts as JSON strings in Parquet
            for k in _LIST_FIELDS:
                if isinstance(r.get(k), str) and r[k][:1] in "[{":
                    try:
                        r[k] = json.loads(r[k])
                    except ValueError:
                        raise InputError(f"{path}:row {n}", f"{k} is not valid JSON") from None
        return rows
    rows = []
    for _, row in iter_jsonl_objects(path, reader.limits):
        rows.append(row)
        if len(rows) > reader.limits.max_rows:
            raise InputError(str(path), f"over the {reader.limits.max_rows:,} row limit")
    return rows


def _safe(name: str) -> str:  # the file-name rule of probes/job.py
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def _read_probe_runs(f: Path, entries: list[dict], reader: _Reader, *, only: Path | None = None) -> list[ProbeRun]:
    out = []
    for e in entries:
        rows_path = None
        for ext in ("jsonl", "parquet"):
            p = f.with_name(f"{_safe(str(e.get('suite', '')))}__{_safe(str(e.get('model', '')))}.{ext}")
            if p.is_file():
                rows_path = p
                break
        if only is not None and rows_path != only:
            continue
        if rows_path is not None:
            reader.claim(rows_path)
        rows = _read_probe_rows(rows_path, reader) if rows_path else []
        out.append(ProbeRun(f, e, rows_path, rows))
    return out


# ====================================================================================== correlate
def _need(value, kinds, where: str, what: str):
    """``value`` if it is None or of ``kinds`` (booleans are never numbers), else an InputError."""
    if value is None:
        return None
    numeric = kinds in (int, (int, float))
    if (numeric and isinstance(value, bool)) or not isinstance(value, kinds):
        raise InputError(where, f"{what}, not a {type(value).__name__}", got=value)
    return value


def _read_correlate(f: Path, reader: _Reader) -> CorrelateRun:
    """``correlate.json`` checked field by field: a statistic that is not a number is an input error."""
    data = read_json(f, reader.limits)
    if not (isinstance(data, dict) and isinstance(data.get("results"), list)):
        raise InputError(str(f), "not a `capscore correlate` output", expected='{"results": [...]}')
    results = []
    for i, r in enumerate(data["results"]):
        at = f"{f}: results[{i}]"
        if not isinstance(r, dict):
            raise InputError(at, "is not an object", got=r)
        for k in ("dataset", "metric", "backbone", "source", "identity", "prefix"):
            _need(r.get(k), str, f"{at}.{k}", "must be text")
        for k in ("n", "seed", "n_resamples"):
            _need(r.get(k), int, f"{at}.{k}", "must be a whole number")
        stats = _need(r.get("stats"), list, f"{at}.stats", "must be a list") or []
        for j, s in enumerate(stats):
            if not isinstance(s, dict):
                raise InputError(f"{at}.stats[{j}]", "is not an object", got=s)
            _need(s.get("name"), str, f"{at}.stats[{j}].name", "must be text")
            for k in ("value", "ci_low", "ci_high", "p_value"):
                _need(s.get(k), (int, float), f"{at}.stats[{j}].{k}", "must be a number")
        skipped = _need(r.get("skipped"), dict, f"{at}.skipped", "must be an object") or {}
        for k, v in skipped.items():
            _need(v, int, f"{at}.skipped.{k}", "must be a whole number")
        results.append(r)
    items_path = f.with_name("correlate_items.jsonl")
    items = []
    if items_path.is_file() or os.path.lexists(items_path):
        for where, it in iter_jsonl_objects(items_path, reader.limits):
            for k in ("score", "human"):
                _need(it.get(k), (int, float), f"{where}: {k}", "must be a number")
            for k in ("metric", "backbone"):
                _need(it.get(k), str, f"{where}: {k}", "must be text")
            items.append(it)
            if len(items) > reader.limits.max_rows:
                raise InputError(str(items_path), f"over the {reader.limits.max_rows:,} row limit")
        reader.claim(items_path)
    return CorrelateRun(f, results, items_path if items else None, items, _significance(data.get("significance"), f))


def _significance(sig, f: Path) -> dict | None:
    """correlate.json's significance block, checked: names, one p-value per pair (or null), the cluster."""
    if sig is None:
        return None
    at = f"{f}: significance"
    if not isinstance(sig, dict):
        raise InputError(at, "is not an object", got=sig)
    names = _need(sig.get("names"), list, f"{at}.names", "must be a list") or []
    for k in ("names", "cluster"):
        for i, v in enumerate(sig.get(k) or []):
            _need(v, str, f"{at}.{k}[{i}]", "must be text")
    for k in ("williams_p", "tau_p"):
        m = _need(sig.get(k), list, f"{at}.{k}", "must be a list") or []
        if len(m) != len(names) or any(not isinstance(row, list) or len(row) != len(names) for row in m):
            raise InputError(f"{at}.{k}", f"must be a {len(names)} × {len(names)} matrix")
        for i, row in enumerate(m):
            for j, v in enumerate(row):
                _need(v, (int, float), f"{at}.{k}[{i}][{j}]", "must be a number or null")
    for k in ("alpha",):
        _need(sig.get(k), (int, float), f"{at}.{k}", "must be a number")
    return sig


# ====================================================================================== train
def _read_train_log(f: Path, reader: _Reader) -> TrainRun:
    steps, evals = [], []
    for where, row in iter_jsonl_objects(f, reader.limits):
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise InputError(where, "not a `capscore train` log line", expected='{"step": N, ...} with a whole N',
                             got=row)
        for k, v in list(row.items()) + list((row.get("eval") or {}).items() if isinstance(row.get("eval"), dict)
                                             else []):
            if isinstance(v, bool):
                raise InputError(where, f"{k} is a boolean, not a number", got=v)
        if isinstance(row.get("eval"), dict):
            evals.append({"step": step, **row["eval"]})
        else:
            steps.append(row)
        if len(steps) + len(evals) > reader.limits.max_rows:
            raise InputError(str(f), f"over the {reader.limits.max_rows:,} line limit")
    card_path = f.with_name("card.json")
    card = read_json(card_path, reader.limits) if card_path.is_file() else {}
    reader.claim(card_path)
    return TrainRun(f, card if isinstance(card, dict) else {}, steps, evals)


# ====================================================================================== explain
def png_text_keys(path: Path, *, max_bytes: int = 1 << 24) -> set[str] | None:
    """The keywords of a PNG's text chunks before its image data, read chunk by chunk (nothing decoded).

    None when the file is not a PNG. Reads at most ``max_bytes`` of text chunks.
    """
    keys: set[str] = set()
    read = 0
    with open(path, "rb") as fb:
        if fb.read(8) != b"\x89PNG\r\n\x1a\n":
            return None
        while True:
            head = fb.read(8)
            if len(head) < 8:
                return keys
            length, kind = struct.unpack(">I4s", head)
            if kind in (b"tEXt", b"zTXt", b"iTXt"):
                read += length
                if read > max_bytes:
                    return keys
                keys.add(fb.read(min(length, 80)).split(b"\0", 1)[0].decode("latin-1"))
                fb.seek(length - min(length, 80) + 4, 1)
            elif kind in (b"IDAT", b"IEND"):
                return keys
            else:
                fb.seek(length + 4, 1)


def _read_explain_png(f: Path, limits: Limits, *, explicit: bool) -> ExplainImage | None:
    check_regular(f, max_bytes=limits.max_png_bytes if explicit else None)
    if not explicit:
        try:
            keys = png_text_keys(f)
        except OSError:
            return None
        if not keys or EXPLAIN_PNG_KEY not in keys:
            return None  # some other picture in the folder: not decoded at all
        check_regular(f, max_bytes=limits.max_png_bytes)
    try:
        with Image.open(f) as im:
            w, h = im.size
            if w * h > limits.max_png_pixels:
                raise InputError(str(f), f"a {w}×{h} image, over the {limits.max_png_pixels:,}-pixel limit for "
                                         "explain heat maps")
            im.load()  # decodes the whole file: a truncated or corrupt PNG fails here
            info = dict(getattr(im, "text", {}) or {})
    except InputError:
        raise
    except Image.DecompressionBombError as e:
        raise InputError(str(f), f"refused as a decompression bomb ({e})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        if explicit:
            raise InputError(str(f), f"not a readable PNG ({e})") from None
        return None
    if EXPLAIN_PNG_KEY not in info and not explicit:
        return None
    try:
        about = json.loads(info.get(EXPLAIN_PNG_KEY, "{}"))
    except (ValueError, RecursionError):
        about = {}
    return ExplainImage(f, about if isinstance(about, dict) else {}, f.read_bytes())
