"""``--engine ray``: an executor that runs the pipeline's block function on a Ray cluster, and nothing else.

::

    shards ──read (CPU task: ShardedSource.read, the single-process reader)──▶ blocks of pickled items
           ──decode + preprocess (CPU task: ImageRef.read/decode + backbone.preprocess)──▶ + pixels
           ──encode + score + write (an actor pool per slot: make_encoder, or a metric's own models, once
                 per actor; pipeline.score_block)──▶
                 part files + manifest rows (positions, the rows' Summary state, first error)
           ──driver: manifests only; a shard whose parts cover it ──commit (Ray task)──▶ DIR/<name>.<fmt>

What this module owns: where blocks run (:class:`RayExecutor`, for
:func:`capscore.pipeline.run` with a :class:`~capscore.pipeline.ShardFolder`)
and a Ray-backed encoder for probe and correlate (:func:`ray_encoders`). What it
does not: the run's configuration and identity
(:class:`~capscore.pipeline.RunConfig`), the folder's lock, settings check,
resume, orphans and summary (:mod:`capscore.pipeline`, whose folder layout both
engines write), the summary arithmetic (:class:`~capscore.pipeline.Summary`),
the metrics (:func:`~capscore.pipeline.score_block` through the job's
:class:`~capscore.pipeline.Plan`) and the encoder (:func:`capscore.embed.make_encoder`).
Rows are therefore the rows of the single-process engine; only the batch
composition differs, which moves fp32 scores by float rounding (≤ 1e-6, tested).

Slots. The run's combos (``_Runner.combos``) are scored slot after slot
(:func:`slots`), one actor pool each: first one per metric that brings its own
models (Polos, DENEB, the judges: the (None, metric) combos), then one per model
(its (model, metric) combos). The driver holds each model's backbone on the CPU
(its identity names the run, its preprocessing — without the networks — runs in
the CPU tasks). It loads no model of a metric with its own models: it checks
that their released files are there (the formula's session with the option
``check_only``; :attr:`RayExecutor.loads_own_models`), and each of that slot's
actors enters the session itself, loading the models once in its process on
the job's device and dtype; that slot has no decode step (its tower's encoder,
or the judge's processor, reads the images).

Who writes what, and exactly once. Rows never pass through the driver. An actor
writes each (block, combo)'s rows as a *part file*
``DIR/_shards/parts/<name>/m<slot>-k<metric>-<first position>-<rows>.<fmt>``
(:func:`capscore.report.writers.write_part`: a unique temporary name, then a
rename) and returns one manifest row per part: positions covered, the rows'
:class:`~capscore.pipeline.Summary` state, the first error. Ray Data spreads a
shard's blocks over all actors and retries the blocks of a killed actor on
another; part files keyed by position make that safe: a re-run block writes the
same name with the same rows, and the driver keys manifests by first position,
so a block reported twice counts once. When one chain of manifests covers
positions ``0 … n−1`` for every combo — ``n`` comes from the sentinel row the
reader adds after each shard's last item, which each slot's pool passes on — the
driver merges the parts' states into the shard's summaries and starts one commit
task (:func:`commit_shard`, no CPU reserved, any node), which writes the sidecar
and then the shard file from the parts in the combos' order
(:meth:`capscore.report.writers.ShardFiles.commit`). The driver holds, per shard
in flight, one small entry per block until the shard's parts are complete: its
memory does not grow with shard size. Parts of an unfinished shard are removed
by the next run, which scores that shard again.

What is shared: the input shards and the output folder — every node must see
both paths, since actors and commit tasks write into the folder. What is not:
backbones (one per actor) and the embedding cache: each actor's encoder is
:func:`~capscore.embed.make_encoder`'s, so the persistent cache (the default;
``--cache-dir``) is the SQLite file at that path *on the actor's own node* —
SQLite serialises the writers of one node, so keep it on local disk, never on
NFS — and ``--no-cache`` keeps vectors in each actor's memory. See docs/scale.md.

Logging: Ray's own log lines and progress bars stay off unless asked
(``RayOptions.verbose``, ``--debug``); capscore's progress bar counts the rows
the manifests report.
"""
from __future__ import annotations

