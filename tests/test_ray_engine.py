"""`capscore score --engine ray` on a local 2-CPU Ray cluster started here, against the single-process engine.

The single-process engine is itself checked against open_clip by hand (test_cli_score, test_data_shards);
here the Ray engine must reproduce its rows: same ids in the same order per shard, |Δscore| ≤ 1e-6.
"""
import json
import os
import signal
import sys
import threading
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from shard_inputs import samples, write_hf, write_parquet, write_webdataset
from test_cli_score import one_line_error, rows, score

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


def shard_rows(folder, names):
    return {n: pq.read_table(folder / f"{n}.parquet").to_pylist() for n in names}


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
    got = shard_rows(out, ["00000", "00001", "00002"])
    assert_same_rows([r for n in sorted(got) for r in got[n]], local)
    assert "00001.tar:000010002: " in got["00001"][2]["error"]
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["count"] == 14 and summary["skipped"] == 1

    # resume: shard 2's output is lost, shard 0's input changed since -> only those two are scored again
    before = {n: (out / f"{n}.parquet").stat().st_mtime_ns for n in ("00000", "00001")}
    (out / "00002.parquet").unlink()
    os.utime(paths[0], ns=(time.time_ns(), time.time_ns()))
    assert ray_score(tmp_path, "--webdataset", pattern, "--skip-bad", "--resume", "--out", out) == 0
    assert (out / "00001.parquet").stat().st_mtime_ns == before["00001"]  # untouched
    assert (out / "00000.parquet").stat().st_mtime_ns != before["00000"]
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["shards_resumed"] == 1 and summary["count"] == 14
    again = shard_rows(out, ["00000", "00001", "00002"])
    assert_same_rows([r for n in sorted(again) for r in again[n]], local)


def test_parquet_and_hf_dataset_equal_single_process(tmp_path):
    items = samples(2, 4, seed=1)
    write_parquet(tmp_path / "pq", items)
    write_hf(tmp_path / "hf", items, num_shards=2)
    for flag, src, extra, names in (("--parquet", tmp_path / "pq", ["--image-column", "jpg", "--refs-column", "refs",
                                                                     "--metric", "refclip-s"],
                                     ["part-000", "part-001"]),
                                    ("--hf-dataset", tmp_path / "hf", [],
                                     ["data-00000-of-00002", "data-00001-of-00002"])):
        local_out = tmp_path / f"{flag[2:]}.jsonl"
        assert score(tmp_path, flag, src, *extra, "--no-cache", "--out", local_out) == 0
        out = tmp_path / f"ray-{flag[2:]}"
        assert ray_score(tmp_path, flag, src, *extra, "--out", out) == 0
        got = shard_rows(out, names)
        assert_same_rows([r for n in names for r in got[n]], rows(local_out))


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
        if actors and len(list(out.glob("*.parquet"))) >= 1:
            killed = actors[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)
    t.join(300)
    assert killed is not None, "the run ended before an actor could be killed; make it longer"
    assert result.get("rc") == 0
    got = shard_rows(out, [f"{s:05d}" for s in range(6)])
    ids = [r["id"] for n in sorted(got) for r in got[n]]
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
    from capscore.embed.images import ImageRef
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
