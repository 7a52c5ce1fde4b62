"""`capscore score --engine ray` on a local 2-CPU Ray cluster started here, against the single-process engine.

The single-process engine is itself checked against open_clip by hand (test_cli_score, test_data_shards);
here the Ray engine must reproduce its rows: same ids in the same order per shard, |Δscore| ≤ 1e-6.
Output names are derived here from their documented rule (stem + 8 hex digits of sha1(absolute path)).
"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from shard_inputs import samples, write_hf, write_parquet, write_webdataset
from test_cli_score import MODEL, one_line_error, rows, score

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a local Ray cluster, end to end


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(num_cpus=2, object_store_memory=160 * 1024**2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def ray_score(tmp_path, *args):
    return score(tmp_path, "--engine", "ray", "--workers", "2", "--no-cache", *args)


def out_name(path, occurrence=1):
    """The documented output name of a shard file: stem, '-', sha1(absolute path)[:8]; '~k' for a repeat."""
    path = os.path.abspath(path)
    base = f"{os.path.basename(path).split('.')[0]}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    return base if occurrence == 1 else f"{base}~{occurrence}"


def shard_rows(folder, names):
    return {n: pq.read_table(folder / f"{n}.parquet").to_pylist() for n in names}


def row_files(folder):
    return sorted(p.name for p in folder.glob("*.parquet"))


def assert_same_rows(ray_rows, local_rows):
    assert [r["id"] for r in ray_rows] == [r["id"] for r in local_rows]
    assert [r["error"] for r in ray_rows] == [r["error"] for r in local_rows]
    a = np.array([np.nan if r["score"] is None else r["score"] for r in ray_rows])
    b = np.array([np.nan if r["score"] is None else r["score"] for r in local_rows])
    assert np.array_equal(np.isnan(a), np.isnan(b))
    assert np.nanmax(np.abs(a - b)) <= 1e-6


def test_webdataset_equals_single_process_with_error_rows_then_resume_skips_done_shards(tmp_path):
    import webdataset as wds

    items = samples(3, 5)
    paths = write_webdataset(tmp_path / "shards", items)
    with wds.TarWriter(str(paths[1])) as w:  # shard 1, sample 2: corrupt image bytes
        for _, key, png, cap, _ in (it for it in items if it[0] == 1):
            w.write({"__key__": key, "png": b"garbage" if key.endswith("2") else png, "txt": cap})
    pattern = str(tmp_path / "shards" / "{00000..00002}.tar")
    assert score(tmp_path, "--webdataset", pattern, "--skip-bad", "--no-cache", "--out", tmp_path / "l.jsonl") == 0
    local = rows(tmp_path / "l.jsonl")
    out = tmp_path / "ray"
    assert ray_score(tmp_path, "--webdataset", pattern, "--skip-bad", "--out", out) == 0
    names = [out_name(p) for p in paths]
    got = shard_rows(out, names)
    assert row_files(out) == sorted(f"{n}.parquet" for n in names)
    assert_same_rows([r for n in names for r in got[n]], local)
    assert "00001.tar:000010002: " in got[names[1]][2]["error"]
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["count"] == 14 and summary["skipped"] == 1

    # resume: shard 2's output is lost, shard 0's input changed since -> only those two are scored again
    before = {n: (out / f"{n}.parquet").stat().st_mtime_ns for n in names[:2]}
    (out / f"{names[2]}.parquet").unlink()
    os.utime(paths[0], ns=(time.time_ns(), time.time_ns()))
    assert ray_score(tmp_path, "--webdataset", pattern, "--skip-bad", "--resume", "--out", out) == 0
    assert (out / f"{names[1]}.parquet").stat().st_mtime_ns == before[names[1]]  # untouched
    assert (out / f"{names[0]}.parquet").stat().st_mtime_ns != before[names[0]]
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["shards_resumed"] == 1 and summary["count"] == 14
    again = shard_rows(out, names)
    assert_same_rows([r for n in names for r in again[n]], local)
    assert summary["files"] == [f"{n}.parquet" for n in names]


def test_parquet_and_hf_dataset_equal_single_process(tmp_path):
    items = samples(2, 4, seed=1)
    write_parquet(tmp_path / "pq", items)
    write_hf(tmp_path / "hf", items, num_shards=2)
    for flag, src, extra, names in (("--parquet", tmp_path / "pq", ["--image-column", "jpg", "--refs-column", "refs",
                                                                     "--metric", "refclip-s"],
                                     [tmp_path / "pq" / "part-000.parquet", tmp_path / "pq" / "part-001.parquet"]),
                                    ("--hf-dataset", tmp_path / "hf", [],
                                     sorted((tmp_path / "hf").rglob("data-0000*-of-00002.arrow")))):
        names = [out_name(p) for p in names]
        local_out = tmp_path / f"{flag[2:]}.jsonl"
        assert score(tmp_path, flag, src, *extra, "--no-cache", "--out", local_out) == 0
        out = tmp_path / f"ray-{flag[2:]}"
        assert ray_score(tmp_path, flag, src, *extra, "--out", out) == 0
        got = shard_rows(out, names)
        assert_same_rows([r for n in names for r in got[n]], rows(local_out))


def driver(*args):
    """A `capscore score --engine ray` driver in a process of its own, joined to this module's Ray cluster."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "capscore.cli", "-q", "score", "--model", MODEL, "--engine", "ray", "--address",
           ray.get_runtime_context().gcs_address, "--workers", "2", "--no-cache", *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def test_two_drivers_on_one_folder_one_is_refused_in_one_line(tmp_path):
    """Two drivers (real processes) start on one --out folder with different metrics: one scores, the other
    gets one line and writes nothing; the folder holds one metric's rows under that metric's summary."""
    write_webdataset(tmp_path / "shards", samples(3, 4, seed=3))
    out = tmp_path / "ray"
    metrics = ("clip-s", "pac-s")
    procs = [driver("--webdataset", tmp_path / "shards", "--metric", m, "--out", out) for m in metrics]
    results = [(p.wait(timeout=900), p.stderr.read()) for p in procs]
    codes = [c for c, _ in results]
    assert sorted(codes) == [0, 2], results
    winner = metrics[codes.index(0)]
    lines = [ln for ln in results[codes.index(2)][1].splitlines() if ln.strip()]
    assert len(lines) == 1 and str(out) in lines[0], lines
    # overlapping: the lock refuses; if the first had already finished: its outputs are not clobbered
    assert "another capscore process" in lines[0] or "already holds shard outputs" in lines[0]
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["status"] == "complete" and summary["metric"] == winner and summary["count"] == 12
    got = [r for f in out.glob("*.parquet") for r in pq.read_table(f).to_pylist()]
    assert len(got) == 12 and {r["metric"] for r in got} == {winner}
    assert not (out / "_run.lock").exists()


