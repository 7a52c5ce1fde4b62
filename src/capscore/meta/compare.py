"""Is system A's mean score different from system B's, beyond noise?

Two ``capscore score`` outputs (JSONL/CSV/JSON/Parquet rows with ``id``, ``image`` and ``score``) of two
captioning systems, scored by the same metric, are matched item by item (``match="id"``: the same ``id``
in both files; ``match="image"``: the same ``image``, one caption per image in each file), and compared
with a paired bootstrap and a paired approximate randomisation test over images — all captions of one
image move together (:mod:`capscore.meta.significance`). Rows without a score (error rows) and items
present in only one file are counted and left out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from capscore.errors import CapscoreError, InputError

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
    from capscore.meta.datasets import read_rows

    return read_rows(path)


def read_system(path, *, match: str = "id", score_column: str = "score") -> tuple[dict[str, tuple[float, str]], int]:
    """One system's scores -> ({key: (score, image)}, rows without a score). ``key`` is the id or the image."""
    from capscore.meta.datasets import _number

    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(str(path), "scores file not found")
    out: dict[str, tuple[float, str]] = {}
    empty = 0
    for where, row in _rows(path):
        need = ["image", score_column] + (["id"] if match == "id" else [])
        missing = [c for c in need if c not in row]
        if missing:
            raise InputError(where, f"missing column {missing[0]!r}",
                             expected=f"{', '.join(repr(c) for c in need)} (a capscore score output)")
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
        out[key] = (value, image)
    return out, empty


def paired_scores(path_a, path_b, *, match: str = "id", score_column: str = "score"):
    """(scores A, scores B, image clusters, counts) for the items scored in both files."""
    if match not in ("id", "image"):
        raise CapscoreError(f"The 'match' parameter of paired_scores must be 'id' or 'image'; got {match!r} instead.")
    a, empty_a = read_system(path_a, match=match, score_column=score_column)
    b, empty_b = read_system(path_b, match=match, score_column=score_column)
    keys = [k for k in a if k in b]
    if len(keys) < 2:
        raise CapscoreError(f"{path_a} and {path_b} share {len(keys)} scored {match}(s); a comparison needs at "
                            f"least 2" + (" (try match='image')" if match == "id" else ""))
    for k in keys:
        if a[k][1] != b[k][1]:
            raise InputError(f"{path_b}: id {k!r}", "the same id names another image than in A",
                             expected=a[k][1], got=b[k][1])
    counts = {"paired": len(keys), "only in A": len(a) - len(keys), "only in B": len(b) - len(keys),
              "no score in A": empty_a, "no score in B": empty_b}
    return [a[k][0] for k in keys], [b[k][0] for k in keys], [a[k][1] for k in keys], counts


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
    """The paired bootstrap and the approximate randomisation test of two score files, images as clusters."""
    from capscore.meta.significance import compare_systems

    xa, xb, images, counts = paired_scores(path_a, path_b, match=match, score_column=score_column)
    boot, ar = compare_systems(xa, xb, clusters=images, n_resamples=n_resamples, seed=seed)
    return SystemComparison(str(path_a), str(path_b), match, score_column, counts, boot, ar, n_resamples, seed)


def format_comparison(c: SystemComparison) -> str:
    from capscore.report.tables import format_table

    boot, ar = c.bootstrap, c.randomization
    rows = [{"test": "paired bootstrap", "mean A": boot.mean_a, "mean B": boot.mean_b, "A - B": boot.delta,
             "95% CI": f"[{boot.ci[0]:.4f}, {boot.ci[1]:.4f}]", "p (two-sided)": boot.p_value,
             "A wins": f"{100 * boot.wins_a:.1f}%"},
            {"test": "approximate randomisation", "mean A": ar.mean_a, "mean B": ar.mean_b, "A - B": ar.delta,
             "95% CI": "", "p (two-sided)": ar.p_value, "A wins": ""}]
    lines = [f"A = {c.a}\nB = {c.b}",
             f"{c.counts['paired']} captions of {boot.n_clusters} images paired by {c.match}; images resampled as "
             f"clusters; {c.n_resamples} resamples each, seed {c.seed}", format_table(rows, indent="")]
    left = {k: v for k, v in c.counts.items() if k != "paired" and v}
    if left:
        lines.append("left out: " + ", ".join(f"{v} {k}" for k, v in left.items()))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ several systems in one run
