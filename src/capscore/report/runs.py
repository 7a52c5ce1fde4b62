"""The runs `capscore report` reads, recognised from the files present (see docs/report.md).

=====================================  ==========================================================
``OUT.summary.json`` (+ ``OUT``)       ``capscore score``: score rows and their summary
``SUITE.summary.json`` (+ row files)   ``capscore probe``: one entry per model; rows
                                       ``SUITE__MODEL.jsonl|parquet`` beside it
``correlate.json``                     ``capscore correlate --out``; ``correlate_items.jsonl``
                                       beside it (per-item metric and human scores) gives the scatter
``log.jsonl`` (+ ``card.json``)        ``capscore train``: loss and evaluations per step
``*.png`` with a capscore-explain      ``capscore explain`` heat maps
text chunk
=====================================  ==========================================================

Score rows are streamed (only per-system score lists and the three lowest/highest captions are
kept), so a report over millions of rows stays small.
"""
from __future__ import annotations

import heapq
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from capscore._optional import require
from capscore.errors import CapscoreError, InputError

EXPLAIN_PNG_KEY = "capscore-explain"  # the PNG text chunk commands/explain.py writes (its PNG_KEY)
SKIP_DIRS = {"checkpoints", "tensorboard", "__pycache__"}


# ====================================================================================== parsed runs
@dataclass
class ScoreRun:
    summary_path: Path
    summary: dict
    rows_path: Path | None
    scores: dict[str, list[float]] = field(default_factory=dict)  # system -> scores
    lowest: list[tuple] = field(default_factory=list)  # (score, system, id, caption)
    highest: list[tuple] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (id, error), first few
    n_errors: int = 0


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
def discover(paths: Sequence[str | Path]) -> Runs:
    """Find and read every capscore output under ``paths`` (folders, searched recursively, or files)."""
    runs = Runs([Path(p) for p in paths])
    seen: set[Path] = set()
    for given in runs.inputs:
        if not given.exists():
            raise InputError(str(given), "not found")
        files = [given] if given.is_file() else sorted(
            p for p in given.rglob("*") if p.is_file() and not SKIP_DIRS & set(p.relative_to(given).parts[:-1]))
        before = len(runs)
        for f in files:
            key = f.resolve()
            if key in seen:
                continue
            seen.add(key)
            _classify(f, runs, explicit=given.is_file())
        if len(runs) == before:
            raise InputError(str(given), "no capscore outputs found",
                             expected="OUT.summary.json (score), SUITE.summary.json (probe), correlate.json, "
                                      "log.jsonl (train) or an explain PNG")
    return runs


def _classify(f: Path, runs: Runs, *, explicit: bool) -> None:
    name = f.name
    if name.endswith(".summary.json"):
        data = _read_json(f)
        if isinstance(data, dict) and "metric" in data and "status" in data:
            runs.scores.append(_read_score_run(f, data))
        elif isinstance(data, list) and data and all(isinstance(e, dict) and "suite" in e for e in data):
            runs.probes += _read_probe_runs(f, data)
        elif explicit:
            raise InputError(str(f), "not a summary written by `capscore score` or `capscore probe`")
    elif name == "correlate.json":
        data = _read_json(f)
        if not (isinstance(data, dict) and isinstance(data.get("results"), list)):
            raise InputError(str(f), "not a `capscore correlate` output", expected='{"results": [...]}')
        items_path = f.with_name("correlate_items.jsonl")
        items = [row for _, row in _iter_jsonl(items_path)] if items_path.exists() else []
        runs.correlations.append(CorrelateRun(f, [r for r in data["results"] if isinstance(r, dict)],
                                              items_path if items else None, items))
    elif name == "log.jsonl":
        runs.trainings.append(_read_train_log(f))
    elif f.suffix.lower() == ".png":
        img = _read_explain_png(f, explicit=explicit)
        if img is not None:
            runs.explains.append(img)
    elif explicit:
        raise InputError(str(f), "not a file `capscore report` reads",
                         expected="a run folder, OUT.summary.json, SUITE.summary.json, correlate.json, log.jsonl "
                                  "or an explain PNG")


