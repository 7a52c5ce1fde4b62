"""Is system A's mean score different from system B's, beyond noise?

Two ``capscore score`` outputs (JSONL/CSV/JSON/Parquet rows with ``id``, ``image`` and ``score``) of two
captioning systems, scored by the same metric, are matched item by item (``match="id"``: the same ``id``
in both files; ``match="image"``: the same ``image``, one caption per image in each file), and compared
with a paired bootstrap and a paired approximate randomisation test over images — all captions of one
image move together (:mod:`capscore.meta.significance`). Rows without a score (error rows) and items
present in only one file are counted and left out. Rows that say which model and metric made them must
agree: a CLIP-S file is not compared with a BLEU-4 file, nor one file's rows of two runs mixed.

The statistic tested is the metric's **headline** (:mod:`capscore.scores.aggregate`): the mean score, or,
for a metric whose registry row defines a corpus score computed from per-item vectors (the classic
metrics: corpus BLEU-n from the rows' ``stats`` n-gram counts, METEOR's aggregate from the jar's
statistics), that corpus score, recomputed on every resample
(:func:`capscore.meta.significance.compare_summed`), as significance tests for BLEU do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
import json
from itertools import combinations

from capscore.errors import CapscoreError, InputError, OptionError, braced
from capscore.pipeline import TEXT_ONLY, columns_for, summary_path, write_json
from capscore.report import writers
from capscore.report.tables import format_number, format_p, format_table
from capscore.scores.aggregate import Summed, aggregate_for
from capscore.scores.classic import CLASSIC_METRICS
from capscore.scores.metric import get_metric, registry

if TYPE_CHECKING:  # scipy (slow to import) only when two systems are compared
    from capscore.meta.significance import SystemTest


def _rows(path: Path):
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(str(path)).to_pylist()
        except Exception as e:  # pyarrow raises several types for a non-parquet file
            raise InputError(str(path), f"cannot read parquet ({e})") from None
        return ((f"{path}: row {i}", r) for i, r in enumerate(rows))
    from capscore.meta.datasets import read_rows  # noqa: PLC0415  (deferred: numpy)

    return read_rows(path)


def read_system(path, *, match: str = "id", score_column: str = "score"
                ) -> tuple[dict[str, tuple[float, str, tuple[dict, str]]], int, tuple[str, str] | None]:
    """One system's scores -> ({key: (score, image, (row, where))}, rows without a score, (model, metric) of
    its rows or None when the rows do not say). ``key`` is the id or the image; the row is kept for a corpus
    headline's per-item vector (:func:`headline_of`). A file whose rows come from several (model, metric) runs
    is refused: one comparison is of one metric on one model."""
    from capscore.meta.datasets import _number  # noqa: PLC0415  (deferred: numpy)

    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(str(path), "scores file not found")
    if path.is_dir():
        raise InputError(str(path), "is a folder; expected a scores file (JSONL/CSV/JSON/Parquet)")
    out: dict[str, tuple[float, str, tuple[dict, str]]] = {}
    empty = 0
    made_by: tuple[str, str] | None = None
    first = ""
    system: tuple[str, str] | None = None  # (name, where first seen)
    for where, row in _rows(path):
        need = ["image", score_column] + (["id"] if match == "id" else [])
        missing = [c for c in need if c not in row]
        if missing:
            raise InputError(where, f"missing column {missing[0]!r}",
                             expected=f"{', '.join(repr(c) for c in need)} (a capscore score output)")
        if row.get("model") is not None or row.get("metric") is not None:
            this = (str(row.get("model") or ""), str(row.get("metric") or ""))
            if made_by is None:
                made_by, first = this, where
            elif this != made_by:
                raise InputError(where, f"a row of {_made_by(this)}, but {first} is of {_made_by(made_by)}; "
                                 "compare one metric on one model at a time")
        if row.get("system") not in (None, ""):
            if system is None:
                system = (str(row["system"]), where)
            elif str(row["system"]) != system[0]:
                raise InputError(where, f"a row of system {str(row['system'])!r}, but {system[1]} is of system "
                                 f"{system[0]!r}; compare takes one system per file (a score run of several systems "
                                 "has their paired tests in its summary)")
        if row[score_column] in (None, ""):
            empty += 1
            continue
        value = _number(row[score_column], where, repr(score_column))
        if not math.isfinite(value):
            raise InputError(where, f"{score_column!r} is not finite", got=row[score_column])
        image = str(row["image"])
        key = str(row["id"]) if match == "id" else image
        if key in out:
            raise InputError(where, f"duplicate {match} {key!r}"
                             + (" (match='image' needs one caption per image)" if match == "image" else ""))
        out[key] = (value, image, ({**row, "score": value}, where))
    return out, empty, made_by


def headline_of(metric: str | None):
    """The :class:`~capscore.scores.aggregate.Summed` aggregate of a registered metric whose headline is a
    corpus score of per-item vectors (the classic metrics), else None (its headline is the mean)."""
    row = registry().get(metric or "")
    own = aggregate_for(row) if row is not None else None
    return own if isinstance(own, Summed) and own.name != "mean" else None


def _tokenizer_of(path, metric: str) -> str | None:
    """The tokenizer a classic metric's scores were computed on, from the run's summary beside ``path``
    (None: not a classic metric, or no summary to say)."""
    if metric not in CLASSIC_METRICS:
        return None
    summary = writers.load_json(summary_path(Path(path)))
    tok = summary.get("tokenizer") if isinstance(summary, dict) else None
    return tok if isinstance(tok, str) else None


def _made_by(made_by: tuple[str, str]) -> str:
    model, metric = made_by
    return f"metric {metric or '?'!r} on model {model or '?'!r}"


def paired_scores(path_a, path_b, *, match: str = "id", score_column: str = "score"):
    """(scores A, scores B, image clusters, counts) for the items scored in both files."""
    xa, xb, images, counts, _ = _paired(path_a, path_b, match=match, score_column=score_column)
    return xa, xb, images, counts


def _paired(path_a, path_b, *, match: str, score_column: str):
    """:func:`paired_scores` and, for a corpus headline, (its aggregate, vectors A, vectors B); else None."""
    if match not in ("id", "image"):
        raise CapscoreError(f"The 'match' parameter of paired_scores must be 'id' or 'image'; got {match!r} instead.")
    a, empty_a, by_a = read_system(path_a, match=match, score_column=score_column)
    b, empty_b, by_b = read_system(path_b, match=match, score_column=score_column)
    if by_a is not None and by_b is not None and by_a != by_b:
        raise CapscoreError(f"{path_a} holds scores of {_made_by(by_a)} and {path_b} of {_made_by(by_b)}; "
                            "a comparison needs both systems scored by the same metric on the same model")
    metric = (by_a or by_b or ("", ""))[1]
    tok_a, tok_b = _tokenizer_of(path_a, metric), _tokenizer_of(path_b, metric)
    if tok_a is not None and tok_b is not None and tok_a != tok_b:
        raise CapscoreError(f"{path_a} holds {metric} on {tok_a} tokens and {path_b} on {tok_b} tokens (their "
                            "summaries' tokenizer); a comparison needs both systems tokenised alike")
    keys = [k for k in a if k in b]
    if len(keys) < 2:
        raise OptionError(f"{braced(path_a)} and {braced(path_b)} share {len(keys)} scored {match}(s); a "
                          f"comparison needs at least 2" + (" (try {match} image)" if match == "id" else ""))
    for k in keys:
        if a[k][1] != b[k][1]:  # the library names the parameter (match), the command line the flag (--match)
            raise OptionError(braced(str(InputError(
                f"{path_b}: id {k!r}", "the same id names another image than in A (as ids that are line numbers "
                "do in files of different orders)", expected=a[k][1], got=b[k][1])))
                + "; pair by image: {match} image")
    counts = {"paired": len(keys), "only in A": len(a) - len(keys), "only in B": len(b) - len(keys),
              "no score in A": empty_a, "no score in B": empty_b}
    summed = headline_of((by_a or by_b or ("", ""))[1]) if score_column == "score" else None
    corpus = None if summed is None else (summed, _vectors(summed, a, keys), _vectors(summed, b, keys))
    return [a[k][0] for k in keys], [b[k][0] for k in keys], [a[k][1] for k in keys], counts, corpus


@dataclass(frozen=True)
class SystemComparison:
    """Two systems' paired tests and how they were made (:func:`compare_files`)."""

    a: str
    b: str
    match: str
    score_column: str
    counts: dict
    bootstrap: SystemTest
    randomization: SystemTest
    n_resamples: int
    seed: int

    def as_dict(self) -> dict:
        return {"kind": "compare", "a": self.a, "b": self.b, "match": self.match, "score_column": self.score_column,
                "counts": self.counts, "tests": [self.bootstrap.as_dict(), self.randomization.as_dict()]}