import json
import os
import pickle
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import copy
import logging

from PIL import Image

from capscore.engines import require_ray
from capscore.errors import CapscoreError, InputError, param_error
from capscore.data.images import ImageRef
from capscore.data.records import Record
from capscore.embed.cache import cache_key
from capscore.embed.factory import Encoding, make_encoder, tower_encoder
from capscore.pipeline import Summary, load_encoders
from capscore.report.writers import ShardFiles, load_json, parse_part, part_name, write_part
from capscore.scores.metric import get_metric

BLOCK_ROWS = 256  # items per block leaving a read task
TASK_CPUS = 0.5  # logical CPUs a read or decode task reserves


@dataclass(frozen=True)
class RayOptions:
    """Where the Ray engine runs: the cluster, the actor pool, and whether Ray's own logs show."""

    address: str | None = None
    workers: int | None = None
    gpus_per_worker: float = 1.0
    threads_per_worker: int = 1
    verbose: bool = False  # Ray's INFO lines and Ray Data's progress bars (capscore shows its own)

    def __post_init__(self) -> None:
        if not isinstance(self.threads_per_worker, int) or self.threads_per_worker < 1:
            raise CapscoreError("The 'threads_per_worker' parameter must be a positive integer; got "
                                f"{self.threads_per_worker!r} instead.")
        if self.workers is not None and self.workers < 1:
            raise CapscoreError(f"The 'workers' parameter must be a positive integer; got {self.workers!r} instead.")
        if not self.gpus_per_worker > 0:
            raise CapscoreError(f"The 'gpus_per_worker' parameter must be positive; got {self.gpus_per_worker!r} "
                                "instead.")