def test_driver_killed_mid_run_then_resume_gives_the_clean_rows(tmp_path):
    """SIGKILL of a driver process once a shard file is committed; --resume then ends with every row once,
    equal to the single-process engine, and no part file or temporary left behind."""
    items = samples(8, 8, seed=6)
    paths = write_webdataset(tmp_path / "shards", items)
    out = tmp_path / "ray"
    p = driver("--webdataset", tmp_path / "shards", "--batch-size", "4", "--out", out)
    deadline = time.time() + 600
    while time.time() < deadline and p.poll() is None and next(out.glob("_shards/parts/*/*"), None) is None:
        time.sleep(0.05)
    soon = time.time() + 20  # an actor wrote a block; wait a little for a committed shard file too
    while time.time() < soon and p.poll() is None and not list(out.glob("*.parquet")):
        time.sleep(0.05)
    assert p.poll() is None, "the driver ended before it could be killed; make the run longer"
    p.kill()
    p.wait()
    committed = {f.name: f.stat().st_mtime_ns for f in out.glob("*.parquet")}
    assert score(tmp_path, "--webdataset", tmp_path / "shards", "--no-cache", "--out", tmp_path / "l.jsonl") == 0
    assert ray_score(tmp_path, "--webdataset", tmp_path / "shards", "--resume", "--out", out) == 0
    names = [out_name(x) for x in paths]
    assert row_files(out) == sorted(f"{n}.parquet" for n in names)
    got = shard_rows(out, names)
    assert_same_rows([r for n in names for r in got[n]], rows(tmp_path / "l.jsonl"))
    summary = json.loads((out / "_summary.json").read_text())
    # a shard file is renamed into place after its sidecar: every one seen at the kill is kept as it is
    assert summary["shards_resumed"] == len(committed)
    assert all((out / n).stat().st_mtime_ns == t for n, t in committed.items())
    assert not list((out / "_shards").glob("parts/*")) and not list(out.glob(".*"))


