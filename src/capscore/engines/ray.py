"""``--engine ray``: the single-process scorer's per-block functions as a Ray Data pipeline.

::

    shards ──read (CPU task, capscore.data.shards.read_shard)──▶ blocks of pickled items
           ──decode + preprocess (CPU task, ImageRef.read/decode + backbone.preprocess)──▶ + pixels
           ──encode + metric + write (actor pool: one backbone per actor, loaded once)──▶ part files + manifests
           ──driver: manifests only; a shard whose parts cover it ──commit (Ray task)──▶ DIR/<name>.<fmt>

Nothing is implemented twice. The read tasks call the same reader as the
single-process engine; the CPU tasks call :meth:`ImageRef.read`,
:meth:`ImageRef.decode` and the backbone's ``preprocess``; each actor holds an
:class:`~capscore.embed.engine.Encoder`, puts the shipped pixels into its
cache with :meth:`Encoder.encode_pixels`, and scores the block with the
pipeline's block function :func:`capscore.pipeline.score_block`, once per
metric of the job — which finds every image vector in the cache and encodes
the block's unique texts. Rows are therefore the rows of the single-process
engine; only the batch composition differs, which moves fp32 scores by float
rounding (≤ 1e-6, tested). Several models run one after the other, one actor
pool per model.

Output names. Each input shard writes ``DIR/<name>.<fmt>`` with ``name =
<stem>-<8 hex digits of sha1(absolute path)>`` (:func:`shard_output_name`): a
function of the shard alone, so adding or removing other shards never renames
a file, and ``a/x.tar`` and ``b/x.tar`` do not collide. A file listed twice is
scored twice, as the single-process engine scores it; its k-th occurrence is
named ``<name>~k``. Within a file, rows come (model, metric) after (model,
metric), each in input order, which is the single-process engine's order
restricted to that shard; ``_summary.json`` lists the files in input order
(``files``).

Who writes what, and exactly once. Rows never pass through the driver. An
actor writes each (block, model, metric)'s rows as a *part file*
``DIR/_shards/parts/<name>/m<model>-k<metric>-<first position>-<rows>.<fmt>``
(a unique temporary name, then a rename; Parquet parts are not fsynced: a
crash loses only parts, which the next run redoes) and returns one manifest row per part
(positions covered, count, sum, skipped, first error). Ray Data spreads a
shard's blocks over all actors and retries the blocks of a killed actor on
another; routing a shard's blocks to one actor (so that it could write the
whole shard) is not something an actor pool offers, and would lose the
blocks already done when that actor dies. Part files keyed by position avoid
both: a re-run block writes the same name with the same rows, and the driver
keys manifests by first position, so a block reported twice counts once. When
one chain of manifests covers positions ``0 … n−1`` for every (model, metric)
— ``n`` comes from the sentinel row the reader adds after each shard's last
item — the driver starts a commit task (:func:`commit_shard`, a Ray task with
no CPU reservation, run on any node): it writes the sidecar
``DIR/_shards/<name>.json`` (configuration, the input's size and mtime taken
before reading, row count, per-(model, metric) totals), then the shard file
from the parts in order (temporary name, fsync, rename), then removes the
parts. The driver holds, per shard in flight, one small entry per block
until the shard's parts are complete, and then only totals: its memory does
not grow with shard size.

Resume. ``--resume`` keeps a shard whose sidecar matches (configuration,
input size and mtime, file name) and whose file has that many rows; any other
shard of the input is redone, its old file and sidecar removed first.
Outputs of shards no longer in the input (sidecars whose name no run shard
has) are removed with their sidecars, so the folder never holds rows that
``_summary.json`` does not count (``orphans_removed``). A sidecar written with
other settings (model, metric, prefix, format, source options) is refused in
one line, as the single-process engine refuses them. Leftover parts of an
interrupted run are removed before scoring.

One driver per folder: ``DIR/_run.lock`` is held (``flock``, released by the
kernel if the driver dies) from before any check until the summary is
written; a second driver on the same folder gets one line.

What is shared: the input shards and the output folder — every node must see
both paths (a shared or object-store-mounted file system), since actors and
commit tasks write into the folder. What is not: backbones (one per actor),
the embedding cache (per actor in memory; with ``--cache-dir`` each actor
opens the SQLite file at that path *on its own node* — SQLite serialises
writers on one node, so keep it on local disk, never on NFS). See
docs/scale.md.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capscore.data.shards import Shard, read_shard
from capscore.engines import require_ray
from capscore.errors import CapscoreError, OptionError

BLOCK_ROWS = 256  # items per block leaving a read task
SIDECAR_DIR = "_shards"
PARTS_DIR = "parts"  # DIR/_shards/parts/<name>/: a shard's part files until its commit


# ------------------------------------------------------------------------------------ per-block functions
def read_blocks(batch, *, shards: list[Shard], options, block_rows: int = BLOCK_ROWS):
    """Read task: shard indices (column ``id``) -> blocks of (shard, pos, end, item) rows; a sentinel row ends each shard."""
    import pyarrow as pa

    for idx in batch.column("id").to_pylist():
        rows: list[tuple] = []
        pos = -1
        for pos, item in enumerate(read_shard(shards[idx], options)):
            rows.append((idx, pos, False, pickle.dumps(item, protocol=5)))
            if len(rows) == block_rows:
                yield _table(rows, pa)
                rows = []
        rows.append((idx, pos + 1, True, b""))  # sentinel: the shard has pos + 1 items
        yield _table(rows, pa)


def _table(rows, pa):
    shard, pos, end, item = zip(*rows)
    return pa.table({"shard": pa.array(shard, pa.int64()), "pos": pa.array(pos, pa.int64()),
                     "end": pa.array(end, pa.bool_()), "item": pa.array(item, pa.binary())})


def prepare_block(batch, *, backbone):
    """CPU task: read and hash each record's image, decode and preprocess each distinct image once per
    block (a repeated image ships its key only; the actor has its pixels from the first occurrence);
    failures are left to the actor, which meets them again in ``encode_images`` and reports them exactly
    as the single-process engine."""
    import pyarrow as pa

    from capscore.data.records import Record
    from capscore.errors import InputError

    from capscore.embed.engine import Encoder, MemoryCache

    decoder = Encoder(backbone, cache=MemoryCache(max_items=1))  # its _decode: the engine's RGB-order rule
    keys, pixels, seen = [], [], set()
    for blob in batch.column("item").to_pylist():
        key, px = "", b""
        if blob:
            item = pickle.loads(blob)
            if isinstance(item, Record):
                try:
                    key, payload = item.image.read()
                    if key not in seen:
                        px = backbone.preprocess(decoder._decode(item.image, payload)).numpy()
                        px = px.astype(np.float32, copy=False).tobytes()
                        seen.add(key)
                except InputError:
                    key, px = "", b""
        keys.append(key)
        pixels.append(px)
    return batch.append_column("key", pa.array(keys, pa.string())).append_column("px", pa.array(pixels, pa.binary()))


class ScoreActor:
    """Actor: one backbone + Encoder, loaded once; scores blocks with the pipeline's block function
    (:func:`capscore.pipeline.score_block`) for every metric of the job, writes each (block, metric)'s rows
    as a part file of its shard and returns only a manifest row per part (see the module docstring)."""

    def __init__(self, *, model: str, model_index: int, encoding, metrics: tuple, prefixes: dict, options: dict,
                 columns: tuple, threads: int, pixel_shape, out: str, fmt: str, names: tuple):
        import torch

        from capscore.backbones import load_backbone
        from capscore.embed.cache import EmbeddingCache
        from capscore.embed.engine import Encoder, MemoryCache

        torch.set_num_threads(threads)
        e = encoding
        bb = load_backbone(model, device=e.device, dtype=e.dtype, seed=e.seed, context_length=e.context_length,
                           trust_remote_code=e.trust_remote_code, rgb_order=e.rgb_order)
        self.encoder = Encoder(bb, batch_size=e.batch_size,
                               cache=EmbeddingCache(e.cache_dir) if e.cache and e.cache_dir else MemoryCache(),
                               workers=threads)
        self.model, self.model_index = model, model_index
        self.metrics, self.prefixes, self.options = metrics, prefixes, options
        self.columns = columns
        self.pixel_shape = tuple(pixel_shape)
        self.out, self.fmt, self.names = Path(out), fmt, names

    def __call__(self, batch):
        import torch

        from capscore.pipeline import score_block
        from capscore.scores.metric import get_metric

        cols = {c: batch.column(c).to_pylist() for c in ("shard", "pos", "end", "item", "key", "px")}
        have = [i for i, px in enumerate(cols["px"]) if px]
        self.encoder.encode_pixels(
            [cols["key"][i] for i in have],
            [torch.from_numpy(np.frombuffer(cols["px"][i], dtype=np.float32).reshape(self.pixel_shape)) for i in have])
        manifest = []
        for s in dict.fromkeys(cols["shard"]):  # a block holds one shard's rows; any number is handled
            mine = [i for i, x in enumerate(cols["shard"]) if x == s]
            body = [i for i in mine if not cols["end"][i]]
            for i in mine:
                if cols["end"][i]:  # sentinel: the shard has this many items
                    manifest.append(_manifest(s, self.model_index, -1, -1, 0, end=cols["pos"][i]))
            if not body:
                continue
            first = cols["pos"][body[0]]
            if [cols["pos"][i] for i in body] != list(range(first, first + len(body))):
                raise RuntimeError(f"block of shard {s} is not contiguous")  # a bug, never user input
            items = [pickle.loads(cols["item"][i]) for i in body]
            folder = parts_folder(self.out, self.names[s])
            for k, name in enumerate(self.metrics):
                rows, fatal = score_block(items, self.encoder, get_metric(name), medium="image",
                                          prefix=self.prefixes[name], options=self.options.get(name, {}),
                                          skip_bad=True)
                if fatal is not None:
                    raise fatal
                rows = [_clean(r | {"model": self.model, "metric": name}, self.columns) for r in rows]
                write_part(folder / part_name(self.model_index, k, first, len(rows), self.fmt), rows,
                           self.fmt, self.columns)
                scores = [r["score"] for r in rows if r["score"] is not None]
                error = next((r["error"] for r in rows if r["error"] is not None), None)
                manifest.append(_manifest(s, self.model_index, k, first, len(rows), scored=len(scores),
                                          total=math.fsum(scores), skipped=len(rows) - len(scores), error=error))
        return _manifest_table(manifest)


MANIFEST = ("shard", "model", "metric", "first", "n", "end", "scored", "sum", "skipped", "error")


def _manifest(shard, model, metric, first, n, *, end=-1, scored=0, total=0.0, skipped=0, error=None) -> tuple:
    return (shard, model, metric, first, n, end, scored, total, skipped, error)


def _manifest_table(rows: list[tuple]):
    import pyarrow as pa

    types = (pa.int64(),) * 7 + (pa.float64(), pa.int64(), pa.string())
    data = list(zip(*rows)) if rows else [()] * len(MANIFEST)
    return pa.table({c: pa.array(list(v), t) for c, v, t in zip(MANIFEST, data, types)})


def _clean(row: dict, columns: tuple) -> dict:
    """The row's columns, with non-finite numbers as None (as the single-process writer never sees them)."""
    from capscore.report.writers import TEXT_COLUMNS

    out = {}
    for c in columns:
        v = row.get(c)
        out[c] = v if c in TEXT_COLUMNS or v is None or math.isfinite(v) else None
    return out