# ------------------------------------------------------------------------------------ per-block functions
def read_blocks(batch, *, source, shards: list, block_rows: int = BLOCK_ROWS):
    """Read task: shard indices (column ``id``) -> blocks of (shard, pos, end, item) rows; a sentinel row ends each
    shard. Items come from :meth:`ShardedSource.read`, as in the single-process engine."""
    import pyarrow as pa

    for idx in batch.column("id").to_pylist():
        rows: list[tuple] = []
        pos = -1
        for pos, item in enumerate(source.read(shards[idx])):
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

    decoder = make_encoder(backbone, Encoding(cache=False))  # its _decode: the engine's RGB-order rule
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
    """Actor of one slot of the run (:func:`slots`): for a model, one encoder (:func:`~capscore.embed.make_encoder`
    of the job's Encoding), built once; for a metric that brings its own models, the metric's session entered
    once (its models loaded in this process, on the job's device and dtype) and, for a metric with its own
    image tower (Polos, DENEB), that tower's encoder (:func:`~capscore.embed.factory.tower_encoder` on the
    job's cache, as the single-process run makes it; it reads the images, so a bad one is an error row). Scores blocks with
    the job's :class:`~capscore.pipeline.Plan` (:func:`~capscore.pipeline.score_block`) for the slot's metrics
    (``metrics``: indices into the plan's), writes each (block, metric)'s rows as a part file of its shard
    (``m<slot>-k<metric>``) and returns a manifest row per part."""

    def __init__(self, *, model: str | None, slot: int, metrics: tuple, encoding, plan, threads: int, pixel_shape,
                 out: str, fmt: str, names: tuple):
        import torch  # noqa: PLC0415  (deferred: torch)

        torch.set_num_threads(threads)
        self.model, self.slot, self.metrics, self.plan = model, slot, tuple(metrics), plan
        self.encoder, self.sessions, self.failed = None, ExitStack(), None
        self.out, self.fmt, self.names = Path(out), fmt, names
        try:
            if model is not None:
                self.encoder = make_encoder(model, replace(encoding, workers=threads))
                self.pixel_shape = tuple(pixel_shape)
            else:  # the metric's own models, loaded here once (capscore.scores.learned.loaded: one per process)
                for k in self.metrics:
                    name = plan.metrics[k]
                    formula = get_metric(name).formula(plan.medium)
                    hook = getattr(formula, "session", None)
                    if hook is not None:
                        self.sessions.enter_context(hook(None, plan.options[name]))
                    if hasattr(formula, "tower"):  # its own CLIP tower on the encoding engine, as in a local run
                        self.encoder = tower_encoder(formula.tower(plan.options[name]), (),
                                                     replace(encoding, workers=threads))
        except CapscoreError as e:  # reported with the first block (__call__)
            self.failed = e

    def __call__(self, batch):
        """The block's manifest; a CapscoreError (the actor could not start: a node without the weights; a
        block that stops the run) is one manifest row whose error the driver raises: Ray passes an actor's
        exception on without its cause, so its one line would be lost."""
        try:
            if self.failed is not None:
                raise self.failed
            return self._score(batch)
        except CapscoreError as e:
            return _manifest_table([_manifest(FAILED, self.slot, -1, -1, 0, error=str(e))])

    def _score(self, batch):
        import torch  # noqa: PLC0415  (deferred: torch)

        cols = {c: batch.column(c).to_pylist() for c in ("shard", "pos", "end", "item", "key", "px")
                if c in batch.column_names}  # no key/px for a metric with its own models: it reads the images
        if "px" in cols:
            have = [i for i, px in enumerate(cols["px"]) if px]
            self.encoder.encode_pixels(
                [cols["key"][i] for i in have],
                [torch.from_numpy(np.frombuffer(cols["px"][i], dtype=np.float32).reshape(self.pixel_shape))
                 for i in have])
        files = ShardFiles(self.out, self.fmt)
        manifest = []
        for s in dict.fromkeys(cols["shard"]):  # a block holds one shard's rows; any number is handled
            mine = [i for i, x in enumerate(cols["shard"]) if x == s]
            body = [i for i in mine if not cols["end"][i]]
            for i in mine:
                if cols["end"][i]:  # sentinel: the shard has this many items
                    manifest.append(_manifest(s, self.slot, -1, -1, 0, end=cols["pos"][i]))
            if not body:
                continue
            first = cols["pos"][body[0]]
            if [cols["pos"][i] for i in body] != list(range(first, first + len(body))):
                raise RuntimeError(f"block of shard {s} is not contiguous")  # a bug, never user input
            items = [pickle.loads(cols["item"][i]) for i in body]
            for k in self.metrics:
                name = self.plan.metrics[k]
                rows, fatal = self.plan.score(items, self.encoder, self.model, name)
                if fatal is not None:
                    raise fatal
                write_part(files.parts(self.names[s]) / part_name(self.slot, k, first, len(rows), self.fmt),
                           rows, self.fmt, self.plan.columns)
                summary = Summary(name, model=self.model)
                for r in rows:
                    summary.add(r)
                error = next((r["error"] for r in rows if r["error"] is not None), None)
                manifest.append(_manifest(s, self.slot, k, first, len(rows),
                                          state=json.dumps(summary.state()), error=error))
        return _manifest_table(manifest)


MANIFEST = ("shard", "model", "metric", "first", "n", "end", "state", "error")
FAILED = -1  # the shard of a manifest row carrying an actor's CapscoreError; its error stops the run


def _manifest(shard, model, metric, first, n, *, end=-1, state="", error=None) -> tuple:
    return (shard, model, metric, first, n, end, state, error)


def _manifest_table(rows: list[tuple]):
    import pyarrow as pa

    types = (pa.int64(),) * 6 + (pa.string(), pa.string())
    data = list(zip(*rows)) if rows else [()] * len(MANIFEST)
    return pa.table({c: pa.array(list(v), t) for c, v, t in zip(MANIFEST, data, types)})


def commit_shard(out: str, name: str, fmt: str, columns: tuple, order: list, meta: dict) -> dict:
    """Ray task: the shard file ``out/<name>.<fmt>`` from its part files, (slot, metric) after (slot, metric) of
    ``order`` (the run's combos), each in position order (:meth:`ShardFiles.commit`: sidecar, file, parts
    removed). Returns the sidecar."""
    files = ShardFiles(Path(out), fmt)
    folder = files.parts(name)
    if not folder.is_dir() and files.path(name).is_file() and load_json(files.sidecar(name)) == meta:
        return meta  # a retry of a commit that finished: nothing left to do
    found: dict[tuple, dict[int, tuple[int, Path]]] = {}
    for p in folder.iterdir() if folder.is_dir() else ():
        parsed = parse_part(p.name) if not p.name.startswith(".") else None
        if parsed is not None:
            m, k, first, n = parsed
            found.setdefault((m, k), {})[first] = (n, p)
    ordered: list[Path] = []
    for m, k in order:
        chain, pos = found.get((m, k), {}), 0
        while pos < meta["items"]:
            if pos not in chain:  # a bug, never user input: the driver saw every part's manifest
                raise RuntimeError(f"shard {name}: no part of slot {m}, metric {k} at position {pos}")
            n, p = chain[pos]
            ordered.append(p)
            pos += n
    return files.commit(name, meta, columns, parts=ordered)