def test_same_shard_twice_then_resume_with_shards_added_and_removed(tmp_path, capsys):
    """A shard listed twice is scored twice (two files, as the single-process engine gives its rows twice);
    --resume with one more shard keeps the done files untouched and adds one; --resume with fewer shards
    removes the outputs of those no longer given: no row twice, none orphaned."""
    items = samples(3, 4, seed=4)
    paths = write_webdataset(tmp_path / "shards", items)
    sh = tmp_path / "shards"

    def local(pattern, name):
        assert score(tmp_path, "--webdataset", pattern, "--no-cache", "--out", tmp_path / name) == 0
        return rows(tmp_path / name)

    twice = str(sh / "{00000,00001,00000}.tar")
    want = local(twice, "twice.jsonl")
    assert len(want) == 12
    out = tmp_path / "ray"
    assert ray_score(tmp_path, "--webdataset", twice, "--out", out) == 0
    names = [out_name(paths[0]), out_name(paths[1]), out_name(paths[0], 2)]
    assert row_files(out) == sorted(f"{n}.parquet" for n in names)
    got = shard_rows(out, names)
    assert_same_rows([r for n in names for r in got[n]], want)

    before = {n: (out / f"{n}.parquet").stat().st_mtime_ns for n in names}
    more = str(sh / "{00000,00001,00000,00002}.tar")
    assert ray_score(tmp_path, "--webdataset", more, "--resume", "--out", out) == 0
    assert {n: (out / f"{n}.parquet").stat().st_mtime_ns for n in names} == before  # the same file names: kept
    names.append(out_name(paths[2]))
    assert row_files(out) == sorted(f"{n}.parquet" for n in names)
    got = shard_rows(out, names)
    assert_same_rows([r for n in names for r in got[n]], local(more, "more.jsonl"))
    summary = json.loads((out / "_summary.json").read_text())
    assert (summary["count"], summary["shards_resumed"]) == (16, 3)

    fewer = str(sh / "{00002,00000}.tar")
    assert ray_score(tmp_path, "--webdataset", fewer, "--resume", "--out", out) == 0
    keep = [names[3], names[0]]
    assert row_files(out) == sorted(f"{n}.parquet" for n in keep)
    assert sorted(p.stem for p in (out / "_shards").glob("*.json")) == sorted(keep)
    got = shard_rows(out, keep)
    assert_same_rows([r for n in keep for r in got[n]], local(fewer, "fewer.jsonl"))
    summary = json.loads((out / "_summary.json").read_text())
    assert (summary["count"], summary["shards_resumed"], summary["orphans_removed"]) == (8, 2, 2)
    assert summary["files"] == [f"{n}.parquet" for n in keep]
    capsys.readouterr()

    # another metric on the same folder: --resume refuses in one line, the files stay
    assert ray_score(tmp_path, "--webdataset", fewer, "--metric", "pac-s", "--resume", "--out", out) == 2
    one_line_error(capsys, "--resume", "metric", "--overwrite")
    assert row_files(out) == sorted(f"{n}.parquet" for n in keep)


def test_two_models_and_two_metrics_equal_single_process(tmp_path):
    """Several --model and --metric: each shard file holds (model, metric) after (model, metric), each in
    input order — the single-process engine's order within that shard."""
    items = samples(2, 3, seed=5)
    paths = write_webdataset(tmp_path / "shards", items)
    args = ["--model", "scenes-tiny", "--metric", "clip-s", "--metric", "pac-s"]
    assert score(tmp_path, "--webdataset", tmp_path / "shards", *args, "--no-cache", "--out",
                 tmp_path / "l.jsonl") == 0
    local = rows(tmp_path / "l.jsonl")
    out = tmp_path / "ray"
    assert ray_score(tmp_path, "--webdataset", tmp_path / "shards", *args, "--out", out) == 0
    for p in paths:
        got = pq.read_table(out / f"{out_name(p)}.parquet").to_pylist()
        mine = [r for r in local if r["image"].rsplit(":", 1)[0].endswith(p.name)]
        assert len(mine) == 12
        # the local file is (model, metric)-major over all shards; this shard's rows keep that order
        assert [(r["model"], r["metric"]) for r in got] == [(r["model"], r["metric"]) for r in mine]
        assert_same_rows(got, mine)
    summary = json.loads((out / "_summary.json").read_text())
    assert [(r["model"], r["metric"], r["count"]) for r in summary["runs"]] == [
        (MODEL, "clip-s", 6), (MODEL, "pac-s", 6), ("scenes-tiny", "clip-s", 6), ("scenes-tiny", "pac-s", 6)]