# ------------------------------------------------------------------------------------ part files and commits
def parts_folder(out: Path, name: str) -> Path:
    return Path(out) / SIDECAR_DIR / PARTS_DIR / name


def part_name(model: int, metric: int, first: int, n: int, fmt: str) -> str:
    """``m<model>-k<metric>-<first position>-<rows>.<fmt>``: a block re-run writes the same name."""
    return f"m{model}-k{metric}-{first:012d}-{n}.{fmt}"


def _parse_part(name: str):
    stem, _, _ = name.partition(".")
    try:
        m, k, first, n = stem.split("-")
        return int(m[1:]), int(k[1:]), int(first), int(n)
    except ValueError:
        return None


def _schema(columns: tuple):
    import pyarrow as pa

    from capscore.report.writers import TEXT_COLUMNS

    return pa.schema([(c, pa.string() if c in TEXT_COLUMNS else pa.float64()) for c in columns])


def write_part(path: Path, rows: list[dict], fmt: str, columns: tuple) -> None:
    """Write ``rows`` to ``path`` atomically (a unique temporary name, then a rename): a re-run of the same
    block replaces the file with identical content. JSONL/CSV parts are written by the single-process
    engine's :class:`~capscore.report.writers.RowWriter` (CSV without header: the commit adds one)."""
    import uuid

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            # no fsync: a part outlives no crash (the next run removes the parts of uncommitted shards);
            # the commit fsyncs the shard file it makes from them
            pq.write_table(pa.Table.from_pylist(rows, schema=_schema(columns)), tmp)
        else:
            from capscore.report.writers import RowWriter

            w = RowWriter(tmp, fmt, existing=True, columns=columns)  # existing: no CSV header in a part
            w.write(rows)
            w.close(complete=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_shard(out: str, name: str, fmt: str, columns: tuple, n_models: int, n_metrics: int, meta: dict) -> dict:
    """Ray task: the shard file ``out/<name>.<fmt>`` from its part files, (model, metric) after (model,
    metric), each in position order; sidecar first (it names the file and its row count), then the file
    (temporary name, fsync, rename), then the parts are removed. Returns the sidecar."""
    import shutil

    out = Path(out)
    folder = parts_folder(out, name)
    final = out / f"{name}.{fmt}"
    if not folder.is_dir() and final.is_file() and _load_json(out / SIDECAR_DIR / f"{name}.json") == meta:
        return meta  # a retry of a commit that finished: nothing left to do
    found: dict[tuple, dict[int, tuple[int, Path]]] = {}
    for p in folder.iterdir() if folder.is_dir() else ():
        parsed = _parse_part(p.name) if not p.name.startswith(".") else None
        if parsed is not None:
            m, k, first, n = parsed
            found.setdefault((m, k), {})[first] = (n, p)
    ordered: list[Path] = []
    for m in range(n_models):
        for k in range(n_metrics):
            chain, pos = found.get((m, k), {}), 0
            while pos < meta["items"]:
                if pos not in chain:  # a bug, never user input: the driver saw every part's manifest
                    raise RuntimeError(f"shard {name}: no part of model {m}, metric {k} at position {pos}")
                n, p = chain[pos]
                ordered.append(p)
                pos += n
    side = out / SIDECAR_DIR / f"{name}.json"
    _write_text(side, json.dumps(meta, indent=1) + "\n")
    tmp = out / f".{name}.{fmt}.tmp"
    if fmt == "parquet":
        import pyarrow.parquet as pq

        schema = _schema(columns)
        with pq.ParquetWriter(tmp, schema) as w:
            for p in ordered:
                w.write_table(pq.read_table(p, schema=schema))
            if not ordered:
                w.write_table(schema.empty_table())
    else:
        with open(tmp, "wb") as f:
            if fmt == "csv":
                import csv
                import io

                head = io.StringIO()
                csv.writer(head, lineterminator="\n").writerow(columns)
                f.write(head.getvalue().encode("utf-8"))
            for p in ordered:
                with open(p, "rb") as part:
                    shutil.copyfileobj(part, f, 1 << 20)
    _fsync(tmp)
    os.replace(tmp, final)
    shutil.rmtree(folder, ignore_errors=True)
    return meta


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = path.with_name(path.name + ".tmp")
    t.write_text(text, encoding="utf-8")
    os.replace(t, path)


# ------------------------------------------------------------------------------------ the driver
def shard_output_name(shard: Shard) -> str:
    """``<stem>-<first 8 hex digits of sha1(absolute path)>``: a function of the shard alone, never of the
    other shards of the run (``shards/00000.tar`` -> ``00000-3f2a…``; ``a/x.tar`` and ``b/x.tar`` differ)."""
    path = os.path.abspath(shard.path)
    stem = Path(path).name.split(".")[0] or "shard"
    return f"{stem}-{hashlib.sha1(os.fsencode(path)).hexdigest()[:8]}"


def output_names(shards: list[Shard]) -> list[str]:
    """Each shard's output name (:func:`shard_output_name`); the k-th time (k ≥ 2) the same file is listed,
    ``~k`` is added, so a shard given twice gives two files of the same rows, as the single-process engine
    gives those rows twice."""
    seen: dict[str, int] = {}
    names = []
    for s in shards:
        base = shard_output_name(s)
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}~{seen[base]}")
    return names


