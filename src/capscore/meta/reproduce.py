"""The papers' headline numbers as data, and the protocol that recomputes each one.

Each file in ``capscore/meta/tables/*.csv`` is one table of one paper; each row one reported number:

===============  ============================================================================================
``dataset``      a :data:`capscore.meta.datasets.DATASETS` name
``split``        the split the paper reports (informational; the published files hold only that split)
``metric``       a CLIP-family metric (``clip-s``, ``refpac-s``, …) or a classic one (``bleu4``, ``cider``, …)
``backbone``     the paper's name for the backbone/checkpoint (``-`` for the classic metrics)
``model``        the ``--model`` spec that loads it, with ``{weights}`` for the weights root (``-``: none)
``statistic``    the column of the result (``tau_b``, ``tau_c``, ``HC`` … ``mean``, ``1-ref``, ``4-ref``)
``paper``        the number as printed (points)
``tolerance``    |ours − paper| ≤ tolerance counts as reproduced: capscore's choice, 0.5 for τ (printed to
                 one decimal, plus tie handling and image decoding differences), 1.0 for accuracies
                 (Pascal-50S draws 5 of 48 references at random)
``source``       paper, table, and the text it was read from
===============  ============================================================================================

The protocol of a row is the one :func:`capscore.meta.evaluate.evaluate` runs for ``capscore correlate
--dataset D --metric M --model MODEL`` (the dataset's published files under the data root, in the layout of
:data:`DATA_LAYOUT`, the row's ``split``), with the reference code's image pipeline (``rgb_order="after-crop"``)
and the PTB tokenizer for the classic metrics. A row whose metric capscore cannot run here
(:data:`NOT_REGISTERED`), or whose files, weights or tools (Java, CoreNLP) are absent, is skipped with the
reason; nothing is downloaded.

Where an author's code printed a value other than the paper's table, both are rows, each citing its source
(ROUGE-L on Flickr8k-Expert τ-b: 31.1 in ``pac-s-flickr8k``, 32.1 in ``pacscore-readme``).
"""
from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
import json
import math

from capscore.errors import CapscoreError, InputError, unknown_name
from capscore.scores.classic import CLASSIC_METRICS, corenlp_dir, in_session, java
from capscore.backbones import load_backbone
from capscore.data.jsonl import csv_problem, iter_csv_rows
from capscore.report.tables import format_table
from capscore.scores.learned import missing, weights_dir
from capscore.scores.metric import registry

TABLES_DIR = Path(__file__).parent / "tables"
COLUMNS = ("dataset", "split", "metric", "backbone", "model", "statistic", "paper", "tolerance", "source")

#: dataset -> files under the data root: (--path, --images, --coco-captions or None), in the published layouts
#: (the clipscore/pacscore ``flickr8k`` folder, the Polos/DENEB Composite CSV, the CIDEr release's Pascal-50S
#: .mat files beside VOC2010 ``JPEGImages/``, FOIL's test JSON and COCO val2014 with its captions file).
#: Polaris, Nebula and LongCap-Arena: the dataset folder (the authors' CSV of the row's split, or the Hugging Face
#: parquet files, see :func:`capscore.meta.datasets.load_published`) and its ``images/``.
DATA_LAYOUT: dict[str, tuple[str, str, str | None]] = {
    "flickr8k-expert": ("flickr8k/flickr8k.json", "flickr8k", None),
    "flickr8k-cf": ("flickr8k/crowdflower_flickr8k.json", "flickr8k", None),
    "composite": ("composite/composite.csv", "composite", None),
    "pascal50s": ("pascal50s", "pascal50s", None),
    "foil": ("foil/foilv1.0_test_2017.json", "coco", "coco/annotations/captions_val2014.json"),
    "polaris": ("polaris", "polaris/images", None),
    "nebula": ("nebula", "nebula/images", None),
    "longcap-arena": ("longcap-arena", "longcap-arena/images", None),
}
#: Metrics of published rows that capscore's ``correlate`` path does not run (yet): metric -> what it needs.
#: The rows are listed and compared with nothing until the metric is registered; then they run.
NOT_REGISTERED = {
    "vela": "capscore has no VELA implementation: the published value is listed for comparison only",
}


