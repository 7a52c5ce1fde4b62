"""`capscore report` reads every output kind the other commands write, by columns, bounded and type-strict.

The outputs are made here by the commands themselves on tiny inputs (capscore-test-tiny, random weights;
scenes-tiny for probe/correlate/explain). Expected numbers are recomputed from the output files with
json/pandas/pyarrow and numpy — never with capscore's reader — and compared with the page's tables.
"""
import html
import json
import os
import re
import shutil
import signal
import struct
import zlib
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import capscore.backbones.openclip  # noqa: F401  (registers capscore-test-tiny with open_clip)
from capscore.cli import main

MODEL = "capscore-test-tiny"
PWNED = "<script>document.title='pwned'</script>"


# ====================================================================================== making outputs
def _score(root, *args) -> None:
    cache = [] if "--no-cache" in args else ["--cache-dir", str(root / "cache")]
    argv = ["-q", "score", *cache, *map(str, args)]
    assert main(argv) == 0, argv


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Images, captions of two systems (one with hostile text), references; the score outputs made from them."""
    root = tmp_path_factory.mktemp("outputs")
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    for i in range(4):
        Image.fromarray((rng.random((40, 40, 3)) * 255).astype("uint8")).save(root / "images" / f"img{i}.png")
    words = ["red", "green", "blue", "noisy"]
    caps = [{"image": f"img{i}", "caption": f"a {w} square", "system": "plain"} for i, w in enumerate(words)]
    caps += [{"image": f"img{i}", "caption": f"{PWNED} a {w} circle" if i == 0 else f"a {w} circle",
              "system": "bad<b>"} for i, w in enumerate(words)]
    (root / "caps.jsonl").write_text("".join(json.dumps(c) + "\n" for c in caps))
    (root / "refs.json").write_text(json.dumps({f"img{i}": [f"a {w} thing", "a pattern"] for i, w in enumerate(words)}))
    common = ["--images", root / "images", "--captions", root / "caps.jsonl"]
    # several models x several metrics in one file
    _score(root, *common, "--model", MODEL, "scenes-tiny", "--metric", "clip-s", "pac-s",
           "--out", root / "multi" / "scores.jsonl")
    # RefCLIP-S (image_score / ref_score columns) in every row format
    for ext in ("jsonl", "csv", "parquet", "json"):
        _score(root, *common, "--model", MODEL, "--refs", root / "refs.json", "--metric", "refclip-s",
               "--out", root / f"ref_{ext}" / f"scores.{ext}")
    _score(root, *common, "--model", MODEL, "--metric", "abe", "--out", root / "abe" / "scores.jsonl")
    return root


def _page(tmp_path, *paths, extra=()) -> str:
    out = tmp_path / f"r{len(list(tmp_path.glob('r*.html')))}.html"
    assert main(["-q", "report", *map(str, paths), *extra, "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def _section(page: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert m, f"section {sid} missing"
    return m.group(1)


def _cells(fragment: str) -> list[list[str]]:
    return [[html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", fragment, re.S)]


def _blocks(page: str) -> dict[str, tuple[list[str], list[list[str]], str]]:
    """(model, metric) heading -> (header, rows of its first table = per-system statistics, fragment)."""
    body = _section(page, "scores")
    out = {}
    for m in re.finditer(r"<h4>(.*?)</h4>(.*?)(?=<h4>|<h3>|$)", body, re.S):
        title = html.unescape(m.group(1)).split(" — ")[0]
        first = re.search(r"<table.*?</table>", m.group(2), re.S).group(0)
        head = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", first)]
        out[title] = (head, _cells(first), m.group(2))
    return out


def _read_independently(path) -> pd.DataFrame:
    s = str(path)
    if s.endswith(".parquet"):
        return pq.read_table(s).to_pandas()
    if s.endswith(".csv"):
        return pd.read_csv(s, keep_default_na=False, na_values={"score": [""], "image_score": [""], "ref_score": [""]})
    if s.endswith(".json"):
        return pd.DataFrame(json.loads(open(s).read()))
    return pd.DataFrame([json.loads(x) for x in open(s) if x.strip()])


def _check_stats(table_rows, head, frame: pd.DataFrame, parts=()):
    """The page's per-system rows against numpy on the rows file (grouped here, not by capscore)."""
    got = {r[0]: r for r in table_rows if r}
    frame = frame[frame["score"].notna()]
    frame = frame.assign(system=frame["system"].fillna("").replace("", "(none)"))  # the page's name for no system
    assert set(got) == set(frame["system"]), (set(got), set(frame["system"]))
    for system, g in frame.groupby("system"):
        x = g["score"].to_numpy(float)
        row = got[system]
        assert int(row[1]) == len(x)
        assert [float(v) for v in row[2:7]] == pytest.approx([x.mean(), np.median(x), x.std(), x.min(), x.max()],
                                                             abs=6e-5)
        for c in parts:
            assert float(row[head.index(c[1])]) == pytest.approx(g[c[0]].mean(), abs=6e-5)