class ShardOutputs:
    """``DIR/<name>.<fmt>`` + its sidecar ``DIR/_shards/<name>.json``; parts in ``DIR/_shards/parts/<name>/``."""

    def __init__(self, out: Path, fmt: str, config: dict, columns: tuple):
        self.out, self.fmt, self.config, self.columns = out, fmt, config, columns

    def path(self, name: str) -> Path:
        return self.out / f"{name}.{self.fmt}"

    def sidecar(self, name: str) -> Path:
        return self.out / SIDECAR_DIR / f"{name}.json"

    def existing(self) -> dict[str, Path]:
        """Sidecars in the folder, by output name."""
        if not self.out.is_dir():
            return {}
        return {p.name[: -len(".json")]: p for p in sorted(self.out.glob(f"{SIDECAR_DIR}/*.json"))}

    def remove(self, name: str) -> None:
        """The output of ``name``: its file (the one its sidecar names, if in this folder), sidecar and parts."""
        import shutil

        side = self.sidecar(name)
        meta = _load_json(side)
        files = {self.path(name)}
        if isinstance(meta, dict) and isinstance(meta.get("file"), str):
            files.add(self.out / meta["file"])
        for q in files:
            if q.parent == self.out and q.is_file():
                q.unlink()
        side.unlink(missing_ok=True)
        shutil.rmtree(parts_folder(self.out, name), ignore_errors=True)

    def clear(self) -> None:
        import shutil

        for name in self.existing():
            self.remove(name)
        shutil.rmtree(self.out / SIDECAR_DIR / PARTS_DIR, ignore_errors=True)

    def done(self, name: str, shard: Shard) -> dict | None:
        """The sidecar of a complete, valid output of this shard from this configuration, else None."""
        meta = _load_json(self.sidecar(name))
        if (not isinstance(meta, dict) or meta.get("config") != self.config or meta.get("file") != self.path(name).name
                or meta.get("input") != shard.fingerprint()):
            return None
        try:
            rows = _count_rows(self.path(name))
        except Exception:  # unreadable, missing or half-written: redo it
            return None
        return meta if rows == meta.get("rows") else None

    def changed_setting(self, name: str) -> str | None:
        """The first configuration key whose value differs in ``name``'s sidecar, as a phrase (or None)."""
        meta = _load_json(self.sidecar(name))
        before = meta.get("config") if isinstance(meta, dict) else None
        if not isinstance(before, dict):
            return None
        for key, now in self.config.items():
            if before.get(key) != now:
                return f"{key} was {before.get(key)!r} in the earlier run and is {now!r} now"
        return None