def compare_files(path_a, path_b, *, match: str = "id", score_column: str = "score", n_resamples: int = 10000,
                  seed: int = 0) -> SystemComparison:
    """The paired bootstrap and the approximate randomisation test of two score files, images as clusters: of
    the metric's headline (a corpus score recomputed per resample for the classic metrics; module docstring)."""
    xa, xb, images, counts, corpus = _paired(path_a, path_b, match=match, score_column=score_column)
    try:
        boot, ar = _tests(xa, xb, corpus, images, n_resamples=n_resamples, seed=seed)
    except CapscoreError as e:  # e.g. scores whose differences overflow: name the files
        raise CapscoreError(f"{path_a} vs {path_b}: {e}") from None
    return SystemComparison(str(path_a), str(path_b), match, score_column, counts, boot, ar, n_resamples, seed)


def _vectors(own, system: dict, keys: list) -> list:
    """The rows' vectors of a corpus headline, in ``keys`` order; a row without them is one line naming it."""
    out = []
    for k in keys:
        row, where = system[k][2]
        try:
            out.append(own.vector(row))
        except ValueError as e:
            raise InputError(where, str(e)) from None
    return out


def _tests(xa, xb, corpus, clusters, *, n_resamples: int, seed: int):
    """Both paired tests: of the mean, or of the corpus headline when ``corpus`` = (aggregate, vectors A, B)."""
    from capscore.meta.significance import compare_summed, compare_systems  # noqa: PLC0415  (deferred: numpy, scipy)

    if corpus is None:
        return compare_systems(xa, xb, clusters=clusters, n_resamples=n_resamples, seed=seed)
    own, va, vb = corpus
    return compare_summed(va, vb, own.finish, clusters=clusters, n_resamples=n_resamples, seed=seed,
                          statistic=own.name)


