"""The run protocol both engines share: rows reach disk by time and on Ctrl-C/SIGTERM, the default metric
follows the references wherever they are written, a folder of shard files from the local engine (resumed
row by row), sharded rows named after their source, and the Summary's arithmetic and aggregate hook.

Expected values come from an uninterrupted run of the same command (the thing resume must reproduce), from
the references-file run (the behaviour the captions-file references must match), from math.fsum, and from
the documented output-name rule (stem + 8 hex digits of sha1(absolute path)).
"""
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shard_inputs import samples, write_webdataset
from test_cli_score import MODEL, rows, score, write_jsonl

SRC = str(Path(__file__).resolve().parents[1] / "src")

# A child `capscore score` whose text encoder takes 50 ms a call, like a large model, so the run lasts long
# enough to be interrupted at a chosen moment whatever the machine's speed.
SLOW_CHILD = """
import sys, time
from capscore.embed.engine import Encoder
_encode = Encoder.encode_texts
def slow(self, texts):
    time.sleep(0.05)
    return _encode(self, texts)
Encoder.encode_texts = slow
from capscore.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _lines(path):
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_interrupt_flushes_scored_rows_and_resume_completes(tmp_path, make_images, sig):
    """With the default --chunk-size (2048), rows reach the file within seconds, not after 2048 captions;
    Ctrl-C (or SIGTERM) writes the rows scored since; --resume then scores only the rest and the file equals
    an uninterrupted run's: nothing lost, nothing twice."""
    from capscore.pipeline import FLUSH_SECONDS

    paths = make_images(3)
    n = 2000
    caps = write_jsonl(tmp_path / "caps.jsonl", [{"image": f"img{i % 3}.png", "caption": f"caption {i % 100} here"}
                                                 for i in range(n)])
    common = ["--model", MODEL, "--images", str(paths[0].parent), "--captions", str(caps), "--no-cache",
              "--batch-size", "4"]
    out = tmp_path / "o.jsonl"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CHILD, "-q", "score", *common, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 300
    while _lines(out) == 0 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    first = _lines(out)
    assert 0 < first < 2048, "the first rows reach the file by time, before a chunk of 2048 is full"
    time.sleep(FLUSH_SECONDS / 3)  # rows scored since the last write wait in memory
    before = _lines(out)
    assert proc.poll() is None, "the run ended before it could be interrupted; make it longer"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "results written so far are kept" in err and "Traceback" not in err
    kept = _lines(out)
    assert before < kept < n  # the rows scored since the last write were written on the way out
    assert json.loads((tmp_path / "o.jsonl.summary.json").read_text())["status"] == "running"

    assert score(tmp_path, *common[2:], "--out", out, "--resume") == 0
    full = tmp_path / "full.jsonl"
    assert score(tmp_path, *common[2:], "--out", full) == 0
    got, want = rows(out), rows(full)
    assert [r["id"] for r in got] == [r["id"] for r in want] == [str(i) for i in range(1, n + 1)]
    np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], atol=1e-6)
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert (summary["count"], summary["resumed_rows"], summary["scored_now"]) == (n, kept, n - kept)


def test_references_in_the_captions_file_give_the_default_of_a_references_file(tmp_path, data, capsys):
    """The same references, written in the captions file (a refs field) or given with --refs, give the same
    default metric (RefCLIP-S) and the same scores; the summary and the printout say why it was chosen."""
    paths, caps, refs = data
    inline = write_jsonl(tmp_path / "sysA.jsonl", [{"image": f"{k}.png", "id": k, "caption": c, "refs": refs[k]}
                                                   for k, c in caps.items()])
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert score(tmp_path, "--images", paths[0].parent, "--captions", inline, "--out", a, quiet=False) == 0
    captured = capsys.readouterr()
    assert "ignores the references" not in captured.err
    assert "metric refclip-s (default: the records carry references" in captured.out
    assert score(tmp_path, "--images", paths[0].parent, "--captions", tmp_path / "sysA.json", "--refs",
                 tmp_path / "refs.json", "--out", b) == 0
    ra, rb = rows(a), rows(b)
    assert {r["metric"] for r in ra} == {r["metric"] for r in rb} == {"refclip-s"}
    np.testing.assert_allclose([r["score"] for r in ra], [r["score"] for r in rb], atol=1e-6)
    np.testing.assert_allclose([r["ref_score"] for r in ra], [r["ref_score"] for r in rb], atol=1e-6)
    for f in (a, b):
        s = json.loads(Path(f"{f}.summary.json").read_text())
        assert s["metric"] == "refclip-s" and s["metric_choice"] == "default: the records carry references"
    c = tmp_path / "c.jsonl"
    assert score(tmp_path, "--images", paths[0].parent, "--captions", tmp_path / "sysA.json", "--out", c) == 0
    s = json.loads(Path(f"{c}.summary.json").read_text())
    assert s["metric"] == "clip-s" and s["metric_choice"] == "default: the records carry no references"
    assert score(tmp_path, "--images", paths[0].parent, "--captions", inline, "--metric", "clip-s",
                 "--out", tmp_path / "d.jsonl") == 0
    assert "metric_choice" not in json.loads((tmp_path / "d.jsonl.summary.json").read_text())


