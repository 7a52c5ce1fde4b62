"""Ray Data engine vs the single-process engine, measured in one run: equality, scaling, overhead, costs, memory.
Prints ratios.

Inputs are generated WebDataset shards (img2dataset layout, 224x224 JPEGs, one caption each, written with
``webdataset.TarWriter``); every run uses ``--no-cache`` so every image and caption is encoded. The model
is a random-init ViT-B-32 (``--model``; the cost per item is that of the real architecture). It prints

* equality: the Ray rows against the single-process rows (same ids, max |Δscore|);
* scaling: Ray 2 actors × 1 thread vs 1 actor × 1 thread (pairs/s, ratio; target ≥ 1.7×);
* overhead: Ray with all cores (one 1-thread actor per core) vs the single-process engine with all cores
  (torch threads = cores; target ≤ 15 % slower);
* per-item costs on one thread (decode+preprocess, image encode, text encode; row write: the single-process
  writer, an actor's part files and the commit task's merge — ``--write-only`` prints these alone) and Ray's cost
  per block (the marginal (Ray − single-process) time / blocks, when positive) and Ray's extra start-up
  per run, the inputs of the cost model in docs/scale.md;
* memory: peak RSS of the single-process CLI and of the Ray driver scoring ``--stream`` captions (Parquet
  shards whose rows point at a pool of 32 image files), against a run 4× smaller — streaming means flat.

Each configuration runs twice, on the first half of the shards and on all of them: throughput is the marginal
rate (the second half's pairs over the extra wall time), so the fixed start-up (Ray workers importing torch,
actors loading the model) cancels, and is printed separately. One command, ~8-10 min on a quiet 2-core
machine with the defaults:

    python benchmarks/ray_scale.py
    python benchmarks/ray_scale.py --shards 4 --per-shard 48 --stream 100000   # quicker
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
os.environ.setdefault("CAPSCORE_MODEL_CONFIGS", str(Path(__file__).resolve().parents[1] / "tests" / "configs"))  # capscore-test-tiny


def make_shards(folder: Path, shards: int, per_shard: int) -> str:
    import webdataset as wds
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    words = ["red", "green", "blue", "striped", "dark", "bright", "small", "large", "round", "square"]
    for s in range(shards):
        with wds.TarWriter(str(folder / f"{s:05d}.tar")) as w:
            for k in range(per_shard):
                base = rng.random((7, 7, 3)) * 255  # smooth image: a realistic JPEG size (~10 KB), not noise
                im = Image.fromarray(base.astype("uint8")).resize((224, 224), Image.BICUBIC)
                buf = io.BytesIO()
                im.save(buf, format="JPEG", quality=90)
                cap = " ".join(rng.choice(words, size=int(rng.integers(4, 14))))
                w.write({"__key__": f"{s:05d}{k:04d}", "jpg": buf.getvalue(), "txt": f"a photo of {cap}"})
    return str(folder / f"{{00000..{shards - 1:05d}}}.tar")


def cli(*argv) -> float:
    from capscore.cli import main

    t = time.perf_counter()
    rc = main(["-q", *map(str, argv)])
    if rc != 0:
        raise SystemExit(f"capscore {' '.join(map(str, argv))} exited {rc}")
    return time.perf_counter() - t


def ray_rows(folder: Path) -> list[dict]:
    import pyarrow.parquet as pq

    files = json.loads((folder / "_summary.json").read_text())["files"]  # the shard files in input order
    return [r for f in files for r in pq.read_table(folder / f).to_pylist()]


def per_item_costs(model: str, pattern: str, n: int = 64) -> dict:
    """Seconds per item on one thread: decode+preprocess, image encode, text encode, row write."""
    import torch

    from capscore.backbones import load_backbone
    from capscore.data.shards import list_shards, read_shard
    from capscore.embed.engine import Encoder, MemoryCache

    torch.set_num_threads(1)
    recs = []
    for sh in list_shards("webdataset", pattern):
        recs += list(read_shard(sh))
    recs = recs[:n]
    bb = load_backbone(model, seed=0)
    t = time.perf_counter()
    px = [bb.preprocess(r.image.decode(r.image.read()[1])) for r in recs]
    decode = (time.perf_counter() - t) / len(recs)
    enc = Encoder(bb, batch_size=64, cache=MemoryCache(), workers=1)
    t = time.perf_counter()
    enc.encode_pixels([str(i) for i in range(len(px))], px)
    img = (time.perf_counter() - t) / len(recs)
    t = time.perf_counter()
    enc.encode_texts(["A photo depicts " + r.caption for r in recs])
    txt = (time.perf_counter() - t) / len(recs)
    costs = write_costs()
    return {"decode_preprocess": decode, "image_encode": img, "text_encode": txt, **costs}


def write_costs(n: int = 20000, block: int = 256) -> dict:
    """Seconds per row, one thread, Parquet: the single-process writer (``RowWriter``: JSONL journal, then
    Parquet), and the Ray engine's two steps — an actor writing its blocks as part files
    (``write_part``, 256 rows each) and the commit task merging them into the shard file
    (``commit_shard``)."""
    from capscore.engines.ray import commit_shard
    from capscore.pipeline import columns_for
    from capscore.report.writers import RowWriter, ShardFiles, part_name, write_part
    from capscore.scores.metric import get_metric

    columns = columns_for("image", [get_metric("clip-s")])
    rows = [{"id": f"{i:09d}", "image": f"shard.tar:{i:09d}", "caption": "a photo of a red round thing",
             "system": "", "model": "ViT-B-32", "metric": "clip-s", "score": 0.5, "error": None} for i in range(n)]
    out = {}
    with tempfile.TemporaryDirectory() as d:
        w = RowWriter(Path(d) / "x.parquet", "parquet", existing=False, columns=columns)
        t = time.perf_counter()
        w.write(rows)
        w.close(complete=True)
        out["row_write"] = (time.perf_counter() - t) / n
        folder = ShardFiles(Path(d), "parquet").parts("s")
        t = time.perf_counter()
        for i in range(0, n, block):
            part = rows[i: i + block]
            write_part(folder / part_name(0, 0, i, len(part), "parquet"), part, "parquet", columns)
        out["actor_part_write"] = (time.perf_counter() - t) / n
        t = time.perf_counter()
        commit_shard(d, "s", "parquet", columns, [(0, 0)], {"items": n, "rows": n})
        out["commit_merge"] = (time.perf_counter() - t) / n
        out["driver_per_block"] = driver_block_cost(Path(d), columns)
    return out


def driver_block_cost(folder: Path, columns: tuple, shards: int = 200, blocks: int = 40) -> float:
    """Seconds of driver work per manifest row (one per 256-item block): the Ray engine's ``Tracker`` fed
    ``shards`` × ``blocks`` manifest rows (each carrying its block's Summary state), with the commit tasks
    stubbed out (they run elsewhere)."""
    from types import SimpleNamespace

    from capscore.data.shards import Shard
    from capscore.engines.ray import Tracker
    from capscore.pipeline import Summary
    from capscore.scores.metric import get_metric

    f = folder / "input.tar"
    f.write_bytes(b"")
    runner = SimpleNamespace(encoders={"m": None}, metrics={"clip-s": get_metric("clip-s")},
                             job=SimpleNamespace(skip_bad=True), combos=[("m", "clip-s")])
    sink = SimpleNamespace(out=folder, files=SimpleNamespace(fmt="parquet"), columns=columns,
                           meta=lambda name, fp, summaries, items: {"items": items})
    tr = Tracker([(f"s{i}", Shard("webdataset", str(f), "x")) for i in range(shards)], runner, sink)
    tr.committer = type("Stub", (), {"remote": staticmethod(lambda *a: None)})()
    block = Summary("clip-s", model="m")
    for i in range(256):
        block.add({"score": 0.5, "system": ""})
    state = json.dumps(block.state())
    # the sentinel first: every block then walks its shard's chain (the most work per block)
    rows = [{"shard": s, "model": 0, "metric": -1, "first": -1, "n": 0, "end": 256 * blocks, "state": "",
             "error": None} for s in range(shards)]
    rows += [{"shard": s, "model": 0, "metric": 0, "first": b * 256, "n": 256, "end": -1, "state": state,
              "error": None} for s in range(shards) for b in range(blocks)]
    t = time.perf_counter()
    for r in rows:
        tr.add(r, None)
    assert len(tr.pending) == shards
    return (time.perf_counter() - t) / len(rows)


_CHILD = """
import sys
from capscore.cli import main
rc = main(sys.argv[1:])
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(f"VmHWM {hwm}", file=sys.stderr)
sys.exit(rc)
"""


def peak_rss_child(argv: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of a child process running the capscore CLI.

    The child reads its own VmHWM: ``ru_maxrss`` from ``wait4`` would report this (large) parent's RSS,
    which Linux carries into a child across fork + exec.
    """
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _CHILD, "-q", *argv], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"child failed: {p.stderr[-2000:]}")
    kb = int(next(ln for ln in reversed(p.stderr.splitlines()) if ln.startswith("VmHWM")).split()[1])
    return kb / 1024, time.perf_counter() - t