def format_comparison(c: SystemComparison) -> str:
    boot, ar = c.bootstrap, c.randomization
    stat = boot.statistic
    rows = [{"test": "paired bootstrap", f"{stat} A": boot.mean_a, f"{stat} B": boot.mean_b, "A - B": boot.delta,
             "95% CI": f"[{format_number(boot.ci[0])}, {format_number(boot.ci[1])}]", "p (two-sided)": format_p(boot.p_value, c.n_resamples),
             "A wins": f"{100 * boot.wins_a:.1f}%"},
            {"test": "approximate randomisation", f"{stat} A": ar.mean_a, f"{stat} B": ar.mean_b, "A - B": ar.delta,
             "95% CI": "", "p (two-sided)": format_p(ar.p_value, c.n_resamples), "A wins": ""}]
    what = "" if stat == "mean" else f"the headline {stat} recomputed on each resample; "
    lines = [f"A = {c.a}\nB = {c.b}",
             f"{c.counts['paired']} captions of {boot.n_clusters} images paired by {c.match}; images resampled as "
             f"clusters; {what}{c.n_resamples} resamples each, seed {c.seed}", format_table(rows, indent="")]
    left = {k: v for k, v in c.counts.items() if k != "paired" and v}
    if left:
        lines.append("left out: " + ", ".join(f"{v} {k}" for k, v in left.items()))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ several systems in one run
def system_tests(rows, *, n_resamples: int = 1000, seed: int = 0) -> list[dict]:
    """Both paired tests between every two systems of each (model, metric) of one run's rows.

    A caption of system A is paired with the caption of system B that has the same id *and* the same
    image (or video). Ids that are line numbers (a system whose ids are exactly 1..N: a JSONL/CSV without
    an ``id`` column) say nothing about the item, so when they name different images in the two systems the
    captions are paired by image instead, which needs one caption per image in each system; so are two
    systems that share no id. Two systems that cannot be paired that way -- explicit ids naming different
    images, or several captions per image without ids that agree -- are not tested: their entry holds
    ``left_out`` (why) instead of ``tests``, as are pairs with fewer than 2 images in common. The image of
    a caption is its cluster; error rows are left out, as in :func:`compare_files`. The statistic is the
    metric's headline: a corpus score recomputed on each resample for the classic metrics (module docstring).
    """
    by: dict[tuple, dict[str, list[tuple[str, str, tuple]]]] = {}
    ids: dict[tuple, set[str]] = {}  # every id of a system, error rows too: are they its line numbers?
    heads: dict[str | None, object] = {}
    for r in rows:
        key, system = (r.get("model"), r.get("metric")), r.get("system") or ""
        ids.setdefault((*key, system), set()).add(str(r["id"]))
        if r.get("score") is None:
            continue
        if key[1] not in heads:
            heads[key[1]] = headline_of(key[1])
        own = heads[key[1]]
        media = r.get("image") if r.get("image") is not None else r.get("video")
        by.setdefault(key, {}).setdefault(system, []).append(
            (str(r["id"]), str(media), (float(r["score"]), None if own is None else own.vector(r))))
    out = []
    for (model, metric), systems in by.items():
        for a, b in combinations(sorted(systems), 2):
            head = {"model": model, "metric": metric, "a": a, "b": b}
            positional = all(_line_numbers(ids[(model, metric, s)]) for s in (a, b))
            match, pa, pb, why = _pairable(systems[a], systems[b], positional=positional, names=(a, b))
            keys = [k for k in pa if k in pb]
            images = [pa[k][0] for k in keys]
            if match is not None and len(set(images)) < 2:
                why = f"{len(set(images))} image(s) in common; the tests resample images and need at least 2"
            if why:
                out.append({**head, "left_out": why})
                continue
            own = heads[metric]
            corpus = None if own is None else (own, [pa[k][1][1] for k in keys], [pb[k][1][1] for k in keys])
            try:
                boot, ar = _tests([pa[k][1][0] for k in keys], [pb[k][1][0] for k in keys], corpus, images,
                                  n_resamples=n_resamples, seed=seed)
            except CapscoreError as e:  # e.g. differences that overflow: the scored rows stand, the test is left out
                out.append({**head, "left_out": str(e)})
                continue
            out.append({**head, "match": match, "paired": len(keys), "only_a": len(pa) - len(keys),
                        "only_b": len(pb) - len(keys), "tests": [boot.as_dict(), ar.as_dict()]})
    return out