@pytest.fixture
def data(tmp_path, make_images):
    paths = make_images(4)
    caps = {f"img{i}": f"a {c} square" for i, c in enumerate(["red", "green", "blue", "noisy"])}
    (tmp_path / "sysA.json").write_text(json.dumps(caps))
    refs = {f"img{i}": [f"reference {i}", "a colourful pattern"] for i in range(4)}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    return paths, caps, refs


def out_name(path):
    path = os.path.abspath(path)
    return f"{os.path.basename(path).split('.')[0]}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"


def test_local_engine_writes_a_folder_of_shard_files_and_resumes_a_shard_row_by_row(tmp_path):
    """--out DIR/ with sharded input: one file per shard (the Ray engine's layout and names), the rows of
    one --out FILE run split by shard, rows named after the source; --resume keeps finished shards and
    continues an interrupted shard's journal after its last row (those rows are not scored again)."""
    paths = write_webdataset(tmp_path / "shards", samples(3, 5, seed=2))
    src = ["--webdataset", tmp_path / "shards", "--no-cache", "--metric", "clip-s", "--metric", "pac-s"]
    assert score(tmp_path, *src, "--out", tmp_path / "one.jsonl") == 0
    one = rows(tmp_path / "one.jsonl")
    assert {r["system"] for r in one} == {"shards"}  # named after the source, as a captions file names its system
    out = tmp_path / "dir"
    assert score(tmp_path, *src, "--out-format", "jsonl", "--out", f"{out}/") == 0
    names = [out_name(p) for p in paths]
    assert sorted(p.name for p in out.glob("*.jsonl")) == sorted(f"{n}.jsonl" for n in names)

    def shard_of(r):
        return r["image"].rsplit(":", 1)[0]

    for p, n in zip(paths, names):
        want = [r for r in one if shard_of(r).endswith(p.name)]  # (model, metric) after (model, metric)
        got = rows(out / f"{n}.jsonl")
        assert [(r["metric"], r["id"]) for r in got] == [(r["metric"], r["id"]) for r in want]
        np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], atol=1e-6)
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["engine"] == "local" and summary["files"] == [f"{n}.jsonl" for n in names]
    dir_rows = [x for n in names for x in rows(out / f"{n}.jsonl")]
    for r in summary["runs"]:  # the summary's mean is that of the rows this run wrote (batches differ from one.jsonl's)
        mine = [x["score"] for x in dir_rows if x["metric"] == r["metric"]]
        assert r["count"] == 15 and r["mean"] == pytest.approx(math.fsum(mine) / 15, abs=1e-9)

    # shard 2 as an interruption leaves it: no file, no sidecar, a journal holding its first rows
    n2, done = names[2], {n: (out / f"{n}.jsonl").stat().st_mtime_ns for n in names[:2]}
    kept = rows(out / f"{n2}.jsonl")[:7]  # clip-s's 5 rows and 2 of pac-s's
    for r in kept:
        r["score"] = 0.123456  # a value no scoring gives: proves these rows are kept, not scored again
    parts = out / "_shards" / "parts" / n2
    parts.mkdir(parents=True)
    write_jsonl(parts / "journal.jsonl", kept)
    st = os.stat(paths[2])
    (parts / "input.json").write_text(json.dumps({"path": os.path.abspath(paths[2]), "size": st.st_size,
                                                  "mtime_ns": st.st_mtime_ns}))
    (out / f"{n2}.jsonl").unlink()
    (out / "_shards" / f"{n2}.json").unlink()
    assert score(tmp_path, *src, "--out-format", "jsonl", "--out", out, "--resume") == 0
    assert {n: (out / f"{n}.jsonl").stat().st_mtime_ns for n in names[:2]} == done
    got = rows(out / f"{n2}.jsonl")
    want = [r for r in one if shard_of(r).endswith(paths[2].name)]
    assert [r["id"] for r in got] == [r["id"] for r in want] and [r["score"] for r in got[:7]] == [0.123456] * 7
    np.testing.assert_allclose([r["score"] for r in got[7:]], [r["score"] for r in want[7:]], atol=1e-6)
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["shards_resumed"] == 2 and not parts.exists()
    assert [r["count"] for r in summary["runs"]] == [15, 15]