# ====================================================================================== one test per kind
def test_several_models_and_metrics_in_one_file_give_one_distribution_each(made, tmp_path):
    rows = _read_independently(made / "multi" / "scores.jsonl")
    pairs = sorted({(m, k) for m, k in zip(rows["model"], rows["metric"])})
    assert len(pairs) == 4  # 2 models x 2 metrics, as the command wrote them
    page = _page(tmp_path, made / "multi")
    blocks = _blocks(page)
    assert sorted(blocks) == sorted(f"{k} with {m}" for m, k in pairs)
    for m, k in pairs:
        head, table, frag = blocks[f"{k} with {m}"]
        _check_stats(table, head, rows[(rows["model"] == m) & (rows["metric"] == k)])
        assert re.search(r'<img class="plot" alt="score distribution per system: [^"]*" src="data:image/png;base64,'
                         r'[A-Za-z0-9+/=]{200,}">', frag)
    body = _section(page, "scores")
    assert "?" not in "".join(re.findall(r"<h[34]>(.*?)</h[34]>", body)) and "not recorded" not in body
    # hostile user text is escaped everywhere it appears
    assert html.escape(PWNED, quote=True) + " a red circle" in body and PWNED not in page
    assert "bad&lt;b&gt;" in body and "bad<b>" not in page
    # the same run given as its summary file, or as its rows file, reads the same
    for given in (made / "multi" / "scores.jsonl.summary.json", made / "multi" / "scores.jsonl"):
        again = _blocks(_page(tmp_path, given))
        assert {t: b[1] for t, b in again.items()} == {t: b[1] for t, b in blocks.items()}


@pytest.mark.parametrize("ext", ["jsonl", "csv", "parquet", "json"])
def test_refclip_s_rows_in_every_format_with_their_parts(made, tmp_path, ext):
    path = made / f"ref_{ext}" / f"scores.{ext}"
    frame = _read_independently(path)
    assert {"image_score", "ref_score"} <= set(frame.columns)
    blocks = _blocks(_page(tmp_path, made / f"ref_{ext}"))
    assert list(blocks) == [f"refclip-s with {MODEL}"]
    head, table, _ = blocks[f"refclip-s with {MODEL}"]
    _check_stats(table, head, frame, parts=[("image_score", "mean image part"), ("ref_score", "mean reference part")])
    # RefCLIP-S is the harmonic mean of its parts (RefCLIP-S paper eq. 2), so the rows are what they claim
    f = frame[frame["score"].notna()]
    h = 2 * f["image_score"] * f["ref_score"] / (f["image_score"] + f["ref_score"])
    np.testing.assert_allclose(f["score"], h, atol=1e-6)