def test_a_metric_with_its_own_models_beside_a_backbone_metric_equals_the_local_engine(tmp_path, monkeypatch):
    """polos (its own models: an actor pool of its own, after which the model's) and clip-s with scenes-tiny on
    three shards — one with a sample without an image and one whose image is not one, under --skip-bad, one
    empty: each shard file holds the local engine's rows in its order (polos, then clip-s), the summaries
    agree, and the driver loads no model of polos (its actors do, from the weights folder the driver names)."""
    import webdataset as wds

    import learned_weights as lw
    from capscore.cli import main
    from capscore.scores import learned

    lw.weights_dir(tmp_path / "w", polos=True)
    monkeypatch.chdir(tmp_path)  # --metric-weights w: relative to the driver's folder, not the actors'
    wdir = "w"
    items = samples(2, 3, seed=10)
    paths = write_webdataset(tmp_path / "shards", items)
    with wds.TarWriter(str(paths[1])) as w:  # shard 1: sample 1 without an image, sample 2 not an image
        for _, key, png, cap, refs in (it for it in items if it[0] == 1):
            image = {} if key.endswith("1") else {"png": b"garbage" if key.endswith("2") else png}
            w.write({"__key__": key, **image, "txt": cap, "json": {"refs": refs}})
    paths.append(tmp_path / "shards" / "00002.tar")
    with wds.TarWriter(str(paths[2])):  # an empty shard
        pass
    argv = ["-q", "score", "--webdataset", str(tmp_path / "shards"), "--refs-column", "refs", "--metric", "polos",
            "clip-s", "--model", "scenes-tiny", "--metric-weights", wdir, "--skip-bad", "--no-cache"]
    assert main(argv + ["--out", f"{tmp_path / 'local'}/"]) == 0

    def refused(*a, **k):
        raise AssertionError("the driver loaded a metric's model")

    monkeypatch.setattr(learned, "_LOADED", {})  # the local run's models: not there for the driver to find
    monkeypatch.setattr(learned, "_load", refused)  # this process only: the actors load for themselves
    assert main(argv + ["--engine", "ray", "--workers", "2", "--out", str(tmp_path / "ray")]) == 0
    names = [out_name(p) for p in paths]
    local, got = shard_rows(tmp_path / "local", names), shard_rows(tmp_path / "ray", names)
    assert [(r["model"], r["metric"]) for r in local[names[0]]] == [(None, "polos")] * 3 + [("scenes-tiny",
                                                                                            "clip-s")] * 3
    for n in names[:2]:
        assert [(r["model"], r["metric"]) for r in got[n]] == [(r["model"], r["metric"]) for r in local[n]]
        assert_same_rows(got[n], local[n])
    assert local[names[2]] == got[names[2]] == []
    bad = [r for r in got[names[1]] if r["error"] is not None]
    assert [(r["metric"], r["id"]) for r in bad] == [("polos", "000010001"), ("polos", "000010002"),
                                                     ("clip-s", "000010001"), ("clip-s", "000010002")]
    assert "00001.tar:000010002: " in bad[1]["error"]
    runs = [json.loads((tmp_path / d / "_summary.json").read_text())["runs"] for d in ("local", "ray")]
    for a, b in zip(*runs):
        assert (a["model"], a["metric"], a["count"], a["skipped"]) == (b["model"], b["metric"], b["count"],
                                                                         b["skipped"])
        assert abs(a["mean"] - b["mean"]) <= 1e-6
    assert [(r["model"], r["metric"], r["count"], r["skipped"]) for r in runs[1]] == [
        (None, "polos", 4, 2), ("scenes-tiny", "clip-s", 4, 2)]


