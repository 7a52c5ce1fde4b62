"""``--engine ray``: the single-process scorer's per-block functions as a Ray Data pipeline.

::

    shards ──read (CPU task, capscore.data.shards.read_shard)──▶ blocks of pickled items
           ──decode + preprocess (CPU task, ImageRef.read/decode + backbone.preprocess)──▶ + pixels
           ──encode + metric (actor pool: one backbone per actor, loaded once)──▶ result rows
           ──driver: gather rows by shard, write DIR/<shard>.<fmt> atomically + a sidecar

Nothing is implemented twice. The read tasks call the same reader as the
single-process engine; the CPU tasks call :meth:`ImageRef.read`,
:meth:`ImageRef.decode` and the backbone's ``preprocess``; each actor holds an
:class:`~capscore.embed.engine.Encoder`, puts the shipped pixels into its
cache with :meth:`Encoder.encode_pixels`, and then scores the block with the
very chunk scorer of ``capscore score`` (``score_records`` for the CLIP-S
family, the ABE-CLIP pair scorer otherwise) — which finds every image vector
in the cache and encodes the block's unique texts. Rows are therefore the
rows of the single-process engine; only the batch composition differs, which
moves fp32 scores by float rounding (≤ 1e-6, tested).

Exactly once. Every row carries (shard, position); each shard ends with a
sentinel row carrying its item count. The driver keeps rows by (shard,
position), so a block re-run after a killed actor (Ray restarts actors and
retries their tasks) cannot duplicate a row, and writes a shard only when all
of its positions are in: to a temporary name, renamed, then a sidecar
``DIR/_shards/<shard>.json`` records the run configuration, the input's size and
mtime and the row count. ``--resume`` skips a shard whose sidecar matches and
whose file has that many rows; anything else is redone.

What is shared: the input shards (every node must see the paths: a shared or
object-store-mounted file system) and the output folder (written by the
driver only). What is not: backbones (one per actor), the embedding cache
(per actor in memory; with ``--cache-dir`` each actor opens the SQLite file at
that path *on its own node* — SQLite serialises writers on one node, so keep
it on local disk, never on NFS). See docs/scale.md.
"""
from __future__ import annotations

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
    (:func:`capscore.pipeline.score_block`) for every metric of the job."""

    def __init__(self, *, model: str, encoding, metrics: tuple, prefixes: dict, options: dict, columns: tuple,
                 threads: int, pixel_shape):
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
        self.model, self.metrics, self.prefixes, self.options = model, metrics, prefixes, options
        self.columns = columns
        self.pixel_shape = tuple(pixel_shape)

    def __call__(self, batch):
        import pyarrow as pa
        import torch

        from capscore.pipeline import score_block
        from capscore.scores.metric import get_metric

        cols = {c: batch.column(c).to_pylist() for c in ("shard", "pos", "end", "item", "key", "px")}
        have = [i for i, px in enumerate(cols["px"]) if px]
        self.encoder.encode_pixels(
            [cols["key"][i] for i in have],
            [torch.from_numpy(np.frombuffer(cols["px"][i], dtype=np.float32).reshape(self.pixel_shape)) for i in have])
        body = [i for i, end in enumerate(cols["end"]) if not end]
        items = [pickle.loads(cols["item"][i]) for i in body]
        out = {c: [] for c in ("shard", "pos", "end", *self.columns)}
        for name in self.metrics:
            rows, fatal = score_block(items, self.encoder, get_metric(name), medium="image",
                                      prefix=self.prefixes[name], options=self.options.get(name, {}), skip_bad=True)
            if fatal is not None:
                raise fatal
            for i, row in zip(body, rows):
                _append(out, cols, i, row | {"model": self.model, "metric": name}, self.columns)
        for i, end in enumerate(cols["end"]):
            if end:
                _append(out, cols, i, dict.fromkeys(self.columns), self.columns)
        numbers = {c: pa.array(out[c], pa.float64()) for c in self.columns if c not in TEXT}
        return pa.table({**out, **numbers})


TEXT = ("id", "image", "caption", "system", "model", "metric", "error")


def _append(out, cols, i, row, columns):
    for c in ("shard", "pos", "end"):
        out[c].append(cols[c][i])
    for c in columns:
        v = row.get(c)
        out[c].append(v if c in TEXT or v is None or math.isfinite(v) else None)


# ------------------------------------------------------------------------------------ the driver
class ShardOutputs:
    """``DIR/<shard>.<fmt>`` + ``DIR/_shards/<shard>.json``: written atomically, validated on resume."""

    def __init__(self, out: Path, fmt: str, config: dict, columns: tuple):
        self.out, self.fmt, self.config, self.columns = out, fmt, config, columns

    def path(self, shard: Shard) -> Path:
        return self.out / f"{shard.name}.{self.fmt}"

    def sidecar(self, shard: Shard) -> Path:
        return self.out / SIDECAR_DIR / f"{shard.name}.json"

    def existing(self) -> list[Path]:
        return sorted(self.out.glob(f"{SIDECAR_DIR}/*.json")) if self.out.is_dir() else []

    def clear(self) -> None:
        for p in self.existing():
            data = _load_json(p) or {}
            for q in (p, self.out / str(data.get("file", ""))):
                if q.is_file() and q.parent in (self.out, self.out / SIDECAR_DIR):
                    q.unlink()

    def done(self, shard: Shard) -> dict | None:
        """The sidecar of a complete, valid output of this shard from this configuration, else None."""
        meta = _load_json(self.sidecar(shard))
        if not meta or meta.get("config") != self.config or meta.get("input") != shard.fingerprint():
            return None
        path = self.path(shard)
        try:
            rows = _count_rows(path)
        except Exception:  # unreadable or half-written: redo it
            return None
        return meta if rows == meta.get("rows") else None

    def write(self, shard: Shard, rows: list[dict]) -> dict:
        from capscore.report.writers import RowWriter

        final = self.path(shard)
        tmp = final.with_name(f".{final.stem}.tmp.{self.fmt}")
        w = RowWriter(tmp, self.fmt, existing=False, columns=self.columns)
        w.write(rows)
        w.close(complete=True)
        os.replace(tmp, final)
        scores = [r["score"] for r in rows if r["score"] is not None]
        meta = {"config": self.config, "input": shard.fingerprint(), "file": final.name, "rows": len(rows),
                "scored": len(scores), "sum": math.fsum(scores), "skipped": len(rows) - len(scores)}
        side = self.sidecar(shard)
        side.parent.mkdir(parents=True, exist_ok=True)
        t = side.with_name(side.name + ".tmp")
        t.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        os.replace(t, side)
        return meta


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

    return sum(1 for _ in read_rows(path))


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
    from capscore.backbones import load_backbone
    from capscore.pipeline import columns_for, write_json
    from capscore.scores.clipscore import resolve_prefix
    from capscore.scores.metric import get_metric
    from PIL import Image

    ray_mod = require_ray()
    source, enc = job.source, job.encoding
    if len(job.models) > 1:
        raise CapscoreError(f"the Ray engine scores one model per run (several metrics are fine); got "
                            f"{', '.join(map(str, job.models))} — run once per model, each into its own folder")
    out = Path(ray.out)
    if out.suffix.lower() in FILE_SUFFIXES and not out.is_dir():
        raise CapscoreError(f"the Ray engine writes one file per input shard, so its output is a folder; "
                            f"{out} names a {out.suffix} file — give a folder such as {out.with_suffix('')}/")
    if out.exists() and not out.is_dir():
        raise CapscoreError(f"the Ray engine writes one file per input shard into a folder; {out} is a file")
    model = job.models[0]
    cuda = enc.device.startswith("cuda")
    metrics = {n: get_metric(n) for n in job.metrics}
    prefixes = {n: resolve_prefix(m, job.prefix) for n, m in metrics.items()}
    options = {n: ({"abe": dict(job.options["abe"])} if n == "abe" and job.options.get("abe") else {})
               for n in metrics}
    columns = columns_for("image", metrics.values())
    # The driver loads the backbone once on the CPU: its identity keys the output, its preprocessing runs in the
    # CPU tasks. The actors load their own copy on the job's device.
    backbone = load_backbone(model, device="cpu", dtype="fp32", seed=enc.seed, context_length=enc.context_length,
                             trust_remote_code=enc.trust_remote_code, rgb_order=enc.rgb_order)
    identity = backbone.identity if enc.dtype == "fp32" else f"{backbone.identity}|{enc.dtype}"
    config = {"model": model, "backbone": identity, "metric": list(metrics) if len(metrics) > 1 else job.metrics[0],
              "prefix": prefixes[job.metrics[0]] if len(set(prefixes.values())) == 1 else prefixes,
              "source": source.kind, "options": source.options.__dict__}
    state = ShardOutputs(out, ray.out_format, config, columns)
    if state.existing() and not ray.resume:
        if not ray.overwrite:
            raise OptionError(f"{str(out).replace('{', '{{').replace('}', '}}')} already holds shard outputs; use "
                              "{resume} to continue that run or {overwrite} to replace it")
        state.clear()
    out.mkdir(parents=True, exist_ok=True)
    finished = {s.name: m for s in source.shards if (m := state.done(s)) is not None} if ray.resume else {}
    todo = [s for s in source.shards if s.name not in finished]
    pixel_shape = tuple(backbone.preprocess(Image.new("RGB", (8, 8))).shape)
    t0 = time.perf_counter()
    metas = dict(finished)
    if todo:
        ctx = _init(ray_mod, ray)
        res = ray_mod.cluster_resources()
        threads = ray.threads_per_worker
        workers = ray.workers or default_workers(enc.device, res.get("CPU", 1), res.get("GPU", 0),
                                                 ray.gpus_per_worker, threads)
        actor_args = dict(model=model, encoding=enc, metrics=tuple(metrics), prefixes=prefixes, options=options,
                          columns=columns, threads=threads, pixel_shape=pixel_shape)
        ds = build_pipeline(ray_mod, todo, source.options, preprocess_only(backbone), actor_args=actor_args,
                            workers=workers, gpus_per_worker=ray.gpus_per_worker if cuda else 0)
        del ctx
        metas.update(collect(ds, todo, state, n_metrics=len(metrics), skip_bad=job.skip_bad, quiet=ray.quiet))
    elapsed = time.perf_counter() - t0
    scored = sum(m["scored"] for m in metas.values())
    skipped = sum(m["skipped"] for m in metas.values())
    mean = math.fsum(m["sum"] for m in metas.values()) / scored if scored else None
    result = {"status": "complete", "engine": "ray", "metric": config["metric"], "model": model,
              **source.describe(), "count": scored, "skipped": skipped, "mean": mean,
              "shards": len(source.shards), "shards_resumed": len(finished), "seconds": round(elapsed, 3)}
    spath = out / "_summary.json"
    write_json(spath, result)
    m = "n/a" if mean is None else f"{mean:.4f}"
    what = ", ".join(metrics)
    print(f"{what} with {model}: {scored} scored, {skipped} skipped, mean {m} "
          f"({len(source.shards)} shards, {len(finished)} already done)")
    print(f"rows: {out}/<shard>.{ray.out_format}  summary: {spath}", file=sys.stdout)
    return 0


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


def collect(ds, shards: list[Shard], state: ShardOutputs, *, n_metrics: int = 1, skip_bad: bool,
            quiet: bool) -> dict:
    """Iterate the pipeline's rows; write each shard once all its rows are in (every item × every metric,
    ordered by metric then position, as the single-process engine writes them). Returns sidecars by shard."""
    pending: dict[int, dict[tuple, dict]] = {}
    expected: dict[int, int] = {}
    written: dict[str, dict] = {}
    metric_order: dict[str, int] = {}
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in batch.to_pylist():
                s = row["shard"]
                if row["end"]:
                    expected[s] = row["pos"] * n_metrics
                else:
                    if row["error"] is not None and not skip_bad:
                        raise CapscoreError(row["error"])
                    k = metric_order.setdefault(row["metric"], len(metric_order))
                    pending.setdefault(s, {})[(k, row["pos"])] = {c: row[c] for c in state.columns}
                if s in expected and len(pending.get(s, {})) == expected[s]:
                    got = pending.pop(s, {})
                    expected.pop(s)
                    written[shards[s].name] = state.write(shards[s], [got[key] for key in sorted(got)])
    except Exception as e:
        raise _user_error(e) from None
    missing = [shards[s].name for s in range(len(shards)) if shards[s].name not in written]
    if missing:  # a bug, never user input: Ray returned fewer rows than the readers produced
        raise RuntimeError(f"Ray pipeline ended with incomplete shards: {missing[:5]}")
    return written


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