def system_tests(rows, *, n_resamples: int = 1000, seed: int = 0) -> list[dict]:
    """Both paired tests between every two systems of each (model, metric) of one run's rows.

    Captions are paired by ``id`` (the same item scored for each system); when two systems share no id but
    each has one caption per image, by image. The image (or video) of a caption is its cluster; error rows
    are left out, as in :func:`compare_files`.
    """
    from itertools import combinations

    from capscore.meta.significance import compare_systems

    by: dict[tuple, dict[str, list[tuple[str, str, float]]]] = {}
    for r in rows:
        if r.get("score") is None:
            continue
        media = r.get("image") if r.get("image") is not None else r.get("video")
        by.setdefault((r.get("model"), r.get("metric")), {}).setdefault(r.get("system") or "", []).append(
            (str(r["id"]), str(media), float(r["score"])))
    out = []
    for (model, metric), systems in by.items():
        for a, b in combinations(sorted(systems), 2):
            match, pa, pb = _pairable(systems[a], systems[b])
            if match is None:
                continue
            ids = [k for k in pa if k in pb]
            images = [pa[k][0] for k in ids]
            if len(set(images)) < 2:
                continue  # nothing to resample
            boot, ar = compare_systems([pa[k][1] for k in ids], [pb[k][1] for k in ids], clusters=images,
                                       n_resamples=n_resamples, seed=seed)
            out.append({"model": model, "metric": metric, "a": a, "b": b, "match": match, "paired": len(ids),
                        "tests": [boot.as_dict(), ar.as_dict()]})
    return out


def _pairable(a: list, b: list):
    """(how, {key: (image, score)} for a, for b): by id when the systems share ids, else by image when each
    has one caption per image; (None, ...) when they cannot be paired."""
    by_id = ({i: (m, s) for i, m, s in a}, {i: (m, s) for i, m, s in b})
    if set(by_id[0]) & set(by_id[1]):
        return "id", *by_id
    images = [[m for _, m, _ in x] for x in (a, b)]
    if all(len(set(m)) == len(m) for m in images):
        return "image", {m: (m, s) for _, m, s in a}, {m: (m, s) for _, m, s in b}
    return None, {}, {}


def score_system_tests(job, result: dict, *, n_resamples: int = 1000, seed: int = 0) -> str:
    """For a ``capscore score`` run with several systems: the paired tests between them, added to the run's
    summary file as ``system_tests`` and returned as a table ("" for a run with one system)."""
    import json

    from capscore.pipeline import columns_for, summary_path, write_json
    from capscore.report.tables import format_table
    from capscore.report.writers import read_rows
    from capscore.scores.metric import get_metric

    if not any(len(r["systems"]) > 1 for r in result["runs"]):
        return ""
    out = Path(job.output.path)
    columns = columns_for(job.medium, [get_metric(m) for m in job.metrics])
    tests = system_tests(read_rows(out, columns), n_resamples=n_resamples, seed=seed)
    spath = summary_path(out)
    write_json(spath, {**json.loads(spath.read_text(encoding="utf-8")), "system_tests": tests})
    rows = [{"model": t["model"], "metric": t["metric"], "A": t["a"], "B": t["b"], "A - B": boot["delta"],
             "95% CI": f"[{boot['ci'][0]:.4f}, {boot['ci'][1]:.4f}]", "p bootstrap": boot["p_value"],
             "p randomisation": ar["p_value"], "paired": t["paired"]}
            for t in tests for boot, ar in [t["tests"]]]
    head = (f"paired tests between systems (captions paired by id, else by image; images resampled as clusters, "
            f"{n_resamples} resamples each, seed {seed})")
    return head + "\n" + format_table(rows) if rows else ""