def default_root(kind: str, given: str | os.PathLike | None = None) -> Path:
    """``given``, else ``$CAPSCORE_DATA`` / ``$CAPSCORE_WEIGHTS``, else ``~/.cache/capscore/data`` / ``weights``."""
    from capscore.embed import cache as embed_cache  # noqa: PLC0415  (deferred: numpy)

    if given:
        return Path(given).expanduser()
    env = {"data": "CAPSCORE_DATA", "weights": "CAPSCORE_WEIGHTS"}[kind]
    return Path(os.environ[env]).expanduser() if os.environ.get(env) else embed_cache.DEFAULT_CACHE_DIR / kind


@dataclass(frozen=True)
class PaperRow:
    dataset: str
    split: str
    metric: str
    backbone: str
    model: str
    statistic: str
    paper: float
    tolerance: float
    source: str
    where: str = ""  # file:line


@dataclass(frozen=True)
class RowResult:
    row: PaperRow
    ours: float | None = None
    skipped: str = ""  # why the row was not run

    @property
    def delta(self) -> float | None:
        return None if self.ours is None else self.ours - self.row.paper

    @property
    def within(self) -> bool | None:
        return None if self.ours is None else abs(self.ours - self.row.paper) <= self.row.tolerance + 1e-9

    def as_dict(self) -> dict:
        d = asdict(self.row)
        d.update(ours=self.ours, delta=self.delta, within_tolerance=self.within, skipped=self.skipped or None)
        return d


# ------------------------------------------------------------------------------------ tables
def table_names() -> list[str]:
    return sorted(p.stem for p in TABLES_DIR.glob("*.csv"))


def table_path(table: str | os.PathLike) -> Path:
    """A shipped table's name (``pac-s-flickr8k``) or a CSV file of the same columns."""
    p = Path(table).expanduser()
    if p.suffix.lower() == ".csv":
        if not p.is_file():
            raise InputError(str(p), "table file not found")
        return p
    if str(table) not in table_names():
        raise unknown_name("reproduction table", str(table), table_names())
    return TABLES_DIR / f"{table}.csv"


def read_table(table: str | os.PathLike) -> list[PaperRow]:
    """A table's rows, each checked: a known dataset, a finite paper value and a finite tolerance >= 0."""
    from capscore.meta.datasets import DATASETS, _number  # noqa: PLC0415  (deferred: numpy)

    path = table_path(table)
    rows = []
    try:
        f = open(path, encoding="utf-8-sig", newline="")
    except OSError as e:
        raise InputError(str(path), f"cannot read file ({e.strerror or e})") from None
    with f:
        reader = csv.DictReader(f, strict=True)
        try:
            header = tuple(reader.fieldnames or ())
        except (csv.Error, UnicodeDecodeError) as e:
            raise InputError(f"{path}:1", csv_problem(e)) from None
        if header != COLUMNS:
            raise InputError(f"{path}:1", "wrong header", expected=",".join(COLUMNS), got=list(header))
        for line, _, r in iter_csv_rows(reader, path):
            where = f"{path}:{line}"
            if None in r or any(v is None for v in r.values()):
                raise InputError(where, f"malformed CSV row: {len(COLUMNS)} fields expected")
            if r["dataset"] not in DATASETS:
                raise InputError(where, f"unknown dataset {r['dataset']!r}")
            paper, tolerance = _number(r["paper"], where, "'paper'"), _number(r["tolerance"], where, "'tolerance'")
            if not math.isfinite(paper):
                raise InputError(where, "'paper' must be the number the paper prints", got=r["paper"])
            if not (math.isfinite(tolerance) and tolerance >= 0):
                raise InputError(where, "'tolerance' must be a number >= 0", got=r["tolerance"])
            rows.append(PaperRow(r["dataset"], r["split"], r["metric"], r["backbone"], r["model"], r["statistic"],
                                 paper, tolerance, r["source"], where))
    if not rows:
        raise InputError(str(path), "the table has no rows")
    return rows