def _load_json(p: Path):
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _count_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    from capscore.report.writers import read_rows

    columns = ("id",)  # any column read back proves the record complete
    if path.suffix == ".csv":
        import csv

        with open(path, encoding="utf-8", newline="") as f:
            return sum(1 for _ in csv.DictReader(f))
    return sum(1 for _ in read_rows(path, columns))


TASK_CPUS = 0.5  # logical CPUs a read or decode task reserves


def actor_cpus(cluster_cpus: float, workers: int, threads: int) -> float:
    """Logical CPUs each encoder actor reserves: its thread count, unless the actors would then take every CPU.

    Ray schedules on logical CPUs: actors holding all of them would leave no
    room for a single read/decode task and the pipeline would wait forever.
    When ``workers × threads`` does not leave ``TASK_CPUS`` free, each actor
    reserves its share of what does (the OS then shares the cores between
    actor threads and decode tasks, as the single-process engine shares them
    between its encoder and its reader threads).
    """
    room = (cluster_cpus - TASK_CPUS) / workers
    return float(threads) if threads <= room else max(0.01, round(room, 2))


def default_workers(device: str, cpus: float, gpus: float, gpus_per_worker: float, threads: int) -> int:
    if device.startswith("cuda"):
        return max(1, int(gpus // max(gpus_per_worker, 1e-9)))
    return max(1, int(cpus // (2 * threads)))


@dataclass(frozen=True)
class RayOptions:
    """Where the Ray engine runs and writes: the cluster, the actor pool, the output folder (score only)."""

    out: str = ""
    address: str | None = None
    workers: int | None = None
    gpus_per_worker: float = 1.0
    threads_per_worker: int = 1
    out_format: str = "parquet"
    resume: bool = False
    overwrite: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        for name in ("threads_per_worker",):
            if getattr(self, name) < 1:
                raise CapscoreError(f"The {name!r} parameter must be a positive integer; got {getattr(self, name)}")
        if self.workers is not None and self.workers < 1:
            raise CapscoreError(f"The 'workers' parameter must be a positive integer; got {self.workers}")
        if self.gpus_per_worker <= 0:
            raise CapscoreError(f"The 'gpus_per_worker' parameter must be positive; got {self.gpus_per_worker}")
        if self.resume and self.overwrite:
            raise OptionError("{resume} and {overwrite} contradict each other; choose one")


FILE_SUFFIXES = (".jsonl", ".csv", ".parquet", ".json")


def run_score(job, *, ray: RayOptions) -> int:
    """Score a :class:`capscore.pipeline.ScoreJob` whose source is sharded on a Ray cluster: one file per input
    shard under ``ray.out`` (a folder), rows as the single-process engine writes them (model and metric
    included). See the module docstring."""
    from capscore.report.writers import OutputLock

    source = job.source
    out = Path(ray.out)
    if out.suffix.lower() in FILE_SUFFIXES and not out.is_dir():
        raise CapscoreError(f"the Ray engine writes one file per input shard, so its output is a folder; "
                            f"{out} names a {out.suffix} file — give a folder such as {out.with_suffix('')}/")
    if out.exists() and not out.is_dir():
        raise CapscoreError(f"the Ray engine writes one file per input shard into a folder; {out} is a file")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CapscoreError(f"{out}: cannot create the output folder ({e.strerror or e})") from None
    try:
        lock = OutputLock(out / "_run")  # DIR/_run.lock, held until the summary is written
    except CapscoreError as e:
        if "another capscore process" not in str(e):
            raise
        raise CapscoreError(f"{out} is being written by another capscore process (it holds {out / '_run.lock'}); "
                            "wait for it to finish, then resume if needed") from None
    try:
        if ShardOutputs(out, ray.out_format, {}, ()).existing() and not (ray.resume or ray.overwrite):
            raise OptionError(f"{_braced(out)} already holds shard outputs; use {{resume}} to continue that run or "
                              "{overwrite} to replace it")
        return _run_locked(job, ray, out.resolve(), source)
    finally:
        lock.release()
        if created:
            try:
                out.rmdir()  # a first run that failed before writing anything leaves no empty folder
            except OSError:
                pass


def _braced(value) -> str:
    return str(value).replace("{", "{{").replace("}", "}}")


def _run_locked(job, ray: RayOptions, out: Path, source) -> int:
    import shutil

    from capscore.backbones import load_backbone
    from capscore.pipeline import check_fit, columns_for, write_json
    from capscore.scores.metric import get_metric
    from PIL import Image

    ray_mod = require_ray()
    enc = job.encoding
    cuda = enc.device.startswith("cuda")
    models = list(dict.fromkeys(str(m) for m in job.models))  # a model named twice is scored once, as locally
    metrics = {n: get_metric(n) for n in job.metrics}
    for name, m in metrics.items():
        if "corpus" in m.needs("image"):  # its statistics come from the whole evaluated set, not one block
            raise CapscoreError(f"metric {name} needs statistics over the whole evaluated set, which the Ray "
                                "engine (block by block) does not have; score it with the local engine")
    prefixes = {n: m.prefix_for("image", job.prefix) for n, m in metrics.items()}
    options = {n: ({"abe": dict(job.options["abe"])} if n == "abe" and job.options.get("abe") else {})
               for n in metrics}
    columns = columns_for("image", metrics.values())
    # The driver loads each backbone once on the CPU: its identity keys the output, its preprocessing (without
    # the networks) runs in the CPU tasks. The actors load their own copy on the job's device.
    light, identities, shapes = [], [], []
    for model in models:
        backbone = load_backbone(model, device="cpu", dtype="fp32", seed=enc.seed, context_length=enc.context_length,
                                 trust_remote_code=enc.trust_remote_code, rgb_order=enc.rgb_order)
        for m in metrics.values():
            check_fit(m, backbone)
        identities.append(backbone.identity if enc.dtype == "fp32" else f"{backbone.identity}|{enc.dtype}")
        shapes.append(tuple(backbone.preprocess(Image.new("RGB", (8, 8))).shape))
        light.append(preprocess_only(backbone))
        del backbone
    one = lambda xs: xs[0] if len(xs) == 1 else xs  # noqa: E731
    config = {"model": one(models), "backbone": one(identities), "metric": one(list(metrics)),
              "prefix": prefixes[job.metrics[0]] if len(set(prefixes.values())) == 1 else prefixes,
              "source": source.kind, "options": source.options.__dict__, "format": ray.out_format}
    if "abe" in metrics:
        config["abe"] = options["abe"].get("abe", {})
    state = ShardOutputs(out, ray.out_format, config, columns)
    shards = list(source.shards)
    names = output_names(shards)
    current = set(names)
    existing = state.existing()
    if existing and not ray.resume:  # --overwrite (run_score refused the rest)
        state.clear()
        existing = {}
    for name in existing:
        if name in current and (why := state.changed_setting(name)) is not None:
            raise OptionError(f"{{resume}}: {_braced(out)}: {_braced(why)}; use the same settings, or {{overwrite}} "
                              "to start again")
    orphans = [n for n in existing if n not in current]
    for name in orphans:  # shards no longer in the input: their rows leave the folder
        state.remove(name)
    finished = {}
    for name, shard in zip(names, shards):
        if name in existing and (meta := state.done(name, shard)) is not None:
            finished[name] = meta
    todo = [(name, shard) for name, shard in zip(names, shards) if name not in finished]
    for name, _ in todo:
        state.remove(name)  # a stale or partial output never stays beside the new one
    shutil.rmtree(out / SIDECAR_DIR / PARTS_DIR, ignore_errors=True)  # parts of an interrupted run
    for p in [*out.glob(".*.tmp"), *out.glob(f"{SIDECAR_DIR}/*.json.tmp")]:  # a commit killed mid-write
        p.unlink(missing_ok=True)
    spath = out / "_summary.json"
    write_json(spath, {"status": "running", "engine": "ray", **config, **source.describe()})
    t0 = time.perf_counter()
    metas = dict(finished)
    if todo:
        _init(ray_mod, ray)
        res = ray_mod.cluster_resources()
        threads = ray.threads_per_worker
        workers = ray.workers or default_workers(enc.device, res.get("CPU", 1), res.get("GPU", 0),
                                                 ray.gpus_per_worker, threads)
        tracker = Tracker([n for n, _ in todo], [s for _, s in todo], state, n_models=len(models),
                          n_metrics=len(metrics), skip_bad=job.skip_bad, models=models, metrics=list(metrics))
        tracker.committer = ray_mod.remote(num_cpus=0, max_retries=3)(commit_shard)
        for mi, model in enumerate(models):
            actor_args = dict(model=model, model_index=mi, encoding=enc, metrics=tuple(metrics), prefixes=prefixes,
                              options=options, columns=columns, threads=threads, pixel_shape=shapes[mi],
                              out=str(out), fmt=ray.out_format, names=tuple(n for n, _ in todo))
            ds = build_pipeline(ray_mod, [s for _, s in todo], source.options, light[mi], actor_args=actor_args,
                                workers=workers, gpus_per_worker=ray.gpus_per_worker if cuda else 0)
            tracker.run(ds, ray_mod)
        metas.update(tracker.finish(ray_mod))
    elapsed = time.perf_counter() - t0
    runs = _runs(metas, models, identities, list(metrics))
    scored = sum(m["scored"] for m in metas.values())
    skipped = sum(m["skipped"] for m in metas.values())
    result = {"status": "complete", "engine": "ray", **config, **source.describe(), "count": scored,
              "skipped": skipped, "mean": runs[0]["mean"] if len(runs) == 1 else None,
              **({"runs": runs} if len(runs) > 1 else {}), "shards": len(shards), "shards_resumed": len(finished),
              "orphans_removed": len(orphans), "files": [f"{n}.{ray.out_format}" for n in names],
              "seconds": round(elapsed, 3)}
    write_json(spath, result)
    for r in runs:
        m = "n/a" if r["mean"] is None else f"{r['mean']:.4f}"
        print(f"{r['metric']} with {r['model']}: {r['count']} scored, {r['skipped']} skipped, mean {m}")
    print(f"{len(shards)} shards, {len(finished)} already done"
          + (f", {len(orphans)} outputs of shards no longer given removed" if orphans else "")
          + f"; rows: {out}/<shard>-<hash>.{ray.out_format}  summary: {spath}", file=sys.stdout)
    return 0


def _runs(metas: dict, models: list, identities: list, metrics: list) -> list[dict]:
    """Count, mean and skipped per (model, metric) over every shard's sidecar."""
    acc = {(m, k): [0, [], 0] for m in models for k in metrics}
    for meta in metas.values():
        for r in meta.get("runs", ()):
            a = acc.get((r["model"], r["metric"]))
            if a is not None:
                a[0] += r["scored"]
                a[1].append(r["sum"])
                a[2] += r["skipped"]
    out = []
    for (m, k), (n, sums, skipped) in acc.items():
        out.append({"model": m, "backbone": identities[models.index(m)], "metric": k, "count": n,
                    "mean": math.fsum(sums) / n if n else None, "skipped": skipped})
    return out


class Tracker:
    """The driver's view of a run: manifest rows in, commit tasks out. It holds, per shard in flight, one
    small entry per block until that (model, metric)'s blocks cover the shard, then only its totals; a
    shard whose every (model, metric) is covered is committed by a Ray task (:func:`commit_shard`) and
    forgotten. Blocks are keyed by their first position, so a block reported twice (a retried task)
    counts once."""

    def __init__(self, names: list, shards: list, state: ShardOutputs, *, n_models: int, n_metrics: int,
                 skip_bad: bool, models: list, metrics: list):
        self.names, self.state, self.skip_bad = names, state, skip_bad
        self.fingerprints = [s.fingerprint() for s in shards]  # taken before reading: a change meanwhile redoes it
        self.n_models, self.n_metrics, self.models, self.metrics = n_models, n_metrics, models, metrics
        self.items: dict[int, int] = {}
        self.blocks: dict[tuple, dict[int, tuple]] = {}
        self.front: dict[tuple, int] = {}
        self.totals: dict[int, dict[tuple, tuple]] = {}
        self.pending: list = []
        self.metas: dict[str, dict] = {}
        self.committer = None

    def run(self, ds, ray) -> None:
        try:
            for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                for row in batch.to_pylist():
                    self.add(row, ray)
                self._reap(ray, block=False)
        except Exception as e:
            raise _user_error(e) from None

    def add(self, row: dict, ray) -> None:
        s, m = row["shard"], row["model"]
        if row["end"] >= 0:
            self.items[s] = row["end"]
            ks = range(self.n_metrics)
        else:
            if row["error"] is not None and not self.skip_bad:
                raise CapscoreError(row["error"])
            self.blocks.setdefault((s, m, row["metric"]), {})[row["first"]] = (
                row["n"], row["scored"], row["sum"], row["skipped"])
            ks = (row["metric"],)
        if s not in self.items:
            return
        for k in ks:
            self._check(s, m, k)
        if len(self.totals.get(s, ())) == self.n_models * self.n_metrics:
            self._commit(s, ray)

    def _check(self, s: int, m: int, k: int) -> None:
        done = self.totals.setdefault(s, {})
        if (m, k) in done:
            return
        chain = self.blocks.get((s, m, k), {})
        pos = self.front.get((s, m, k), 0)  # positions before it are covered: walk on from there
        while pos < self.items[s] and pos in chain:
            pos += chain[pos][0]
        self.front[(s, m, k)] = pos
        if pos == self.items[s]:
            used, p = [], 0
            while p < pos:
                used.append(chain[p])
                p += chain[p][0]
            done[(m, k)] = (sum(u[1] for u in used), math.fsum(u[2] for u in used), sum(u[3] for u in used))
            self.blocks.pop((s, m, k), None)
            self.front.pop((s, m, k), None)

    def _commit(self, s: int, ray) -> None:
        totals = self.totals.pop(s)
        items = self.items.pop(s)
        runs = [{"model": self.models[m], "metric": self.metrics[k], "scored": t[0], "sum": t[1], "skipped": t[2]}
                for (m, k), t in sorted(totals.items())]
        name = self.names[s]
        meta = {"config": self.state.config, "input": self.fingerprints[s], "file": self.state.path(name).name,
                "items": items, "rows": items * self.n_models * self.n_metrics,
                "scored": sum(r["scored"] for r in runs), "sum": math.fsum(r["sum"] for r in runs),
                "skipped": sum(r["skipped"] for r in runs), "runs": runs}
        self.pending.append((name, self.committer.remote(str(self.state.out), name, self.state.fmt,
                                                         self.state.columns, self.n_models, self.n_metrics, meta)))

    def _reap(self, ray, *, block: bool) -> None:
        if not self.pending:
            return
        refs = [r for _, r in self.pending]
        ready, _ = ray.wait(refs, num_returns=len(refs) if block else len(refs), timeout=None if block else 0)
        ready = set(ready)
        keep = []
        for name, ref in self.pending:
            if ref in ready:
                self.metas[name] = ray.get(ref)
            else:
                keep.append((name, ref))
        self.pending = keep

    def finish(self, ray) -> dict:
        try:
            self._reap(ray, block=True)
        except Exception as e:
            raise _user_error(e) from None
        missing = [n for n in self.names if n not in self.metas]
        if missing:  # a bug, never user input: Ray returned fewer manifests than the readers produced
            raise RuntimeError(f"Ray pipeline ended with incomplete shards: {missing[:5]}")
        return self.metas


def _init(ray, opts):
    """Join (or start) the cluster named by ``opts.address`` (RayOptions, or the CLI's options for probe and
    correlate), quietly when ``opts.quiet``."""
    from ray.data import DataContext

    quiet = getattr(opts, "quiet", False)
    if quiet:  # -q: no Ray Data INFO/WARNING lines ("execution finished in …", "Progress bars disabled"),
        import logging  # and no C++ core-worker notices (read at ray.init); failures still raise

        logging.getLogger("ray.data").setLevel(logging.ERROR)
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    if not ray.is_initialized():
        try:
            ray.init(address=opts.address, include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR", configure_logging=True)
        except ConnectionError as e:
            raise CapscoreError(f"address {opts.address}: cannot connect to a Ray cluster ({e})") from None
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = not quiet
    ctx.print_on_execution_start = False
    ctx.verbose_stats_logs = False
    return ctx


def preprocess_only(backbone):
    """A copy of ``backbone`` without its networks: what the CPU tasks need to run ``preprocess``.

    Shipping ``backbone.preprocess`` as is would pickle the whole model into
    every read task (580 MB for a ViT-B/32); the transforms alone are a few KB.
    """
    import copy

    import torch

    from capscore.backbones.base import Backbone

    light = copy.copy(backbone)
    for name, value in vars(backbone).items():
        if isinstance(value, torch.nn.Module):
            setattr(light, name, None)
        elif isinstance(value, Backbone):  # a composite (mclip: a text student + an image tower)
            setattr(light, name, preprocess_only(value))
    return light


def build_pipeline(ray, shards: list[Shard], options, light_backbone, *, actor_args: dict, workers: int,
                   gpus_per_worker: float):
    """The Ray Dataset: one row per shard -> read -> prepare -> score (lazy; nothing runs until iterated)."""
    # from_items builds the shard list on the driver: no read task, which would want a whole CPU
    ds = ray.data.from_items([{"id": i} for i in range(len(shards))], override_num_blocks=len(shards))
    ds = ds.map_batches(read_blocks, batch_size=1, batch_format="pyarrow", zero_copy_batch=True,
                        fn_kwargs={"shards": shards, "options": options}, num_cpus=TASK_CPUS)
    ds = ds.map_batches(prepare_block, batch_size=None, batch_format="pyarrow", zero_copy_batch=True,
                        fn_kwargs={"backbone": light_backbone}, num_cpus=TASK_CPUS)
    return ds.map_batches(ScoreActor, fn_constructor_kwargs=actor_args, batch_size=None, batch_format="pyarrow",
                          compute=ray.data.ActorPoolStrategy(size=workers),
                          num_cpus=actor_cpus(ray.cluster_resources().get("CPU", 1), workers, actor_args["threads"]),
                          num_gpus=gpus_per_worker)


def _user_error(e: Exception) -> Exception:
    """A CapscoreError raised inside a Ray task arrives wrapped (RayTaskError, with the traceback in its text):
    find the original and re-raise its one line."""
    seen: BaseException | None = e
    for _ in range(10):
        if seen is None:
            break
        if isinstance(seen, CapscoreError) and "RayTaskError" not in type(seen).__name__:
            return CapscoreError(str(seen))
        seen = getattr(seen, "cause", None) or seen.__cause__
    return e


# ------------------------------------------------------------------------------------ probe / correlate
class _EncodeWorker:
    """A Ray actor holding one backbone and a local Encoder (in-memory cache), encoding what it is sent."""

    def __init__(self, *, model, device, dtype, seed, context_length, trust_remote_code, batch_size, threads):
        import torch

        from capscore.backbones import load_backbone
        from capscore.embed.engine import Encoder, MemoryCache

        torch.set_num_threads(threads)
        bb = load_backbone(model, device=device, dtype=dtype, seed=seed, context_length=context_length,
                           trust_remote_code=trust_remote_code)
        self.encoder = Encoder(bb, batch_size=batch_size, cache=MemoryCache(max_items=1), workers=threads)

    def identity(self) -> str:
        return self.encoder.backbone.identity

    def texts(self, texts):
        return self.encoder.encode_texts(texts).numpy()

    def images(self, refs):
        errors: dict[int, str] = {}
        return self.encoder.encode_images(refs, errors=errors).numpy(), errors


def _encoder_class():
    from capscore.embed.cache import cache_key
    from capscore.embed.engine import Encoder
    from capscore.data.images import ImageRef
    from capscore.errors import InputError

    class RayEncoder(Encoder):
        """An :class:`Encoder` whose missing vectors are computed by a pool of Ray actors.

        ``encode_texts``/``encode_images`` first send the unique inputs the
        cache lacks to the actors in blocks (one backbone per actor, loaded
        once, restarted and retried by Ray if it dies), put the vectors they
        return into this encoder's cache, then run the ordinary method, which
        finds them all there. Failures (a bad image) are left to the ordinary
        method, so errors read exactly as with the single-process engine.
        Per-token/patch features (ABE-CLIP) stay local. Ray core actors rather
        than Ray Data here: probes call the encoder many times, and one pool
        that lives as long as the encoder avoids reloading the model per call.
        """

        def __init__(self, backbone, *, ray_args, **kw):
            super().__init__(backbone, **kw)
            self._ray_args = ray_args
            self._pool = None

        def _actors(self):
            if self._pool is None:
                ray = require_ray()
                a = self._ray_args
                _init(ray, a["cli"])
                res = ray.cluster_resources()
                cuda = a["device"].startswith("cuda")
                workers = a["workers"] or default_workers(a["device"], res.get("CPU", 1), res.get("GPU", 0),
                                                          a["gpus_per_worker"], a["threads"])
                cls = ray.remote(_EncodeWorker).options(
                    num_cpus=actor_cpus(res.get("CPU", 1) + TASK_CPUS, workers, a["threads"]),
                    num_gpus=a["gpus_per_worker"] if cuda else 0, max_restarts=-1, max_task_retries=-1)
                kw = {k: a[k] for k in ("model", "device", "dtype", "seed", "context_length", "trust_remote_code",
                                         "batch_size", "threads")}
                actors = [cls.remote(**kw) for _ in range(workers)]
                ids = set(ray.get([x.identity.remote() for x in actors]))
                if ids != {self.backbone.identity}:  # a bug, never user input: the actors loaded other weights
                    raise RuntimeError(f"Ray actors loaded {ids}, the driver {self.backbone.identity}")
                self._pool = ray.util.ActorPool(actors)
            return self._pool

        def _blocks(self, items):
            size = 4 * self.batch_size
            return [items[i: i + size] for i in range(0, len(items), size)]

        def encode_texts(self, texts):
            uniq = [t for t in dict.fromkeys(texts) if isinstance(t, str)]
            keys = [cache_key(self.backbone.identity, "text", t) for t in uniq]
            found = self.cache.get_many(keys)
            missing = [(k, t) for k, t in zip(keys, uniq) if k not in found]
            if missing:
                pool = self._actors()
                blocks = self._blocks(missing)
                for block, vecs in zip(blocks, pool.map(lambda a, b: a.texts.remote([t for _, t in b]), blocks)):
                    self.cache.put_many((k, v) for (k, _), v in zip(block, vecs))
            return super().encode_texts(texts)

        def encode_images(self, images, *, errors=None):
            refs = [ImageRef.of(x) for x in images]
            todo: dict[bytes, ImageRef] = {}
            for r in dict((r.identity_hint(), r) for r in refs).values():
                try:
                    todo[cache_key(self.backbone.identity, "image", r.read()[0])] = r
                except InputError:
                    pass  # reported by the ordinary method below
            found = self.cache.get_many(list(todo))
            missing = [(k, r) for k, r in todo.items() if k not in found]
            if missing:
                pool = self._actors()
                blocks = self._blocks(missing)
                for block, (vecs, errs) in zip(blocks, pool.map(
                        lambda a, b: a.images.remote([r for _, r in b]), blocks)):
                    self.cache.put_many((k, v) for j, ((k, _), v) in enumerate(zip(block, vecs)) if j not in errs)
            return super().encode_images(images, errors=errors)

    return RayEncoder


def make_encoder(backbone, *, spec: str, ray: RayOptions | None = None, device: str = "cpu", dtype: str = "fp32",
                 seed: int = 0, context_length: int | None = None, trust_remote_code: bool = False, **kw):
    """``Encoder(backbone, **kw)``, or its Ray version when ``ray`` options are given (probe, correlate);
    ``spec`` is the model name the backbone was loaded from (the actors load it again)."""
    from capscore.embed.engine import Encoder

    if ray is None:
        return Encoder(backbone, **kw)
    require_ray()
    ray_args = {"cli": ray, "model": spec, "device": device, "dtype": dtype, "seed": seed, "context_length": context_length,
                "trust_remote_code": trust_remote_code, "batch_size": kw.get("batch_size", 64),
                "threads": ray.threads_per_worker, "workers": ray.workers, "gpus_per_worker": ray.gpus_per_worker}
    return _encoder_class()(backbone, ray_args=ray_args, **kw)