# ------------------------------------------------------------------------------------ the driver
def slots(runner) -> list[tuple[str | None, tuple[int, ...]]]:
    """The run's actor pools, in the order of its combos (``runner.combos``): (None, (k,)) for each metric that
    brings its own models, then (model, the indices of the metrics it scores) for each model. ``k`` indexes
    ``runner.metrics``; a part file ``m<slot>-k<k>`` holds a block of one combo."""
    names = list(runner.metrics)
    out: list[tuple[str | None, list[int]]] = []
    for model, name in runner.combos:
        if model is not None and out and out[-1][0] == model:
            out[-1][1].append(names.index(name))
        else:
            out.append((model, [names.index(name)]))
    return [(m, tuple(ks)) for m, ks in out]


class Tracker:
    """The driver's view of a run: manifest rows in, commit tasks out. It holds, per shard in flight, one
    small entry per block until that combo's blocks cover the shard, then the merged summary; a shard whose
    every combo ((model, metric), or (None, metric) for a metric with its own models) is covered is committed
    once by a Ray task (:func:`commit_shard`) and forgotten. Blocks are keyed by their first position, so a
    block reported twice (a retried task) counts once; a row of a shard already committed is ignored."""

    def __init__(self, todo: list, runner, folder, bar=None):
        self.names = [n for n, _ in todo]
        self.fingerprints = [s.fingerprint() for _, s in todo]  # taken before reading: a change meanwhile redoes it
        self.runner, self.folder, self.bar = runner, folder, bar
        self.combos = list(runner.combos)
        self.order = [(i, k) for i, (_, ks) in enumerate(slots(runner)) for k in ks]  # combo c = (slot, metric)
        self.index = {sk: c for c, sk in enumerate(self.order)}
        self.by_slot: dict[int, list[int]] = {}
        for c, (i, _) in enumerate(self.order):
            self.by_slot.setdefault(i, []).append(c)
        self.skip_bad = runner.job.skip_bad
        self.items: dict[int, int] = {}
        self.blocks: dict[tuple, dict[int, tuple[int, str]]] = {}
        self.front: dict[tuple, int] = {}
        self.done: dict[int, dict] = {}
        self.committed: set[int] = set()
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
        s = row["shard"]
        if s == FAILED:
            raise CapscoreError(row["error"])
        if s in self.committed:  # a retried block of a shard whose file is written: counted already
            return
        if row["end"] >= 0:  # the sentinel of one slot's pool: every slot sends its own
            self.items[s] = row["end"]
            cs = self.by_slot[row["model"]]
        else:
            if row["error"] is not None and not self.skip_bad:
                raise CapscoreError(row["error"])
            c = self.index[(row["model"], row["metric"])]
            self.blocks.setdefault((s, c), {})[row["first"]] = (row["n"], row["state"])
            if self.bar is not None:
                self.bar.update(row["n"])
            cs = (c,)
        if s not in self.items:
            return
        for c in cs:
            self._check(s, c)
        if len(self.done.get(s, ())) == len(self.combos):
            self._commit(s)

    def _check(self, s: int, c: int) -> None:
        done = self.done.setdefault(s, {})
        if c in done:
            return
        chain = self.blocks.get((s, c), {})
        pos = self.front.get((s, c), 0)  # positions before it are covered: walk on from there
        while pos < self.items[s] and pos in chain:
            pos += chain[pos][0]
        self.front[(s, c)] = pos
        if pos == self.items[s]:
            model, metric = self.combos[c]
            summary, p = Summary(self.runner.metrics[metric], model=model), 0
            while p < pos:
                n, state = chain[p]
                summary.merge(json.loads(state))
                p += n
            done[c] = summary
            self.blocks.pop((s, c), None)
            self.front.pop((s, c), None)

    def _commit(self, s: int) -> None:
        done = self.done.pop(s)
        summaries = {key: done[c] for c, key in enumerate(self.combos)}  # the run's combo order
        name = self.names[s]
        self.committed.add(s)
        meta = self.folder.meta(name, self.fingerprints[s], summaries, self.items.pop(s))
        self.pending.append((name, self.committer.remote(str(self.folder.out), name, self.folder.files.fmt,
                                                         self.folder.columns, self.order, meta)))

    def _reap(self, ray, *, block: bool) -> None:
        if not self.pending:
            return
        refs = [r for _, r in self.pending]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=None if block else 0)
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