def test_abe_rows(made, tmp_path):
    frame = _read_independently(made / "abe" / "scores.jsonl")
    assert set(frame["metric"]) == {"abe"}
    blocks = _blocks(_page(tmp_path, made / "abe" / "scores.jsonl.summary.json"))
    head, table, _ = blocks[f"abe with {MODEL}"]
    _check_stats(table, head, frame)


def _write_mp4(path, frames, fps=8):
    import av

    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264rgb", rate=Fraction(fps))
        s.width, s.height, s.pix_fmt, s.options = frames[0].shape[1], frames[0].shape[0], "rgb24", {"crf": "0"}
        for a in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def test_video_rows_carry_model_and_metric_and_the_report_reads_them(tmp_path):
    pytest.importorskip("av")
    rng = np.random.default_rng(1)
    (tmp_path / "videos").mkdir()
    for name in ("cat", "dog"):
        _write_mp4(tmp_path / "videos" / f"{name}.mp4", [(rng.random((32, 32, 3)) * 255).astype("uint8")
                                                         for _ in range(4)])
    caps = [{"image": "cat", "caption": "a cat jumps", "refs": ["a cat leaps"], "system": "s1"},
            {"image": "dog", "caption": "a dog runs", "refs": ["a dog is running"], "system": "s1"},
            {"image": "dog", "caption": "a cat jumps", "refs": ["a dog is running"], "system": "s2"}]
    (tmp_path / "caps.jsonl").write_text("".join(json.dumps(c) + "\n" for c in caps))
    out = tmp_path / "vid" / "v.csv"
    _score(tmp_path, "--model", MODEL, "--videos", tmp_path / "videos", "--captions", tmp_path / "caps.jsonl",
           "--metric", "refpac-s", "--frames", "all", "--out", out)
    frame = _read_independently(out)
    assert set(frame["model"]) == {MODEL} and set(frame["metric"]) == {"refpac-s"}  # as image rows do
    page = _page(tmp_path, tmp_path / "vid")
    head, table, _ = _blocks(page)[f"refpac-s with {MODEL}"]
    _check_stats(table, head, frame, parts=[("coarse", "mean coarse"), ("ref_coarse", "mean ref coarse")])
    assert "videos; 3 rows; status complete" in html.unescape(_section(page, "scores"))