def test_a_checkpoint_its_actors_cannot_read_is_the_local_engines_one_line(tmp_path, capsys):
    """The driver checks only that the files are there; a Polos checkpoint that is there but is not one fails
    in the actors, and the run ends with the line the local engine prints."""
    import learned_weights as lw
    from capscore.cli import main

    wdir = lw.weights_dir(tmp_path / "w", polos=True)
    (wdir / "polos" / "reprod.ckpt").write_bytes(b"not a checkpoint")
    write_webdataset(tmp_path / "shards", samples(2, 2, seed=11))
    argv = ["-q", "score", "--webdataset", str(tmp_path / "shards"), "--refs-column", "refs", "--metric", "polos",
            "--metric-weights", str(wdir), "--no-cache"]
    assert main(argv + ["--out", f"{tmp_path / 'local'}/"]) == 2
    local = one_line_error(capsys, str(wdir.resolve() / "polos" / "reprod.ckpt"), "not a PyTorch checkpoint")
    assert main(argv + ["--engine", "ray", "--workers", "2", "--out", str(tmp_path / "ray")]) == 2
    assert one_line_error(capsys) == local


def test_jsonl_and_csv_shard_files_equal_single_process_and_resume(tmp_path):
    """--out-format jsonl|csv: the parts are concatenated (CSV under one header); --resume counts their rows."""
    import csv

    paths = write_webdataset(tmp_path / "shards", samples(2, 3, seed=7))
    assert score(tmp_path, "--webdataset", tmp_path / "shards", "--no-cache", "--out", tmp_path / "l.jsonl") == 0
    local = rows(tmp_path / "l.jsonl")
    for fmt in ("jsonl", "csv"):
        out = tmp_path / fmt
        assert ray_score(tmp_path, "--webdataset", tmp_path / "shards", "--out-format", fmt, "--out", out) == 0
        got = []
        for p in paths:
            with open(out / f"{out_name(p)}.{fmt}", newline="") as f:
                if fmt == "jsonl":
                    got += [json.loads(line) for line in f]
                else:
                    got += [{**r, "score": float(r["score"]) if r["score"] else None, "error": r["error"] or None}
                            for r in csv.DictReader(f)]
        assert_same_rows(got, local)
        assert ray_score(tmp_path, "--webdataset", tmp_path / "shards", "--out-format", fmt, "--resume",
                         "--out", out) == 0
        assert json.loads((out / "_summary.json").read_text())["shards_resumed"] == 2