def test_a_folder_output_needs_sharded_input_and_a_file_needs_a_file_suffix(tmp_path, data, capsys):
    from test_cli_score import one_line_error

    paths, _, _ = data
    assert score(tmp_path, "--images", paths[0].parent, "--captions", tmp_path / "sysA.json",
                 "--out", f"{tmp_path / 'dir'}/") == 2
    one_line_error(capsys, "--out", "needs sharded input")


def test_summary_merges_states_to_the_one_pass_numbers_and_carries_a_metric_aggregate():
    """Means from an exact sum: any grouping of rows into merged states gives math.fsum's mean to the last
    bit; a metric's own aggregate (here: the largest score) is kept beside the mean, per system too."""
    from dataclasses import replace

    from capscore.pipeline import Summary, format_summary
    from capscore.scores.metric import get_metric

    rng = np.random.default_rng(0)
    scores = [float(x) for x in rng.random(1000) * 10.0 ** rng.integers(-8, 8, 1000)]
    rows_ = [{"score": s, "system": "ab"[i % 2]} for i, s in enumerate(scores)] + [{"score": None, "system": "a"}]
    whole = Summary("clip-s")
    for r in rows_:
        whole.add(r)
    parts = [Summary("clip-s") for _ in range(7)]
    for i, r in enumerate(rows_):
        parts[(i * 31) % 7].add(r)
    merged = Summary("clip-s")
    for p in reversed(parts):
        merged.merge(json.loads(json.dumps(p.state())))
    want = math.fsum(scores) / len(scores)
    assert whole.mean == merged.mean == want
    assert merged.as_dict()["systems"] == {"a": math.fsum(scores[0::2]) / 500, "b": math.fsum(scores[1::2]) / 500}
    assert (merged.count, merged.skipped) == (1000, 1)

    class Largest:
        name = "max"

        def __init__(self):
            self.best = None

        def add(self, row):
            self.best = row["score"] if self.best is None else max(self.best, row["score"])

        def state(self):
            return {"best": self.best}

        def merge(self, state):
            if state["best"] is not None:
                self.add({"score": state["best"]})

        def value(self):
            return self.best

    metric = replace(get_metric("clip-s"), aggregate=Largest)
    a, b = Summary(metric, model="m"), Summary(metric, model="m")
    for i, r in enumerate(rows_):
        (a if i < 400 else b).add(r)
    a.merge(b.state())
    d = a.as_dict()
    assert d["aggregate"] == {"name": "max", "value": max(scores),
                              "systems": {"a": max(scores[0::2]), "b": max(scores[1::2])}}
    from capscore.pipeline import FileOutput

    text = format_summary({"runs": [d]}, FileOutput(Path("o.jsonl")))
    assert f"headline max {max(scores):.4f}, mean per-caption score {want:.4f}" in text


def test_sharded_rows_name_their_system_after_the_source(tmp_path):
    from capscore.data.shards import SourceOptions
    from capscore.data.sources import ShardedSource

    write_webdataset(tmp_path / "web", samples(2, 2))
    pattern = str(tmp_path / "web" / "{00000..00001}.tar")
    for spec, want in ((str(tmp_path / "web"), "web"), (pattern, "web"), (str(tmp_path / "web" / "00001.tar"), "00001")):
        src = ShardedSource.list("webdataset", spec, SourceOptions())
        assert {x.system for x in src.items()} == {want}