def _line_numbers(ids: set[str]) -> bool:
    """Whether a system's ids are exactly 1..N (what a caption file without ids gets: its line numbers)."""
    return ids == {str(n) for n in range(1, len(ids) + 1)}


def _pairable(a: list, b: list, *, positional: bool, names: tuple[str, str]):
    """(how, {key: (image, score)} for a, for b, why not): by id where the ids of both systems name the same
    images; else by image where the ids are line numbers (or shared by none) and each system has one caption
    per image; else (None, {}, {}, the reason)."""
    by_id = ({i: (m, s) for i, m, s in a}, {i: (m, s) for i, m, s in b})
    shared = [k for k in by_id[0] if k in by_id[1]]
    clash = next((k for k in shared if by_id[0][k][0] != by_id[1][k][0]), None)
    if shared and clash is None:
        return "id", *by_id, ""
    if clash is not None and not positional:
        return (None, {}, {}, f"id {clash!r} names {by_id[0][clash][0]} in {names[0]} but {by_id[1][clash][0]} in "
                f"{names[1]}: ids must name the same image in every system (pair the files by image with "
                "capscore compare --match image)")
    for name, x in zip(names, (a, b)):
        seen: set[str] = set()
        for _, m, _ in x:
            if m in seen:
                how = "their ids are line numbers that name different images" if clash is not None else \
                    "they share no id"
                return (None, {}, {}, f"{how}, and {name} has several captions of {m}: give each caption an id "
                        "that names the same item in every system")
            seen.add(m)
    return "image", {m: (m, s) for _, m, s in a}, {m: (m, s) for _, m, s in b}, ""


def score_system_tests(job, result: dict, *, n_resamples: int = 1000, seed: int = 0) -> str:
    """For a ``capscore score`` run with several systems: the paired tests between them, added to the run's
    summary file as ``system_tests`` and returned as a table, with a line for each pair of systems left out
    of the tests and why ("" for a run with one system)."""
    if not any(len(r["systems"]) > 1 for r in result["runs"]):
        return ""
    out = Path(job.output.path)
    columns = columns_for(job.medium, [get_metric(m) for m in job.metrics])
    tests = system_tests(writers.read_rows(out, columns), n_resamples=n_resamples, seed=seed)
    spath = summary_path(out)
    write_json(spath, {**json.loads(spath.read_text(encoding="utf-8")), "system_tests": tests})
    rows = [{"model": t["model"] or TEXT_ONLY, "metric": t["metric"], "statistic": boot.get("statistic", "mean"),
             "A": t["a"], "B": t["b"], "A - B": boot["delta"],
             "95% CI": f"[{format_number(boot['ci'][0])}, {format_number(boot['ci'][1])}]",
             "p bootstrap": format_p(boot["p_value"], n_resamples),
             "p randomisation": format_p(ar["p_value"], n_resamples), "paired": t["paired"], "by": t["match"]}
            for t in tests if "tests" in t for boot, ar in [t["tests"]]]
    lines = []
    if rows:
        lines += [f"paired tests between systems of each metric's headline (captions paired by id and image, or by "
                  f"image where ids are line numbers; images resampled as clusters and a corpus headline recomputed "
                  f"on each resample, {n_resamples} resamples each, seed {seed})",
                  format_table(rows)]
    lines += [f"left out of the paired tests: {t['a']} vs {t['b']} ({t['metric']}, {t['model']}): {t['left_out']}"
              for t in tests if "left_out" in t]
    return "\n".join(lines)