def _init(ray, opts: RayOptions):
    """Join (or start) the cluster named by ``opts.address``; Ray's own logs and progress bars only when
    ``opts.verbose`` (capscore prints its own progress; failures still raise)."""
    from ray.data import DataContext

    if not opts.verbose:  # no Ray / Ray Data INFO lines ("execution finished in …"), no C++ core-worker notices
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")  # read at ray.init
    if not ray.is_initialized():
        try:
            with _stderr_silenced(not opts.verbose):  # the C++ core says it read the level, whatever the level
                ray.init(address=opts.address, include_dashboard=False, log_to_driver=opts.verbose,
                         logging_level="INFO" if opts.verbose else "ERROR", configure_logging=True)
        except ConnectionError as e:
            raise CapscoreError(f"address {opts.address}: cannot connect to a Ray cluster ({e})") from None
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = opts.verbose
    ctx.print_on_execution_start = opts.verbose
    ctx.verbose_stats_logs = False
    return ctx


@contextmanager
def _stderr_silenced(on: bool):
    """File descriptor 2 to /dev/null for the block (C++ libraries write there directly, not via sys.stderr)."""
    if not on:
        yield
        return
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def preprocess_only(backbone):
    """A copy of ``backbone`` without its networks: what the CPU tasks need to run ``preprocess``.

    Shipping ``backbone.preprocess`` as is would pickle the whole model into
    every read task (580 MB for a ViT-B/32); the transforms alone are a few KB.
    """
    import torch  # noqa: PLC0415  (deferred: torch)

    from capscore.backbones.base import Backbone  # noqa: PLC0415  (deferred: torch)

    light = copy.copy(backbone)
    for name, value in vars(backbone).items():
        if isinstance(value, torch.nn.Module):
            setattr(light, name, None)
        elif isinstance(value, Backbone):  # a composite (mclip: a text student + an image tower)
            setattr(light, name, preprocess_only(value))
    return light


def build_pipeline(ray, source, shards: list, light_backbone, *, actor_args: dict, workers: int,
                   gpus_per_worker: float):
    """The Ray Dataset: one row per shard -> read -> prepare -> score (lazy; nothing runs until iterated).
    Without a backbone (a metric that brings its own models) nothing is prepared: its actors read the images."""
    # from_items builds the shard list on the driver: no read task, which would want a whole CPU
    ds = ray.data.from_items([{"id": i} for i in range(len(shards))], override_num_blocks=len(shards))
    ds = ds.map_batches(read_blocks, batch_size=1, batch_format="pyarrow", zero_copy_batch=True,
                        fn_kwargs={"source": source, "shards": shards}, num_cpus=TASK_CPUS)
    if light_backbone is not None:
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


def _actor_options(runner) -> dict:
    """The plan's formula options, with the weights folder of the metrics that bring their own models as the
    driver resolved it (absolute; ``$CAPSCORE_METRIC_WEIGHTS`` and ``~`` read on the driver): actors run in
    other folders, on other nodes."""
    folder = runner.config.options.get("metric_weights")
    return {n: {**o, "metric_weights": folder} if runner.metrics[n].own_models else o
            for n, o in runner.plan.options.items()}