@pytest.mark.parametrize("engine", ["local", pytest.param("ray", marks=pytest.mark.slow)])  # ray: a local cluster
def test_shard_folder_and_a_folder_of_rows_without_summary(tmp_path, engine):
    """A folder of per-shard files, as both engines write it (the same layout; the Ray run in the slow tier)."""
    from shard_inputs import samples, write_webdataset

    paths = write_webdataset(tmp_path / "shards", samples(2, 3))
    out = tmp_path / "folder"
    args = ("--model", MODEL, "--webdataset", str(tmp_path / "shards" / "{00000..00001}.tar"), "--no-cache",
            "--out", f"{out}/")
    if engine == "local":
        _score(tmp_path, *args)
    else:
        ray = pytest.importorskip("ray")
        ray.init(num_cpus=2, object_store_memory=160 * 1024**2, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
        try:
            from ray.data import DataContext

            DataContext.get_current().enable_progress_bars = False
            _score(tmp_path, *args, "--engine", "ray", "--workers", "2")
        finally:
            ray.shutdown()
    assert len(paths) == 2 and (out / "_summary.json").exists()
    frame = pd.concat([pq.read_table(p).to_pandas() for p in sorted(out.glob("*.parquet"))])
    assert len(frame) == 6
    page = _page(tmp_path, out)
    blocks = _blocks(page)
    assert list(blocks) == [f"clip-s with {MODEL}"]  # the rows' model/metric may be null: _summary.json names them
    head, table, _ = blocks[f"clip-s with {MODEL}"]
    _check_stats(table, head, frame)
    assert "folder/ (2 row files)" in html.unescape(_section(page, "scores"))
    # without any summary each shard file is read on its own, and what is not recorded is said, never "?"
    bare = tmp_path / "bare"
    bare.mkdir()
    for p in out.glob("*.parquet"):
        shutil.copy(p, bare / p.name)
    body = _section(_page(tmp_path, bare), "scores")
    assert body.count("<h3>") == 2 and "?" not in "".join(re.findall(r"<h[34]>(.*?)</h[34]>", body))
    carried = frame["model"].notna().all() and frame["metric"].notna().all()
    expect = f"clip-s with {MODEL}" if carried else "metric not recorded with model not recorded"
    assert body.count(f"<h4>{expect} — 3 scored</h4>") == 2


@pytest.fixture(scope="module")
def others(tmp_path_factory):
    """probe, correlate, train and explain outputs made by the commands."""
    root = tmp_path_factory.mktemp("others")
    from capscore.scenes import generate_scenes

    scene = generate_scenes(1, seed=0)[0]
    scene.render().save(root / "scene.png")
    q = ["-q"]
    assert main(q + ["probe", "--model", "scenes-tiny", "--suite", "scenes-lgip", "--n-scenes", "3",
                     "--out", str(root / "probes")]) == 0
    assert main(q + ["correlate", "--dataset", "scenes-oracle", "--scenes", "3", "--model", "scenes-tiny",
                     "--metric", "clip-s", "--bootstrap", "10", "--no-cache", "--out", str(root / "corr")]) == 0
    assert main(q + ["train", "contrastive", "--model", MODEL, "--data", "scenes:8", "--steps", "2", "--batch-size",
                     "4", "--eval-every", "1", "--eval-scenes", "4", "--out", str(root / "train")]) == 0
    assert main(q + ["explain", "--model", "scenes-tiny", "--image", str(root / "scene.png"), "--caption",
                     "a red triangle", "--word", "triangle", "--out", str(root / "explain" / "heat.png")]) == 0
    return root


def test_probe_output_as_folder_summary_or_rows_file(others, tmp_path):
    tables = [[r for r in _cells(_section(_page(tmp_path, p), "lgip")) if r]
              for p in (others / "probes", others / "probes" / "scenes-lgip.summary.json",
                        others / "probes" / "scenes-lgip__scenes-tiny.jsonl")]
    assert tables[0] and tables[0] == tables[1] == tables[2]
    entry = json.loads((others / "probes" / "scenes-lgip.summary.json").read_text())[0]
    allrow = next(s for s in entry["summary"] if s["flip_type"] == "all")
    assert float(tables[0][0][2]) == pytest.approx(allrow["invariance_error"], abs=6e-5)


def test_correlate_output_as_folder_json_or_items(others, tmp_path):
    res = json.loads((others / "corr" / "correlate.json").read_text())["results"]
    tau = next(s for s in res[0]["stats"] if s["name"] == "tau_b")
    for given in (others / "corr", others / "corr" / "correlate.json", others / "corr" / "correlate_items.jsonl"):
        body = _section(_page(tmp_path, given), "correlation")
        assert f"{tau['value']:.1f} [{tau['ci_low']:.1f}, {tau['ci_high']:.1f}]" in html.unescape(body)
        assert "metric score against human score" in body  # the scatter from correlate_items.jsonl


def test_train_output_as_folder_log_or_card(others, tmp_path):
    log = [json.loads(x) for x in (others / "train" / "log.jsonl").read_text().splitlines()]
    evals = [e for e in log if "eval" in e]
    for given in (others / "train", others / "train" / "log.jsonl", others / "train" / "card.json"):
        body = _section(_page(tmp_path, given), "training")
        row = next(r for r in _cells(body) if r and r[0] == "oracle_tau")
        assert [float(v) for v in row[1:]] == pytest.approx([evals[0]["eval"]["oracle_tau"],
                                                             evals[-1]["eval"]["oracle_tau"]], abs=6e-5)
        assert "contrastive" in body  # card.json names the recipe


def test_explain_output_as_folder_or_png(others, tmp_path):
    for given in (others / "explain", others / "explain" / "heat.png"):
        body = _section(_page(tmp_path, given), "explain")
        assert "triangle" in body and body.count("<figure>") == 1


# ====================================================================================== hostile inputs
def _one_line(capsys, *needles):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("capscore: error: ") and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _report_rc(tmp_path, *paths, extra=()):
    return main(["report", *map(str, paths), *extra, "--out", str(tmp_path / "x.html")])


@pytest.mark.parametrize("bad,kind", [(True, "a boolean"), ("0.5", "a string")])
def test_json_booleans_and_strings_are_not_scores(made, tmp_path, capsys, bad, kind):
    rows = [json.loads(x) for x in open(made / "multi" / "scores.jsonl")]
    rows[1]["score"] = bad
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _report_rc(tmp_path, tmp_path / "j") == 2
    _one_line(capsys, f"{tmp_path / 'j' / 's.jsonl'}:2", f"score is {kind}, not a number")
    (tmp_path / "c").mkdir()  # COCO results
    (tmp_path / "c" / "s.json").write_text(json.dumps([{"image_id": r["id"], **r} for r in rows]))
    assert _report_rc(tmp_path, tmp_path / "c" / "s.json") == 2
    _one_line(capsys, "s.json:row 2", f"score is {kind}")
    (tmp_path / "p").mkdir()  # Parquet with a boolean / string score column
    table = pa.table({c: [r[c] for r in rows] for c in rows[0] if c != "score"}
                     | {"score": pa.array([bad] * len(rows))})
    pq.write_table(table, tmp_path / "p" / "s.parquet")
    assert _report_rc(tmp_path, tmp_path / "p") == 2
    _one_line(capsys, "s.parquet:row 1", f"score is {kind}")


def test_csv_cells_must_parse_as_numbers(made, tmp_path, capsys):
    lines = (made / "ref_csv" / "scores.csv").read_text().splitlines()
    head = lines[0].split(",")
    cells = lines[2].split(",")
    cells[head.index("score")] = "true"
    lines[2] = ",".join(cells)
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    assert _report_rc(tmp_path, tmp_path / "s.csv") == 2
    _one_line(capsys, f"{tmp_path / 's.csv'}:3", "score is not a number", "'true'")


def _alarm(seconds):
    def boom(*_):
        raise TimeoutError("capscore report hung")
    signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)