def _read_json(f: Path):
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{f}:{e.lineno}", f"malformed JSON ({e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(f), f"cannot read file ({e})") from None


def _iter_jsonl(f: Path):
    from capscore.data.jsonl import iter_jsonl

    return iter_jsonl(f)


def finite(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _read_score_run(f: Path, summary: dict) -> ScoreRun:
    from capscore.report.writers import journal_path, read_rows

    rows_path = f.with_name(f.name[: -len(".summary.json")])
    if not rows_path.exists() and journal_path(rows_path).exists():
        rows_path = journal_path(rows_path)  # an unfinished Parquet run
    run = ScoreRun(f, summary, rows_path if rows_path.exists() else None)
    if run.rows_path is None:
        return run
    low: list[tuple] = []  # max-heap of the 3 lowest (negated), min-heap of the 3 highest
    high: list[tuple] = []
    try:
        for n, row in enumerate(read_rows(run.rows_path)):
            score = finite(row.get("score"))
            if score is None:
                run.n_errors += 1
                if len(run.errors) < 5:
                    run.errors.append((str(row.get("id")), str(row.get("error") or "no score")))
                continue
            system = str(row.get("system") or "")
            run.scores.setdefault(system, []).append(score)
            item = (str(row.get("system") or ""), str(row.get("id")), str(row.get("caption")))
            heapq.heappush(low, (-score, n, item))
            heapq.heappush(high, (score, n, item))
            if len(low) > 3:
                heapq.heappop(low)
            if len(high) > 3:
                heapq.heappop(high)
    except (ValueError, KeyError, OSError) as e:  # a row file that is not ours, or cut mid-line by a live run
        if isinstance(e, CapscoreError):
            raise
        raise InputError(str(run.rows_path), f"cannot read score rows ({e})") from None
    run.lowest = [(-s, *item) for s, _, item in sorted(low, reverse=True)]
    run.highest = [(s, *item) for s, _, item in sorted(high, reverse=True)]
    return run


_LIST_FIELDS = ("prefix_scores", "wrong_scores", "units", "wrong", "paraphrases", "flips", "captions", "scores")


def _read_probe_rows(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        pq = require("pyarrow.parquet", purpose="reading Parquet")
        rows = pq.read_table(str(path)).to_pylist()
        for r in rows:  # probe writes lists/dicts as JSON strings in Parquet
            for k in _LIST_FIELDS:
                if isinstance(r.get(k), str) and r[k][:1] in "[{":
                    r[k] = json.loads(r[k])
        return rows
    return [row for _, row in _iter_jsonl(path)]


def _safe(name: str) -> str:  # the file-name rule of commands/probe.py
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def _read_probe_runs(f: Path, entries: list[dict]) -> list[ProbeRun]:
    out = []
    for e in entries:
        rows_path = None
        for ext in ("jsonl", "parquet"):
            p = f.with_name(f"{_safe(str(e.get('suite', '')))}__{_safe(str(e.get('model', '')))}.{ext}")
            if p.exists():
                rows_path = p
                break
        rows = _read_probe_rows(rows_path) if rows_path else []
        out.append(ProbeRun(f, e, rows_path, rows))
    return out


def _read_train_log(f: Path) -> TrainRun:
    steps, evals = [], []
    for where, row in _iter_jsonl(f):
        if "step" not in row:
            raise InputError(where, "not a `capscore train` log line", expected='{"step": N, ...}', got=row)
        if isinstance(row.get("eval"), dict):
            evals.append({"step": row["step"], **row["eval"]})
        else:
            steps.append(row)
    card_path = f.with_name("card.json")
    card = _read_json(card_path) if card_path.exists() else {}
    return TrainRun(f, card if isinstance(card, dict) else {}, steps, evals)


def _read_explain_png(f: Path, *, explicit: bool) -> ExplainImage | None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(f) as im:
            im.load()  # decodes the whole file: a truncated or corrupt PNG fails here
            info = dict(getattr(im, "text", {}) or {})
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        if explicit:
            raise InputError(str(f), f"not a readable PNG ({e})") from None
        return None
    if EXPLAIN_PNG_KEY not in info and not explicit:
        return None  # some other picture in the folder
    try:
        about = json.loads(info.get(EXPLAIN_PNG_KEY, "{}"))
    except json.JSONDecodeError:
        about = {}
    return ExplainImage(f, about if isinstance(about, dict) else {}, f.read_bytes())