# ------------------------------------------------------------------------------------ what is present
def data_files(dataset: str, data_root: Path) -> tuple[Path, Path, Path | None]:
    if dataset not in DATA_LAYOUT:
        raise CapscoreError(f"no published layout is known for dataset {dataset!r} (known: {', '.join(DATA_LAYOUT)})")
    path, images, coco = DATA_LAYOUT[dataset]
    return data_root / path, data_root / images, (data_root / coco if coco else None)


def missing_data(dataset: str, data_root: Path) -> str:
    """'' when the dataset's files are under ``data_root``, else what is missing (or an empty file)."""
    path, images, coco = data_files(dataset, data_root)
    for p in (path, coco, images):
        if p is not None and not p.exists():
            return f"data not found: {p}"
        if p is not None and p.is_file() and p.stat().st_size == 0:
            return f"data file is empty (0 bytes): {p}"
    return ""


def missing_weights(path: Path) -> str:
    """'' when ``path`` is a weights file that is not empty, else what is wrong with it."""
    if not path.is_file():
        return f"weights not found: {path}"
    if path.stat().st_size == 0:
        return f"weights file is empty (0 bytes): {path}"
    return ""


def weights_file(model: str, weights_root: Path) -> Path | None:
    """The weights file a model template names (``{weights}/…`` up to ``#``), or None if it names none."""
    if "{weights}" not in model:
        return None
    rest = model.split("{weights}", 1)[1].split("#", 1)[0]
    return weights_root / rest.lstrip("/")


def model_spec(model: str, weights_root: Path) -> str:
    return model.replace("{weights}", str(weights_root))


def missing_tools(metric: str) -> str:
    if metric not in CLASSIC_METRICS:
        return ""
    try:
        import pycocoevalcap  # noqa: F401
    except ImportError:
        return "pycocoevalcap not installed (pip install 'capscore[classic]')"
    if java() is None:
        return "Java not found (PTB tokenizer, METEOR, SPICE)"
    if metric == "spice" and corenlp_dir() is None:
        return "Stanford CoreNLP 3.6.0 jars not found (see capscore doctor)"
    return ""


# ------------------------------------------------------------------------------------ running
@in_session  # the classic rows share one METEOR process and PTB memo, however many metrics and draws
def run_table(rows: Sequence[PaperRow], *, data_root, weights_root, device: str = "cpu", batch_size: int = 64,
              seed: int = 0, model_override: Mapping[str, str] | None = None, cache=None,
              metric_weights=None) -> list[RowResult]:
    """Recompute every row that can be run; skip the others with the reason.

    ``metric_weights``: the folder of the released files of the metrics with their own models (Polos,
    DENEB, the judges; :func:`capscore.scores.learned.weights_dir`'s default when None).

    ``model_override``: model template -> spec to use instead (tests run the protocols with small random
    weights this way). ``cache``: an embedding cache (default: in memory).
    """
    from capscore.embed.engine import Encoder, MemoryCache  # noqa: PLC0415  (deferred: numpy, torch)
    from capscore.meta.datasets import load_dataset  # noqa: PLC0415  (deferred: numpy)
    from capscore.meta.evaluate import evaluate  # noqa: PLC0415  (deferred: numpy, scipy, torch)

    data_root, weights_root = Path(data_root).expanduser(), Path(weights_root).expanduser()
    cache = cache if cache is not None else MemoryCache()
    override = dict(model_override or {})
    out: list[RowResult | None] = [None] * len(rows)
    datasets: dict[str, object] = {}
    results: dict[tuple[str, str, str], object] = {}
    encoders: dict[str, object] = {}

    for i, row in enumerate(rows):
        why = ""
        if row.metric not in registry() and row.metric not in CLASSIC_METRICS:
            why = NOT_REGISTERED.get(row.metric, f"metric {row.metric!r} is not available in this capscore")
        why = why or missing_data(row.dataset, data_root) or missing_tools(row.metric)
        own = row.metric in registry() and registry()[row.metric].own_models
        if not why and own:
            why = missing(row.metric, weights_dir(metric_weights))
        if not why and row.model != "-" and row.model not in override:
            wf = weights_file(row.model, weights_root)
            if wf is not None:
                why = missing_weights(wf)
        if why:
            out[i] = RowResult(row, skipped=why)
            continue
        dkey = (row.dataset, row.split)
        if dkey not in datasets:
            path, images, coco = data_files(row.dataset, data_root)
            datasets[dkey] = load_dataset(row.dataset, path, images, seed=seed, coco_captions=coco, split=row.split)
        key = (row.dataset, row.split, row.model, row.metric)
        if key not in results:
            encoder = None
            if row.model != "-":
                spec = override.get(row.model) or model_spec(row.model, weights_root)
                if spec not in encoders:
                    bb = load_backbone(spec, device=device, seed=seed, rgb_order="after-crop")
                    encoders[spec] = Encoder(bb, batch_size=batch_size, cache=cache, progress=False)
                encoder = encoders[spec]
            options = {"metric_weights": metric_weights, "device": device} if own else None
            try:
                results[key] = evaluate(datasets[dkey], encoder, row.metric, n_resamples=0, seed=seed,
                                        options=options)
            except CapscoreError as e:  # e.g. constant scores: the correlation is undefined; the other rows run
                results[key] = f"not computed: {e}"
        if isinstance(results[key], str):
            out[i] = RowResult(row, skipped=results[key])
            continue
        stat = results[key].get(row.statistic)
        if stat is None:
            raise CapscoreError(f"{row.where}: the protocol of {row.dataset} gives no statistic {row.statistic!r} "
                                f"(it gives {', '.join(s.name for s in results[key].stats)})")
        out[i] = RowResult(row, float(stat.value))
    return [r for r in out if r is not None]