def _descendants_named(root: int, needle: str) -> list[int]:
    """PIDs below ``root`` (our driver, which started the raylet) whose process title contains ``needle``."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
                parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass

    def below(pid):
        seen = 0
        while pid in parent and seen < 50:
            pid, seen = parent[pid], seen + 1
            if pid == root:
                return True
        return False

    out = []
    for pid in parent:
        try:
            title = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in title and below(pid):
            out.append(pid)
    return out


def test_encoder_actor_killed_mid_run_gives_every_row_exactly_once(tmp_path):
    items = samples(6, 12, seed=2)
    write_webdataset(tmp_path / "shards", items)
    out = tmp_path / "ray"
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("rc", ray_score(
        tmp_path, "--webdataset", tmp_path / "shards", "--batch-size", "4", "--out", out)))
    t.start()
    killed = None
    deadline = time.time() + 240
    while time.time() < deadline and t.is_alive() and killed is None:
        actors = _descendants_named(os.getpid(), "ScoreActor")
        if actors and next(out.glob("_shards/parts/*/*.parquet"), None) is not None:  # an actor wrote a block
            killed = actors[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)
    t.join(300)
    assert killed is not None, "the run ended before an actor could be killed; make it longer"
    assert result.get("rc") == 0
    names = [out_name(tmp_path / "shards" / f"{s:05d}.tar") for s in range(6)]
    got = shard_rows(out, names)
    ids = [r["id"] for n in names for r in got[n]]
    assert ids == [it[1] for it in items]  # every row, once, in input order per shard
    assert all(r["error"] is None and r["score"] is not None for n in got for r in got[n])


def test_truncated_tar_without_skip_bad_is_one_line_naming_the_shard(tmp_path, capsys):
    items = samples(2, 3)
    paths = write_webdataset(tmp_path / "shards", items)
    paths[1].write_bytes(paths[1].read_bytes()[:3000])
    assert ray_score(tmp_path, "--webdataset", tmp_path / "shards", "--out", tmp_path / "ray") == 2
    line = one_line_error(capsys, str(paths[1]))
    assert "truncated" in line


def test_ray_absent_says_how_to_install_in_one_line(tmp_path, monkeypatch, capsys):
    write_webdataset(tmp_path / "shards", samples(1, 1))
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    assert ray_score(tmp_path, "--webdataset", tmp_path / "shards", "--out", tmp_path / "ray") == 2
    one_line_error(capsys, "--engine ray", "pip install 'capscore[ray]'")


@pytest.mark.parametrize("suite", ["perturb", "lgip"])
def test_probe_with_ray_encoder_equals_single_process(tmp_path, make_images, suite):
    from capscore.cli import main

    paths = make_images(3)
    f = tmp_path / "caps.jsonl"
    f.write_text("".join(json.dumps({"image": p.name, "caption": f"a small {w} dog sits on the red mat"}) + "\n"
                         for p, w in zip(paths, ["brown", "white", "black"])))
    common = ["probe", "--model", "capscore-test-tiny", "--suite", suite, "--data", str(f), "--images",
              str(paths[0].parent)]
    assert main(common + ["--out", str(tmp_path / "local")]) == 0
    assert main(common + ["--out", str(tmp_path / "ray"), "--engine", "ray", "--workers", "2"]) == 0
    local = [json.loads(x) for x in open(tmp_path / "local" / f"{suite}__capscore-test-tiny.jsonl")]
    got = [json.loads(x) for x in open(tmp_path / "ray" / f"{suite}__capscore-test-tiny.jsonl")]
    assert len(got) == len(local) > 0
    for a, b in zip(got, local):
        assert {k: v for k, v in a.items() if not isinstance(v, float)} == \
               {k: v for k, v in b.items() if not isinstance(v, float)}
        for k, v in b.items():
            if isinstance(v, float):
                assert abs(a[k] - v) <= 1e-6 or (v != v and a[k] != a[k]), k


def test_decode_task_preprocesses_each_distinct_image_once_per_block(monkeypatch):
    """A block whose rows repeat an image ships its pixels once (the actor caches them by key); the
    single-process engine decodes it once too. Pure function: no cluster needed."""
    import io
    import pickle

    import pyarrow as pa
    from PIL import Image

    from capscore.backbones import load_backbone
    from capscore.data.records import Record
    from capscore.data.images import ImageRef
    from capscore.engines import ray as R

    def png(colour):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), colour).save(buf, format="PNG")
        return buf.getvalue()

    red, blue = png((255, 0, 0)), png((0, 0, 255))
    recs = [Record(f"r{i}", ImageRef(data=d, name=f"s:{i}"), "a caption") for i, d in enumerate([red, blue, red, red])]
    bb = R.preprocess_only(load_backbone("capscore-test-tiny", seed=0))
    calls = []
    real = bb.preprocess
    monkeypatch.setattr(bb, "preprocess", lambda im: calls.append(1) or real(im))
    batch = pa.table({"item": pa.array([pickle.dumps(r) for r in recs] + [b""], pa.binary())})
    out = R.prepare_block(batch, backbone=bb)
    keys, px = out.column("key").to_pylist(), out.column("px").to_pylist()
    assert len(calls) == 2  # red and blue, once each
    assert keys[0] == keys[2] == keys[3] != keys[1] and keys[4] == ""
    assert px[0] and px[1] and px[2] == px[3] == px[4] == b""
    one = np.frombuffer(px[0], np.float32)
    assert np.array_equal(one, real(Image.open(io.BytesIO(red)).convert("RGB")).numpy().ravel())


def test_correlate_with_the_ray_encoder_equals_the_local_engine(tmp_path, capsys):
    """`capscore correlate --engine ray` (which passes patches= to the encoder through score_records) runs and
    prints the local engine's table, number for number."""
    from capscore.cli import main

    argv = ["-q", "correlate", "--dataset", "scenes-oracle", "--scenes", "20", "--model", "scenes-tiny", "--metric",
            "clip-s", "--metric", "pac-s", "--bootstrap", "50", "--no-cache"]
    assert main(argv + ["--out", str(tmp_path / "local")]) == 0
    local = capsys.readouterr().out
    assert main(argv + ["--engine", "ray", "--workers", "2", "--out", str(tmp_path / "ray")]) == 0
    assert capsys.readouterr().out.replace(str(tmp_path / "ray"), "") == local.replace(str(tmp_path / "local"), "")
    a = json.loads((tmp_path / "local" / "correlate.json").read_text())["results"]
    b = json.loads((tmp_path / "ray" / "correlate.json").read_text())["results"]
    assert _numbers(a) == pytest.approx(_numbers(b), abs=1e-6)  # only float rounding of the batches differs
    assert _numbers(a, shape=True) == _numbers(b, shape=True)  # and the same everything else