def test_rows_that_are_a_device_a_fifo_or_endless_are_refused_in_one_line(made, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(made / "multi" / "scores.jsonl.summary.json", run / "scores.jsonl.summary.json")
    _alarm(60)
    try:
        os.symlink("/dev/zero", run / "scores.jsonl")  # the rows beside a real summary
        assert _report_rc(tmp_path, run) == 2
        _one_line(capsys, str(run / "scores.jsonl"), "a device")
        assert _report_rc(tmp_path, run / "scores.jsonl") == 2  # named directly
        _one_line(capsys, "scores.jsonl", "a device")
        os.unlink(run / "scores.jsonl")
        os.mkfifo(run / "scores.jsonl")  # nobody writes to it: opening it would hang
        assert _report_rc(tmp_path, run) == 2
        _one_line(capsys, "scores.jsonl", "named pipe")
        assert _report_rc(tmp_path, run / "scores.jsonl") == 2
        _one_line(capsys, "named pipe")
    finally:
        signal.alarm(0)
    os.unlink(run / "scores.jsonl")
    with open(run / "scores.jsonl", "wb") as f:  # one line of 17 MiB with no newline
        f.write(b'{"id": "' + b"x" * (17 * 2**20))
    assert _report_rc(tmp_path, run) == 2
    _one_line(capsys, f"{run / 'scores.jsonl'}:1", "line longer than 16,777,216 bytes")


def test_row_budget_is_a_one_line_refusal(made, tmp_path, capsys):
    assert _report_rc(tmp_path, made / "multi", extra=["--max-rows", "5"]) == 2
    _one_line(capsys, "more than 5 score rows", "--max-rows")


def _png_with_size(path, width, height, text: dict):
    """A valid PNG signature + IHDR declaring width x height, text chunks, a tiny IDAT (no pixels to back it)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = b"".join(chunk(b"tEXt", k.encode() + b"\0" + v.encode()) for k, v in text.items())
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + body + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))


@pytest.mark.parametrize("w,h,what", [(20000, 20000, "decompression bomb"), (10000, 5000, "pixel limit")])
def test_huge_explain_pngs_are_input_errors(tmp_path, capsys, w, h, what):
    (tmp_path / "ex").mkdir()
    _png_with_size(tmp_path / "ex" / "heat.png", w, h, {"capscore-explain": json.dumps({"word": "x"})})
    assert _report_rc(tmp_path, tmp_path / "ex") == 2
    _one_line(capsys, "heat.png", what)
    assert _report_rc(tmp_path, tmp_path / "ex" / "heat.png") == 2
    _one_line(capsys, "heat.png", what)
    # a big picture that is not an explain map, in a folder of runs, is not even decoded
    (tmp_path / "ex" / "heat.png").unlink()
    _png_with_size(tmp_path / "ex" / "photo.png", w, h, {"Software": "camera"})
    (tmp_path / "ex" / "log.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    assert _report_rc(tmp_path, tmp_path / "ex") == 0


@pytest.mark.parametrize("field,value,msg", [("value", "0.42", "must be a number, not a str"),
                                             ("value", True, "must be a number, not a bool"),
                                             ("ci_low", [1], "must be a number, not a list")])
def test_correlate_json_statistics_must_be_numbers(others, tmp_path, capsys, field, value, msg):
    data = json.loads((others / "corr" / "correlate.json").read_text())
    data["results"][0]["stats"][1][field] = value
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "correlate.json").write_text(json.dumps(data))
    assert _report_rc(tmp_path, tmp_path / "c") == 2
    _one_line(capsys, "correlate.json: results[0].stats[1]." + field, msg)


def test_train_log_booleans_and_odd_steps_are_input_errors(tmp_path, capsys):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "log.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": true}\n')
    assert _report_rc(tmp_path, tmp_path / "t") == 2
    _one_line(capsys, "log.jsonl:2", "loss is a boolean")
    (tmp_path / "t" / "log.jsonl").write_text('{"step": "2", "loss": 1.0}\n')
    assert _report_rc(tmp_path, tmp_path / "t") == 2
    _one_line(capsys, "log.jsonl:1", "not a `capscore train` log line")


# ====================================================================================== the page in a browser
def test_page_of_every_score_kind_in_headless_chromium(made, tmp_path):
    from test_report import _browse, _chromium

    chrome = _chromium()
    if chrome is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    out = tmp_path / "all.html"
    dirs = [made / d for d in ("multi", "ref_jsonl", "ref_csv", "ref_parquet", "ref_json", "abe")]
    assert main(["-q", "report", *map(str, dirs), "--out", str(out), "--title", f"all {PWNED}"]) == 0
    page = out.read_text()
    assert _section(page, "scores").count("<h4>") == 4 + 4 + 1  # one per (model, metric) of each run
    shot = tmp_path / "shot.png"
    p = _browse(chrome, tmp_path, out, "--dump-dom", f"--screenshot={shot}", "--window-size=1280,2000",
                "--hide-scrollbars")
    assert p.returncode == 0, p.stderr[-2000:]
    assert not [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
    assert html.unescape(re.search(r"<title>(.*?)</title>", p.stdout, re.S).group(1)) == f"all {PWNED}"
    assert p.stdout.count("data:image/png;base64,") == 9  # one plot per (model, metric)
    im = np.asarray(Image.open(shot).convert("RGB"))
    assert im.shape[:2] == (2000, 1280) and im.std() > 20