class RayExecutor:
    """Scores a :class:`~capscore.pipeline.ShardFolder` run's shards on a Ray cluster (see the module docstring):
    ``capscore.pipeline.run(job, executor=RayExecutor(options))``."""

    name = "ray"
    loads_own_models = False  # the driver checks the files of a metric's own models; each actor loads them

    def __init__(self, options: RayOptions = RayOptions()):
        self.options = options

    def encoders(self, job):
        """The driver's encoders: each model loaded on the CPU with the job's dtype, seed, context and RGB order,
        so its identity is the one the actors' copies have; refuses what block-by-block scoring cannot do."""
        require_ray()
        if job.medium != "image":
            raise CapscoreError("the Ray engine scores images; score videos with the local engine")
        for name in job.metrics:
            if "corpus" in get_metric(name).needs("image"):  # its statistics come from the whole set
                raise CapscoreError(f"metric {name} needs statistics over the whole evaluated set, which the Ray "
                                    "engine (block by block) does not have; score it with the local engine")
        return load_encoders(job, encoding=replace(job.encoding, device="cpu", cache=False))

    def score_shards(self, runner, todo: list, folder, bar) -> dict[str, dict]:
        ray = require_ray()
        _init(ray, self.options)
        enc = runner.job.encoding
        cuda = enc.device.startswith("cuda")
        res = ray.cluster_resources()
        threads = self.options.threads_per_worker
        workers = self.options.workers or default_workers(enc.device, res.get("CPU", 1), res.get("GPU", 0),
                                                          self.options.gpus_per_worker, threads)
        tracker = Tracker(todo, runner, folder, bar)
        tracker.committer = ray.remote(num_cpus=0, max_retries=3)(commit_shard)
        # every error is a row (the driver stops at one unless --skip-bad); the weights folder as the driver found it
        plan = replace(runner.plan, skip_bad=True, options=_actor_options(runner))
        shards = [s for _, s in todo]
        for i, (model, metrics) in enumerate(slots(runner)):  # one pool after the other, in the combos' order
            light = None if model is None else preprocess_only(runner.encoders[model].backbone)
            shape = None if light is None else tuple(light.preprocess(Image.new("RGB", (8, 8))).shape)
            actor_args = dict(model=model, slot=i, metrics=metrics, encoding=enc, plan=plan, threads=threads,
                              pixel_shape=shape, out=str(folder.out), fmt=folder.files.fmt,
                              names=tuple(tracker.names))
            ds = build_pipeline(ray, runner.job.source, shards, light, actor_args=actor_args, workers=workers,
                                gpus_per_worker=self.options.gpus_per_worker if cuda else 0)
            tracker.run(ds, ray)
        return tracker.finish(ray)


# ------------------------------------------------------------------------------------ probe / correlate
class _EncodeWorker:
    """A Ray actor holding ``make_encoder(spec, encoding)``, encoding what it is sent. It keeps no vectors (a
    one-entry store): the driver's encoder holds the run's cache."""

    def __init__(self, *, spec: str, encoding, threads: int):
        import torch  # noqa: PLC0415  (deferred: torch)

        from capscore.embed.engine import MemoryCache  # noqa: PLC0415  (deferred: torch)

        torch.set_num_threads(threads)
        self.encoder = make_encoder(spec, replace(encoding, cache=False, workers=threads),
                                    store=MemoryCache(max_items=1))

    def identity(self) -> str:
        return self.encoder.backbone.identity

    def texts(self, texts):
        return self.encoder.encode_texts(texts).numpy()

    def images(self, refs):
        errors: dict[int, str] = {}
        return self.encoder.encode_images(refs, errors=errors).numpy(), errors