def _numbers(obj, *, shape: bool = False) -> list:
    """The numbers of a JSON value in order, or (``shape``) everything but them."""
    if isinstance(obj, dict):
        return [x for k in sorted(obj) for x in [k, *_numbers(obj[k], shape=shape)] if shape or x is not k]
    if isinstance(obj, list):
        return [x for v in obj for x in _numbers(v, shape=shape)]
    number = isinstance(obj, (int, float)) and not isinstance(obj, bool)
    return ([] if number else [obj]) if shape else ([obj] if number else [])


def test_either_engine_resumes_the_folder_the_other_wrote(tmp_path):
    """The local engine's --out DIR/ and the Ray engine's folder are one layout: Ray resumes a local folder
    (scoring only the shard whose file is gone), the local engine resumes Ray's; rows carry the same system."""
    paths = write_webdataset(tmp_path / "shards", samples(3, 4, seed=8))
    names = [out_name(p) for p in paths]
    out = tmp_path / "dir"
    assert score(tmp_path, "--webdataset", tmp_path / "shards", "--no-cache", "--out", f"{out}/") == 0
    local = shard_rows(out, names)
    assert {r["system"] for n in names for r in local[n]} == {"shards"}
    kept = {n: (out / f"{n}.parquet").stat().st_mtime_ns for n in names[:2]}
    (out / f"{names[2]}.parquet").unlink()
    assert ray_score(tmp_path, "--webdataset", tmp_path / "shards", "--resume", "--out", out) == 0
    summary = json.loads((out / "_summary.json").read_text())
    assert (summary["engine"], summary["shards_resumed"], summary["count"]) == ("ray", 2, 12)
    assert {n: (out / f"{n}.parquet").stat().st_mtime_ns for n in names[:2]} == kept
    again = shard_rows(out, names)
    assert_same_rows(again[names[2]], local[names[2]])
    assert [r["system"] for r in again[names[2]]] == [r["system"] for r in local[names[2]]]
    assert score(tmp_path, "--webdataset", tmp_path / "shards", "--no-cache", "--resume", "--out", out) == 0
    summary = json.loads((out / "_summary.json").read_text())
    assert (summary["engine"], summary["shards_resumed"], summary["count"]) == ("local", 3, 12)


def test_ray_prints_only_capscore_lines_unless_debug(tmp_path):
    """A driver process without -q: stderr holds capscore's own lines (its progress bar, warnings) and nothing
    of Ray's logging; with --debug Ray's own lines show."""
    import re

    write_webdataset(tmp_path / "shards", samples(1, 3, seed=9))
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {k: v for k, v in os.environ.items() if k != "RAY_BACKEND_LOG_LEVEL"}
    env.update(PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")

    def foreign(*flags):
        cmd = [sys.executable, "-m", "capscore.cli", *flags, "score", "--model", MODEL, "--engine", "ray",
               "--address", ray.get_runtime_context().gcs_address, "--workers", "1", "--no-cache", "--webdataset",
               str(tmp_path / "shards"), "--out", str(tmp_path / f"ray{len(flags)}")]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0, p.stderr
        rest = re.sub(r"scoring: [^\r\n\]]*\]", "", p.stderr)  # capscore's progress bar, drawn with \r
        return [ln for ln in re.split(r"[\r\n]", rest) if ln.strip() and not ln.startswith("capscore")]

    assert foreign() == []
    assert foreign("--debug")  # asked for: Ray's own lines are there