def make_stream(folder: Path, n: int, shards: int = 10) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for i in range(32):
        Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")).save(folder / f"img{i}.png")
    per = n // shards
    for s in range(shards):
        ids = np.arange(s * per, (s + 1) * per)
        pq.write_table(pa.table({"key": [f"{i:09d}" for i in ids], "image": [f"img{i % 32}.png" for i in ids],
                                 "caption": [f"caption number {i} of a test" for i in ids]}),
                       folder / f"part-{s:03d}.parquet", row_group_size=8192)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ViT-B-32")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=96)
    ap.add_argument("--stream", type=int, default=1_000_000, help="captions for the memory check (0: skip)")
    ap.add_argument("--stream-model", default="capscore-test-tiny")
    ap.add_argument("--memory-only", action="store_true", help="only the memory check")
    ap.add_argument("--write-only", action="store_true", help="only the per-row write costs (seconds)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(SRC))
    if args.write_only:
        print(f"per-row write costs, one thread, Parquet (load average {os.getloadavg()[0]:.1f})")
        for k, v in write_costs().items():
            if k == "driver_per_block":
                print(f"  {k:18s} {1e6 * v:8.2f} µs per 256-row block = {1e6 * v / 256:.3f} µs per row")
            else:
                print(f"  {k:18s} {1e6 * v:8.2f} µs   {1 / v:10.0f} rows/s")
        return
    import ray
    import torch

    cores = os.cpu_count() or 1
    n = args.shards * args.per_shard
    tmp = Path(tempfile.mkdtemp(prefix="capscore-ray-bench-"))
    if args.memory_only:
        return memory(args, tmp)
    pattern = make_shards(tmp / "shards", args.shards, args.per_shard)
    common = ["score", "--model", args.model, "--webdataset", pattern, "--no-cache"]
    print(f"{n} pairs in {args.shards} WebDataset shards, model {args.model} (random init), fp32 CPU, {cores} cores")

    half = pattern.replace(f"{args.shards - 1:05d}}}", f"{args.shards // 2 - 1:05d}}}")
    costs = per_item_costs(args.model, pattern)

    def timed(out: str, *extra) -> tuple[float, float]:
        """(wall on half the shards, wall on all): marginal rate and fixed start-up follow from the two."""
        t_half = cli(*common[:3], "--webdataset", half, "--no-cache", *extra, "--out", tmp / f"half-{out}")
        t_all = cli(*common, *extra, "--out", tmp / out)
        return t_half, t_all

    torch.set_num_threads(cores)
    local = timed("local.jsonl")
    rows_local = [json.loads(line) for line in open(tmp / "local.jsonl")]

    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    torch.set_num_threads(1)
    one = timed("ray1", "--engine", "ray", "--workers", 1)
    two = timed("ray2", "--engine", "ray", "--workers", 2)
    every = two if cores == 2 else timed("rayall", "--engine", "ray", "--workers", cores)
    got = ray_rows(tmp / "ray2")
    same_ids = [r["id"] for r in got] == [r["id"] for r in rows_local]
    delta = max(abs(a["score"] - b["score"]) for a, b in zip(got, rows_local))
    m = n - (args.shards // 2) * args.per_shard  # pairs in the second half

    def rate(t):  # marginal pairs/s: the second half's pairs over the extra wall time
        return m / (t[1] - t[0])

    def startup(t):  # fixed cost: what is left of the full run's wall once its pairs are paid at that rate
        return t[1] - n / rate(t)

    print("\nequality (Ray 2 actors vs single process)")
    print(f"  same ids in the same order: {same_ids}   max |Δscore| = {delta:.2e}   (target ≤ 1e-6)")
    print(f"\nthroughput = marginal rate between a run on {args.shards // 2} shards and one on {args.shards} "
          "(start-up cancels); start-up = full wall − pairs / rate")
    for name, t in (("Ray 1 actor x 1 thread", one), ("Ray 2 actors x 1 thread", two),
                    (f"single process, {cores} threads", local)) + (() if cores == 2 else
                                                                    ((f"Ray {cores} actors x 1 thread", every),)):
        print(f"  {name:28s}: {rate(t):7.1f} pairs/s  start-up {startup(t):5.1f} s  (walls {t[0]:.1f} s, {t[1]:.1f} s)")
    print(f"  scaling 2 actors vs 1: {rate(two) / rate(one):.2f}x (target ≥ 1.7x); whole runs {one[1] / two[1]:.2f}x")
    print(f"  overhead Ray {cores} actors vs single process: {100 * (rate(local) / rate(every) - 1):+.1f} % "
          f"(target ≤ +15 %); whole runs {100 * (every[1] / local[1] - 1):+.1f} %")
    blocks = 2 * (args.shards - args.shards // 2)  # one data block + one sentinel block per shard
    print("\nper-item costs, one thread (inputs of docs/scale.md)")
    for k, v in costs.items():
        print(f"  {k:18s} {1e3 * v:8.3f} ms")
    extra = (every[1] - every[0]) - (local[1] - local[0])  # Ray's extra marginal time on the second half
    if extra > 0:
        print(f"  Ray per block      {1e3 * extra / blocks:8.1f} ms  (= marginal (Ray − single) / {blocks} blocks, "
              "start-up excluded)")
    else:  # Ray did the second half faster: its per-block cost is hidden under the better core use
        print(f"  Ray per block      not separable: Ray's marginal time on the second half is {-extra:.1f} s "
              f"shorter than the single process's ({blocks} blocks)")
    print(f"  Ray start-up       {startup(every) - startup(local):+8.1f} s per run more than the single process "
          "(local cluster, actors loading the model)")
    ray.shutdown()
    if args.stream:
        memory(args, tmp)


def memory(args, tmp: Path) -> None:
    if args.stream:
        print(f"\nmemory: {args.stream} captions over 10 Parquet shards ({args.stream_model}, 32 image files)")
        for size in (args.stream // 4, args.stream):
            folder = make_stream(tmp / f"stream{size}", size)
            rss, secs = peak_rss_child(["score", "--model", args.stream_model, "--parquet", str(folder),
                                        "--no-cache", "--out", str(tmp / f"stream{size}.jsonl")])
            print(f"  single process, {size:>9d} captions: peak RSS {rss:7.0f} MiB  ({secs:.0f} s)")
            rss, secs = peak_rss_child(["score", "--model", args.stream_model, "--parquet", str(folder),
                                        "--no-cache", "--engine", "ray", "--out", str(tmp / f"stream{size}-ray")])
            print(f"  Ray driver,     {size:>9d} captions: peak RSS {rss:7.0f} MiB  ({secs:.0f} s)")


if __name__ == "__main__":
    main()