class RayEncoder:
    """An encoder made by :func:`~capscore.embed.make_encoder` (``local``) whose missing global vectors a pool of
    Ray actors computes first.

    ``encode_texts`` / ``encode_images`` send the unique inputs the local cache lacks to the actors in blocks
    (one backbone per actor, loaded once, restarted and retried by Ray if it dies), put the vectors they return
    into the local encoder's cache, then call the local method, which finds them all there. Failures (a bad
    image) are left to the local method, so errors read exactly as with the single-process engine. Everything
    else — per-token and patch features (``patches=True``, ABE-CLIP), videos, the statistics — is the local
    encoder's (attribute access falls through to it). Ray core actors rather than Ray Data here: probes call
    the encoder many times, and one pool that lives as long as the encoder avoids reloading the model per call.
    """

    def __init__(self, local, *, spec: str, encoding, options: RayOptions):
        self.local, self._spec, self._encoding, self._options, self._pool = local, spec, encoding, options, None

    def __getattr__(self, name: str):  # only for names not found on the wrapper itself
        if name.startswith("__") or name == "local":
            raise AttributeError(name)
        return getattr(self.local, name)

    def _actors(self):
        if self._pool is None:
            ray = require_ray()
            a = self._options
            _init(ray, a)
            res = ray.cluster_resources()
            cuda = self._encoding.device.startswith("cuda")
            workers = a.workers or default_workers(self._encoding.device, res.get("CPU", 1), res.get("GPU", 0),
                                                   a.gpus_per_worker, a.threads_per_worker)
            cls = ray.remote(_EncodeWorker).options(
                num_cpus=actor_cpus(res.get("CPU", 1) + TASK_CPUS, workers, a.threads_per_worker),
                num_gpus=a.gpus_per_worker if cuda else 0, max_restarts=-1, max_task_retries=-1)
            actors = [cls.remote(spec=self._spec, encoding=self._encoding,
                                 threads=a.threads_per_worker) for _ in range(workers)]
            ids = set(ray.get([x.identity.remote() for x in actors]))
            if ids != {self.local.backbone.identity}:  # a bug, never user input: the actors loaded other weights
                raise RuntimeError(f"Ray actors loaded {ids}, the driver {self.local.backbone.identity}")
            self._pool = ray.util.ActorPool(actors)
        return self._pool

    def _blocks(self, items):
        size = 4 * self.local.batch_size
        return [items[i: i + size] for i in range(0, len(items), size)]

    def _missing(self, kind: str, items: dict) -> list:
        """(cache key, input) of the ``items`` (content key -> input) the local cache lacks."""
        keys = {cache_key(self.local.backbone.identity, kind, k): x for k, x in items.items()}
        found = self.local.cache.get_many(list(keys))
        return [(k, x) for k, x in keys.items() if k not in found]

    def encode_texts(self, texts):
        missing = self._missing("text", {t: t for t in texts if isinstance(t, str)})
        if missing:
            blocks = self._blocks(missing)
            for block, vecs in zip(blocks, self._actors().map(lambda a, b: a.texts.remote([t for _, t in b]), blocks)):
                self.local.cache.put_many((k, np.array(v)) for (k, _), v in zip(block, vecs))  # writable copies
        return self.local.encode_texts(texts)

    def encode_images(self, images, *, errors: dict[int, str] | None = None, patches: bool = False):
        if not patches:  # patch tokens live in the local encoder's memory: its own forward yields both
            todo = {}
            for r in dict((r.identity_hint(), r) for r in map(ImageRef.of, images)).values():
                try:
                    todo[r.read()[0]] = r
                except InputError:
                    pass  # reported by the local method below
            missing = self._missing("image", todo)
            if missing:
                blocks = self._blocks(missing)
                for block, (vecs, errs) in zip(blocks, self._actors().map(
                        lambda a, b: a.images.remote([r for _, r in b]), blocks)):
                    self.local.cache.put_many((k, np.array(v)) for j, ((k, _), v) in enumerate(zip(block, vecs))
                                              if j not in errs)
        return self.local.encode_images(images, errors=errors, patches=patches)


def ray_encoders(options: RayOptions):
    """The Ray variant of :func:`capscore.embed.make_encoder`, same signature: ``make(model, encoding, *, store=,
    progress=)`` -> a :class:`RayEncoder` around the local encoder (probe, correlate). ``model`` is a
    ``--model`` string: the actors load the model by name."""
    require_ray()

    def make(model, encoding: Encoding = Encoding(), *, store=None, progress: bool = False) -> RayEncoder:
        if not isinstance(model, str):
            raise param_error("model", "ray_encoders", "a --model string (each actor loads the model by name)", model)
        return RayEncoder(make_encoder(model, encoding, store=store, progress=progress), spec=model,
                          encoding=encoding, options=options)

    return make