def format_results(results: Sequence[RowResult]) -> str:
    done = [r for r in results if r.ours is not None]
    lines = []
    if done:
        rows = [{"dataset": r.row.dataset, "metric": r.row.metric, "backbone": r.row.backbone,
                 "statistic": r.row.statistic, "ours": f"{r.ours:.1f}", "paper": f"{r.row.paper:.1f}",
                 "Δ": f"{r.delta:+.1f}", "within": ("yes" if r.within else "NO") + f" (±{r.row.tolerance:g})"}
                for r in done]
        lines.append(format_table(rows, indent=""))
        ok = sum(1 for r in done if r.within)
        lines.append(f"{ok} of {len(done)} rows within tolerance")
    for r in results:
        if r.skipped:
            lines.append(f"skipped {r.row.dataset} {r.row.metric} {r.row.backbone} {r.row.statistic}: {r.skipped}")
    return "\n".join(lines) if lines else "(no rows)"


def format_tables() -> str:
    """Every shipped table with its rows (``capscore reproduce --list``)."""
    parts = []
    for name in table_names():
        rows = read_table(name)
        one_source = len({r.source for r in rows}) == 1
        parts.append(f"{name} ({len(rows)} rows" + (f"; {rows[0].source})" if one_source else "; sources per row)"))
        parts.append(format_table([{"dataset": r.dataset + ("" if r.split == "test" else f" {r.split}"),
                                    "metric": r.metric, "backbone": r.backbone, "statistic": r.statistic,
                                    "paper": f"{r.paper:.1f}", "±": f"{r.tolerance:g}", "model": r.model,
                                    **({} if one_source else {"source": r.source})} for r in rows]))
    return "\n".join(parts)


def write_results(path: Path, results: Sequence[RowResult], *, table: str, data_root: Path, weights_root: Path,
                  seed: int) -> Path:
    """``reproduce.json``: every row's result with the table, roots and seed it was made with."""
    path.write_text(json.dumps({"kind": "reproduce", "table": str(table), "data_root": str(data_root),
                                "weights_root": str(weights_root), "seed": seed,
                                "rows": [r.as_dict() for r in results]}, indent=2) + "\n", encoding="utf-8")
    return path


__all__ = [
    "DATA_LAYOUT", "PaperRow", "RowResult", "TABLES_DIR", "data_files", "default_root", "format_results",
    "format_tables", "missing_data", "missing_tools", "missing_weights", "read_table", "run_table", "table_names",
    "weights_file",
    "write_results",
]
